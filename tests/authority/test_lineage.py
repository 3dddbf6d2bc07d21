"""Lineage paths: parsing, rejection, parent by truncation, ancestry by prefix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from charter.core import MAX_LINEAGE_DEPTH, Lineage, LineageError
from charter.core.lineage import MAX_LINEAGE_CHARS


def test_parses_and_derives_the_tree_from_the_path() -> None:
    lin = Lineage("agent:root/sa-1/sa-7f")
    assert lin.segments == ("root", "sa-1", "sa-7f")
    assert lin.root_name == "root"
    assert lin.depth == 2
    assert lin.parent == Lineage("agent:root/sa-1")
    assert lin.parent is not None
    assert lin.parent.parent == Lineage("agent:root")
    assert Lineage("agent:root").parent is None
    assert lin.ancestors() == ("agent:root/sa-1", "agent:root")
    assert Lineage("agent:root").is_root
    assert not lin.is_root


def test_ancestry_is_by_segment_prefix_not_string_prefix() -> None:
    one, ten = Lineage("agent:root/sa-1"), Lineage("agent:root/sa-10")
    assert not one.is_ancestor_of(ten)  # "sa-1" is a string prefix of "sa-10"
    assert one.is_ancestor_of(Lineage("agent:root/sa-1/sa-2"))
    assert Lineage("agent:root").is_ancestor_of(ten)
    assert not ten.is_ancestor_of(ten)
    assert ten.is_within(ten)
    assert not Lineage("agent:roo").is_ancestor_of(Lineage("agent:root/sa-1"))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("agent:", "root name"),
        ("root/sa-1", "must start with 'agent:'"),
        ("AGENT:root", "must start with 'agent:'"),
        ("agent:Root", "root name"),
        ("agent:1root", "root name"),
        ("agent:root/", "path traversal"),
        ("agent:root//sa-1", "path traversal"),
        ("agent:root/../sa-1", "path traversal"),
        ("agent:root/sa-1/..", "path traversal"),
        ("agent:root/./sa-1", "path traversal"),
        ("agent:../etc", "root name"),
        ("agent:root/sa-1\n", "segment"),
        ("agent:root/sa-1\x00", "segment"),
        ("agent:root/sa-%2e%2e", "segment"),
        ("agent:root/sa-1\\..", "segment"),
        ("agent:root/sa-١", "segment"),  # an Arabic-Indic digit
        ("agent:root/sa-A", "segment"),
        ("agent:root/sa-", "segment"),
        ("agent:root/worker", "segment"),
        ("agent:root /sa-1", "root name"),
        ("agent:" + "r" * 64, "root name"),
        ("agent:root/sa-" + "1" * 33, "segment"),
        ("agent:root" + "/sa-1" * (MAX_LINEAGE_DEPTH + 1), "levels deep"),
        ("agent:root" + "/sa-" + "1" * 32 + "x" * MAX_LINEAGE_CHARS, "characters long"),
    ],
)
def test_rejects_malformed_paths_with_a_clear_error(text: str, fragment: str) -> None:
    with pytest.raises(LineageError, match=None) as info:
        Lineage(text)
    assert fragment in str(info.value)


def test_rejects_non_text() -> None:
    with pytest.raises(LineageError):
        Lineage(b"agent:root")


def test_validates_inside_models() -> None:
    class M(BaseModel):
        lineage: Lineage

    assert isinstance(M(lineage="agent:root/sa-1").lineage, Lineage)
    with pytest.raises(ValidationError, match="path traversal"):
        M(lineage="agent:root/../x")
    assert M(lineage="agent:root").model_dump(mode="json") == {"lineage": "agent:root"}


segment = st.from_regex(r"sa-[0-9a-z]{1,8}", fullmatch=True)
root_name = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)


@settings(max_examples=1500, deadline=None)
@given(root_name, st.lists(segment, max_size=MAX_LINEAGE_DEPTH))
def test_any_valid_path_round_trips_and_truncates_to_its_parent(
    root: str, segments: list[str]
) -> None:
    text = "/".join([f"agent:{root}", *segments])
    lin = Lineage(text)
    assert lin == text
    assert lin.depth == len(segments)
    if segments:
        assert lin.parent == text.rsplit("/", 1)[0]
        assert lin.parent is not None
        assert lin.parent.is_ancestor_of(lin)
    assert len(lin.ancestors()) == len(segments)
    assert all(a.is_ancestor_of(lin) for a in lin.ancestors())
    assert lin.root_lineage == Lineage.root(root)


@settings(max_examples=1500, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_is_either_a_valid_lineage_or_a_lineage_error(text: str) -> None:
    try:
        lin = Lineage(text)
    except LineageError:
        return
    # Accepted text is plain ASCII with no traversal and parses back to itself.
    assert text.isascii()
    assert ".." not in text
    assert "//" not in text
    assert "/".join(["agent:" + lin.segments[0], *lin.segments[1:]]) == text
