"""Every decision record says where it stands: a ``Status:`` line under its title, and
a decision that supersedes or is superseded names the other one by a link that
resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs import ROOT

DECISIONS = sorted((ROOT / "docs" / "decisions").glob("[0-9][0-9][0-9][0-9]-*.md"))
_STATUS = re.compile(
    r"^Status: (Proposed|Accepted|Superseded|Rejected)\b(.*?)(?:\n\n|\Z)", re.M | re.S
)


def _status(path: Path) -> tuple[str, str]:
    text = path.read_text()
    head = text.split("\n## ", 1)[0]  # the status belongs above the first section
    found = _STATUS.search(head)
    assert found, f"{path.name}: no 'Status: Accepted|Superseded|…' line under the title"
    return found.group(1), " ".join(found.group(2).split())


def test_the_decisions_are_found() -> None:  # control
    assert len(DECISIONS) >= 9
    numbers = [p.name[:4] for p in DECISIONS]
    assert numbers == sorted(set(numbers))  # one record a number


@pytest.mark.parametrize("path", DECISIONS, ids=[p.name[:4] for p in DECISIONS])
def test_every_decision_has_a_status(path: Path) -> None:
    state, rest = _status(path)
    if "superseded" in rest.lower() or state == "Superseded":
        links = re.findall(r"\]\((\d{4}-[^)]+\.md)\)", rest)
        assert links, f"{path.name}: says superseded without naming the decision"
        for link in links:
            assert (path.parent / link).exists(), link


def test_a_superseding_decision_is_named_back() -> None:
    """If A says it supersedes B, B's status names A (and the other way round)."""
    checked = 0
    for path in DECISIONS:
        _, rest = _status(path)
        if "Supersedes" not in rest:
            continue
        for link in re.findall(r"\]\((\d{4}-[^)]+\.md)\)", rest.split("Supersedes", 1)[1]):
            _, theirs = _status(path.parent / link)
            assert path.name in theirs, (link, "does not name", path.name)
            checked += 1
    assert checked >= 3  # control: 0010 supersedes parts of 0001, 0004 and 0006
