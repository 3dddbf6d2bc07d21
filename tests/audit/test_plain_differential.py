"""``_Verifier.plain`` (export verify's fast path for a whole bundle's entry lines) against
the general path (``_read_line``, ``_entry`` and ``_Verifier.entry``), line by line, on a
real journal's bundle (SQLite and PostgreSQL) with one entry line mutated: its fields
changed, of other types, missing or extra (a ``state`` among them), numbers written as
1.0 or 1e0, hex in upper case, topics of the types the keys and the grants read, keys
reordered, whitespace and escapes, its state other bytes (a newline among them), given
in base64 (``state_base64``) or embedded, the line's end changed, re-chained or not.
Whatever ``plain`` accepts the general path accepts, leaving the same state (the tree's
leaves and root, the counts, the link); whatever it does not, it left untouched, and the
general path then decides as it does alone; whatever the general path rejects, ``plain``
never accepted."""

from __future__ import annotations

import base64
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import charter.catalogue  # noqa: F401  (the audit decodes every type)
from charter.audit.bundle import _entry, _read_line, _Verifier
from charter.audit.export import export_bundle
from charter.audit.note import NoteKey
from charter.core import KeyStore
from charter.core.framing import entry_hash
from charter.ledger import Journal
from tests.audit._support import real_history

_FIELDS = (
    "chain_hash",
    "context",
    "kind",
    "leaf",
    "originator",
    "position",
    "prev_hash",
    "topic",
    "version",
)
_INTS = ("leaf", "position", "version")
_HEX = ("chain_hash", "originator", "prev_hash")
_TOPICS = (
    "GrantMinted",
    "GrantMinted/x",
    "AgentRegistered/a",
    "JournalKeyRotated",
    "JournalKeyRotated/k",
    "WorkerResult/é",
    "WorkerResult/\u2028\U0001f600",
    "",
    "/",
)
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64 + 1),
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 0.0, 1.0, 1e300, -0.0]),
    st.text(max_size=8),
    st.sampled_from(["", "0" * 64, "A" * 64, "é" * 64, "=", "AA==", "AA=", "AAAA\n"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)

_BOUNDS = [-(2**63) - 1, -(2**63), -1, 0, 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64]

# One mutation of an entry line's object and state: (what, field, value).
_MUTATION = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(_FIELDS), _VALUES),
    st.tuples(st.just("drop"), st.sampled_from(_FIELDS), st.none()),
    st.tuples(st.just("extra"), st.text(max_size=6), _VALUES),
    st.tuples(st.just("extra"), st.sampled_from(["state", "state_base64"]), _VALUES),
    st.tuples(st.just("topic"), st.just("topic"), st.sampled_from(_TOPICS) | st.text()),
    st.tuples(st.just("upper"), st.sampled_from(_HEX), st.none()),
    st.tuples(st.just("shift"), st.sampled_from(_INTS), st.integers(-2, 2)),
    st.tuples(st.just("originator"), st.just("originator"), st.binary(max_size=40)),
    st.tuples(st.just("state"), st.just("state"), st.binary(max_size=40)),
    st.tuples(
        st.just("state"),
        st.just("state"),
        st.sampled_from([b"", b"\n", b"}", b'{"at":1}\n', b',"state":', b"\xff"]),
    ),
    st.tuples(st.just("spell"), st.just("state"), st.sampled_from(["space", "escape", "brace"])),
    st.tuples(st.just("b64"), st.just("state"), st.sampled_from(["pad", "nl", "url", "ws"])),
    st.tuples(st.just("set"), st.sampled_from(_INTS), st.sampled_from(_BOUNDS)),
    st.tuples(st.just("set"), st.just("context"), st.sampled_from([True, None, 0, 1, "false"])),
    st.tuples(st.just("set"), st.just("originator"), st.sampled_from(["AB", "aB", "a", "0g"])),
    st.tuples(st.just("long"), st.just("originator"), st.integers(2**15, 2**16 + 1)),
)


class _Line:
    """An entry line being mutated: the object of its other fields, its state's bytes,
    and how the line gives them (``form``: embedded or base64; ``tail``: the line's end;
    ``b64``: a respelling of the base64)."""

    def __init__(self, obj: dict[str, Any], state: bytes) -> None:
        self.obj, self.state = obj, state
        self.form, self.tail, self.b64 = "raw", "}", ""


def _mutate(line: _Line, what: str, field: str, value: Any) -> None:
    obj = line.obj
    if what == "long":
        obj[field] = "ab" * value  # near the bound on an originator's bytes
    elif what in ("set", "extra", "topic"):
        obj[field] = value
    elif what == "drop":
        obj.pop(field, None)
    elif what == "upper" and isinstance(obj.get(field), str):
        obj[field] = obj[field].upper()
    elif what == "shift" and type(obj.get(field)) is int:
        obj[field] += value
    elif what == "originator":
        obj[field] = value.hex()
    elif what == "state":
        line.state = value
    elif what == "spell":  # the same JSON value, other bytes
        line.state = {
            "space": line.state.replace(b'":', b'": ', 1),
            "escape": line.state.replace(b"a", b"\\u0061", 1),
            "brace": line.state + b" ",
        }[value]
    elif what == "b64":
        line.form, line.b64 = "base64", value


def _rechain(line: _Line) -> None:
    """The chain hash of the mutated fields, where they make a frame (an attacker who
    re-hashes what it changed: only the tree and the link can then tell)."""
    obj = line.obj
    with contextlib.suppress(Exception):
        obj["chain_hash"] = entry_hash(
            bytes.fromhex(obj["prev_hash"]),
            obj["position"],
            bytes.fromhex(obj["originator"]),
            obj["version"],
            obj["topic"].encode(),
            line.state,
        ).hex()


def _number(value: Any, style: str) -> str:
    """An integer written as JSON another way (1.0, 1e0, 1E+0) or as it is."""
    if type(value) is int and style != "int":
        return {"float": f"{value}.0", "exp": f"{value}e0", "EXP": f"{value}E+0"}[style]
    return json.dumps(value)


def _encode(line: _Line, order: list[int], spaced: bool, ascii_: bool, style: str) -> bytes:
    """The line: its object's keys in ``order``, with or without spaces and escapes, its
    integers written in ``style``; its state embedded before the closing brace (``tail``
    that brace, or what replaces it), or, in the base64 form (and for a state holding a
    newline, which would end the line), as a ``state_base64`` field."""
    obj = dict(line.obj)
    raw = line.form == "raw" and b"\n" not in line.state
    if not raw:
        text = base64.b64encode(line.state).decode()
        obj["state_base64"] = {
            "": text,
            "pad": text.rstrip("="),
            "nl": text[:4] + "\n" + text[4:],
            "url": text.replace("+", "-").replace("/", "_") + "-_",
            "ws": " " + text,
        }[line.b64]
    keys = list(obj)
    keys = [keys[i % len(keys)] for i in order if keys] + keys
    seen: list[str] = []
    for k in keys:
        if k not in seen:
            seen.append(k)
    colon, comma = (": ", ", ") if spaced else (":", ",")
    parts = []
    for k in seen:
        v = obj[k]
        text = _number(v, style) if type(v) is int else json.dumps(v, ensure_ascii=ascii_)
        parts.append(json.dumps(k, ensure_ascii=ascii_) + colon + text)
    head = ("{" + comma.join(parts)).encode()
    if not raw:
        return head + b"}\n"
    marker = (comma + '"state"' + colon).encode() if parts else b'"state":'
    return head + marker + line.state + line.tail.encode() + b"\n"


def _state(v: _Verifier) -> tuple[Any, ...]:
    """What a verifier holds after a line (its leaves not yet pushed included, as
    hashes: plain pushes them a block at a time)."""
    return (
        v.tree.size,
        tuple(v._pending),
        v.leaves(),
        dict(v.counts),
        v.linked,
        v.last_position,
        v.last_chain,
        v.gap_before,
        v.grants.checked,
    )


def _root(v: _Verifier) -> tuple[int, bytes | None]:
    v.flush()
    return v.tree.size, v.tree.root() if v.tree.size else None


def _general(v: _Verifier, line: bytes) -> str | None:
    """The general path on one line, as ``_check_lines`` takes it: None if it accepts
    the line as an entry, else what it raised (or that it is no entry)."""
    v.flush()
    try:
        obj, state = _read_line(line, v.tree.size, v.raw)
        if obj.get("kind") != "entry":
            return "not an entry line"
        v.entry(_entry(obj, state, v.tree.size), obj["prev_hash"])
    except Exception as e:  # compared between the two verifiers
        return f"{type(e).__name__}: {e}"
    return None


def _step(fast: _Verifier, general: _Verifier, line: bytes) -> tuple[bool, bool]:
    """One line through both verifiers, as ``_check_lines`` reads it (``fast``: plain,
    falling back to the general path; ``general``: the general path only): whether
    plain took it, and whether both go on."""
    before = _state(fast)
    accepted = fast.plain(line)
    refused = _general(general, line)
    if accepted:
        assert refused is None, (line, refused)  # plain took what the general path refuses
    else:
        assert _state(fast) == before, line  # plain changed nothing
        assert _general(fast, line) == refused, line
    assert _state(fast)[2:] == _state(general)[2:], line
    return accepted, refused is None


def _bundle(url: str, home: Path) -> tuple[NoteKey, list[bytes]]:
    vkey, _ = real_history(url, home)
    out = io.BytesIO()
    with Journal.open(url) as j:
        export_bundle(j, KeyStore(home).load("journal"), out)
    return NoteKey.parse(vkey), out.getvalue().splitlines(keepends=True)


def _parts(line: bytes) -> _Line:
    obj, state = _read_line(line, 0, True)
    assert isinstance(state, bytes)
    return _Line(obj, state)


def test_plain_accepts_only_what_the_general_path_accepts(journal_url: str, tmp_path: Path) -> None:
    key, lines = _bundle(journal_url, tmp_path / "home")
    header = orjson.loads(lines[0])
    entries = [line for line in lines[1:] if b',"state":' in line]
    assert len(entries) == len(lines) - 2 > 10  # every line but the header and the trailer
    topics = {_parts(line).obj["topic"].partition("/")[0] for line in entries}
    assert {"GrantMinted", "AgentRegistered"} <= topics  # the types plain leaves alone
    counted = {"plain": 0, "fallback": 0}

    def verifiers() -> tuple[_Verifier, _Verifier]:
        return _Verifier(header, key, ()), _Verifier(header, key, ())

    # The untouched bundle: plain takes every entry it may, the general path the rest.
    fast, general = verifiers()
    taken = [_step(fast, general, line) for line in entries]
    assert all(ok for _, ok in taken)
    special = ("GrantMinted", "AgentRegistered", "JournalKeyRotated")
    kinds = [_parts(line).obj["topic"].partition("/")[0] in special for line in entries]
    assert [p for p, _ in taken] == [not k for k in kinds]  # plain: all but those
    assert _root(fast) == _root(general) == (fast.size, fast.checkpoint.root)
    assert fast.auditor is not None
    assert general.auditor is not None
    assert fast.auditor.finish().findings == general.auditor.finish().findings == ()

    @settings(
        max_examples=1000,
        deadline=None,
        derandomize=True,  # the same examples each run: it fails or passes, never flakes
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        at=st.integers(0, len(entries)),
        mutations=st.lists(_MUTATION, min_size=0, max_size=3),
        bound=st.none() | st.tuples(st.sampled_from(_INTS), st.sampled_from(_BOUNDS)),
        rechain=st.booleans(),
        order=st.lists(st.integers(0, 20), max_size=12),
        spaced=st.booleans(),
        ascii_=st.booleans(),
        style=st.sampled_from(["int", "float", "int", "exp", "int", "EXP"]),
        form=st.sampled_from(["raw", "raw", "raw", "base64"]),
        tail=st.sampled_from(["}", "}", "}", "} ", "}}", "", "}\r"]),
    )
    def check(
        at: int,
        mutations: list[tuple[str, str, Any]],
        bound: tuple[str, int] | None,
        rechain: bool,
        order: list[int],
        spaced: bool,
        ascii_: bool,
        style: str,
        form: str,
        tail: str,
    ) -> None:
        fast, general = verifiers()
        for line in entries[:at]:
            assert _step(fast, general, line)[1]
        if at < len(entries):
            entry = _parts(entries[at])
        else:  # one more entry, after the checkpoint's last leaf, chained to it
            entry = _parts(entries[-1])
            entry.obj["prev_hash"] = entry.obj["chain_hash"]
            entry.obj["leaf"] += 1
            entry.obj["position"] += 1
            _rechain(entry)
        entry.form, entry.tail = form, tail
        for what, field, value in mutations:
            _mutate(entry, what, field, value)
        if bound is not None:  # an integer at or past its range's ends
            entry.obj[bound[0]] = bound[1]
        if rechain:
            _rechain(entry)
        line = _encode(entry, order, spaced, ascii_, style)
        took, ok = _step(fast, general, line)
        if ok:
            counted["plain" if took else "fallback"] += 1
            for rest in entries[at + 1 :]:  # the lines after it, linked or not
                if not _step(fast, general, rest)[1]:
                    break
            else:
                assert fast.auditor is not None
                assert general.auditor is not None
                assert fast.auditor.finish().findings == general.auditor.finish().findings
        assert _root(fast) == _root(general)

    check()
    assert counted["plain"] > 0  # mutated lines did reach plain's acceptance
    assert counted["fallback"] > 0  # and the general path's, past plain
