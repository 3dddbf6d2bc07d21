"""The semantic audit's calm path (a usage of a calm ledger charged by ``apply_rows``
without its chain's walk, :meth:`charter.audit._books.Books.calm`) against its general
path (``_Auditor.usage``: every ledger of the chain checked live, settled and checked
within bounds), on random journals of the entries the calm path meets: root ledgers
(opened once or again), leases for children and grandchildren (some already expired,
some leased again), usages of random amounts (some going over, some malformed, some of
lineages without a ledger), releases, renewals (earlier or later, of the right parent
or not), revocations, entries of unknown types or undecodable, with commit times that
stay, move on or go back. Both runs give the same findings, streamed in the same
order, the same report's bytes and the same books.

The general path is forced by answering "not calm now" (0) from ``Books.calm``, which
its contract always allows (a usage that is not calm takes the general path), so the
product needs no seam of its own and its hot path reads no test flag; the test checks
that the answer did force every charge through ``Books.use``, and that the calm path
did charge usages in the other run. Positive controls: each way of breaking the calm
cache's clearing (a change that keeps the epoch, or a calm that overlooks a
condition) is found by the same property."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import charter.catalogue  # noqa: F401  (every type known)
from charter.audit._books import Books, Ledger
from charter.audit.semantic import Auditor, Finding
from charter.authority import AgentRegistered, LineageRevoked
from charter.budgets import (
    BudgetLedgerOpened,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    UsageRecorded,
)
from charter.core import Budget
from charter.core.budget import Vec
from charter.core.events import Event, canonical_json
from charter.ledger._app import Envelope, encode_state, stream_uuid

_T0 = 1_800_000_000_000  # ms
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_AXES = Budget.AXES
_ZERO = Budget(tokens=0, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
Rows = list[tuple[int, str, bytes]]


def _budget(v: tuple[int, ...]) -> Budget:
    return Budget(**dict(zip(_AXES, v, strict=True)))


class _Journal:
    """Rows as the product encodes them (``encode_state``), or an attacker's raw
    payloads, at a commit time the ops move."""

    def __init__(self) -> None:
        self.rows: Rows = []
        self.t = _T0

    def _at(self) -> datetime:
        return _EPOCH + timedelta(milliseconds=self.t)

    def event(self, e: Event) -> None:
        state = encode_state(Envelope(stream_uuid(e.stream()), 1, self._at(), e))
        self.rows.append((len(self.rows) + 1, e.topic(), state))

    def raw(self, topic: Any, payload: Any) -> None:
        at = self._at().isoformat(timespec="microseconds")
        self.rows.append(
            (len(self.rows) + 1, topic, canonical_json({"at": at, "payload": payload}))
        )

    def state(self, topic: str, state: bytes) -> None:
        self.rows.append((len(self.rows) + 1, topic, state))


def _odd_amount(v: tuple[int, ...], variant: int) -> Any:
    """An amount an attacker could write: what the audit must take as the product
    would (int of each axis) or report as not decoding."""
    d: dict[str, Any] = dict(zip(_AXES, v, strict=True))
    match variant:
        case 0:
            return {k: float(x) + 0.5 for k, x in d.items()}
        case 1:
            return {k: str(x) for k, x in d.items()}
        case 2:
            return {k: bool(x % 2) for k, x in d.items()}
        case 3:
            return {k: x for k, x in d.items() if k != "cpu_ms"}
        case 4:
            return {k: -x for k, x in d.items()}
        case 5:
            return list(v)
        case 6:
            return {**d, "tokens": 10**20}
        case 7:
            return {**d, "mem_bytes": "lots"}
        case _:
            return d


_KINDS = (
    *("use",) * 8,
    *("grant",) * 3,
    "release",
    "release",
    "renew",
    "renew",
    "revoke",
    "odd-use",
    "odd-use",
    "unknown",
    "open",
)
_SMALL = st.tuples(*[st.integers(0, 6)] * 5)
_BIG = st.tuples(*[st.integers(0, 120)] * 5)
# (kind, which ledger, an amount or allocation, the commit time's step, a lease's life
# from now, a variant)
_OP = st.tuples(
    st.sampled_from(_KINDS),
    st.integers(0, 1000),
    st.one_of(_SMALL, _SMALL, _BIG),
    st.sampled_from([0, 0, 0, 0, 1, 2, 5, 20, 60, -1, -5, -40]),
    st.integers(-20, 150),
    st.integers(0, 9),
)
Op = tuple[str, int, tuple[int, ...], int, int, int]


def _build(root: tuple[int, ...], ops: list[Op]) -> Rows:
    j = _Journal()
    for name in ("r", "q"):
        j.event(AgentRegistered(name=name, lineage=f"agent:{name}", trust_root="ab" * 32))
    j.event(BudgetLedgerOpened(lineage="agent:r", allocation=_budget(root)))
    names = ["agent:r"]
    for kind, pick, v, dt, life, variant in ops:
        j.t += dt
        # any ledger, or one of the newest four (used again and again)
        target = (
            names[pick // 2 % len(names)] if pick % 2 else names[-1 - pick // 2 % 4 % len(names)]
        )
        match kind:
            case "use":
                j.event(
                    UsageRecorded(lineage=target, amount=_budget(v), refused=_ZERO, exhausted=False)
                )
            case "odd-use":
                lineage: Any = {8: "agent:r/sa-ghost", 9: 7}.get(variant, target)
                p = {"lineage": lineage, "amount": _odd_amount(v, variant)}
                j.raw("UsageRecorded/v1", {**p, "refused": _ZERO.model_dump(), "exhausted": False})
            case "grant":
                fresh = [f"{target}/sa-{len(names) + i}" for i in range(1 + variant % 3)]
                again = [names[life % len(names)]] if variant >= 8 else []  # leased again
                j.event(
                    LeaseGranted(
                        parent=target,
                        lineages=(*fresh, *again),
                        allocation=_budget(v),
                        expires_at_ms=max(0, j.t + life),
                    )
                )
                names += fresh
            case "release":
                j.event(LeaseReleased(lineage=target))
            case "renew":
                parent = target.rpartition("/")[0] or target
                parent = "agent:r" if variant >= 8 else parent  # not always its own
                j.event(
                    LeaseRenewed(lineage=target, parent=parent, expires_at_ms=max(0, j.t + life))
                )
            case "revoke":
                j.event(LineageRevoked(lineage=target, reason="revoked"))
            case "open":  # the second root's ledger, or a root's again
                lineage = "agent:q" if variant % 2 else "agent:r"
                j.event(BudgetLedgerOpened(lineage=lineage, allocation=_budget(v)))
                if lineage not in names:
                    names.append(lineage)
            case "unknown":
                match variant % 5:
                    case 0:
                        j.raw("Nonsense/v1", {"lineage": target})
                    case 1:
                        j.raw("UsageRecorded/v2", {"lineage": target, "amount": {}})
                    case 2:
                        j.raw("SandboxProbeRefused/v1", {"failed": ["x"], "detail": "d"})
                    case 3:
                        j.state("UsageRecorded/v1", b'{"at":')
                    case _:
                        j.raw(b"UsageRecorded/v1", {"lineage": target})  # not a str topic
    return j.rows


def _batches(rows: Rows, sizes: list[int]) -> list[Rows]:
    out, i, k = [], 0, 0
    while i < len(rows):
        n = sizes[k % len(sizes)] if sizes else len(rows)
        out.append(rows[i : i + n])
        i, k = i + n, k + 1
    return out


_KEPT = tuple(
    f.name
    for f in dataclasses.fields(Ledger)
    if f.name not in ("path", "above", "calm_epoch", "calm_until")
)


@dataclasses.dataclass
class _Run:
    streamed: list[bytes]  # each finding as it was found
    report: bytes
    books: list[tuple[Any, ...]]  # every ledger's books, but the calm cache
    egress: dict[str, int]
    charges: int  # Books.spend calls
    walks: int  # Books.use calls (the general path's, each one spend)


def _never_calm(self: Books, ledger: Ledger) -> int:
    del self, ledger
    return 0  # "not calm now": always a valid answer, the general path for every usage


def _run(batches: list[Rows], forced: bool) -> _Run:
    counts = {"spend": 0, "use": 0}
    spend, use = Books.spend, Books.use

    def counted_spend(self: Books, ledger: Ledger, amount: Vec) -> bool:
        counts["spend"] += 1
        return spend(self, ledger, amount)

    def counted_use(self: Books, *args: Any, **kwargs: Any) -> None:
        counts["use"] += 1
        use(self, *args, **kwargs)

    streamed: list[Finding] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Books, "spend", counted_spend)
        mp.setattr(Books, "use", counted_use)
        if forced:
            mp.setattr(Books, "calm", _never_calm)
        auditor = Auditor(streamed.append)
        inner = auditor._auditor  # its books, compared
        for batch in batches:
            auditor.apply_rows(batch)
        report = auditor.finish()
    books = [tuple(getattr(x, n) for n in _KEPT) for x in inner.books.ledgers.values()]
    return _Run(
        [canonical_json(f.model_dump(mode="json")) for f in streamed],
        canonical_json(report.to_json()),
        books,
        dict(inner.egress),
        counts["spend"],
        counts["use"],
    )


class _DisagreementError(AssertionError):
    """The calm path and the general path disagree."""


def _compare(batches: list[Rows], tally: dict[str, int]) -> None:
    fast, general = _run(batches, forced=False), _run(batches, forced=True)
    # The seam did force the general path: every charge walked its chain.
    assert general.charges == general.walks
    tally["calm"] += fast.charges - fast.walks
    tally["general"] += fast.walks
    for what in ("streamed", "report", "books", "egress"):
        if getattr(fast, what) != getattr(general, what):
            raise _DisagreementError(
                f"{what}: {getattr(fast, what)!r} != {getattr(general, what)!r}"
            )


_JOURNALS = {
    "root": _BIG.map(lambda v: tuple(50 + 10 * x for x in v)),
    "ops": st.lists(_OP, max_size=80),
    "sizes": st.lists(st.integers(1, 9), max_size=4),
}


_ROOT = (500,) * 5
_ONE, _TEN, _TWENTY = (1,) * 5, (10,) * 5, (20,) * 5
# Seeds (run first, then the random journals): short journals where a calm path that
# skips one of its conditions gives another answer (the random journals find some of
# the positive controls' mutants on their own, not all within the examples run). The
# ops' second field picks the ledger: 1 the root, 0 the newest, 2 the one before it.
_SEEDS: list[list[Op]] = [
    # a root's child expires, then the root is used: its expiry is due (settled first)
    [("grant", 1, _TEN, 0, 10, 0), ("use", 1, _ONE, 20, 0, 0)],
    # the root's calm cached, then a child leased that expires before its next usage
    [("use", 1, _ONE, 0, 0, 0), ("grant", 1, _TEN, 0, 10, 0), ("use", 1, _ONE, 20, 0, 0)],
    # a grandchild's calm cached, then its parent goes over, then the grandchild is used
    [
        ("grant", 1, _TEN, 0, 100, 0),
        ("grant", 0, (2,) * 5, 0, 100, 0),
        ("use", 0, _ONE, 1, 0, 0),
        ("use", 2, _TWENTY, 1, 0, 0),
        ("use", 0, _ONE, 1, 0, 0),
    ],
    # a child's calm cached, then its lease renewed to end before its next usage
    [
        ("grant", 1, _TEN, 0, 100, 0),
        ("use", 0, _ONE, 0, 0, 0),
        ("renew", 0, _ONE, 0, 5, 0),
        ("use", 0, _ONE, 10, 0, 0),
    ],
    # a child used, released, and used again, at that time and then earlier (its
    # release not yet in force, the usage still charged to its ended subtree)
    [
        ("grant", 1, _TEN, 0, 100, 0),
        ("use", 0, _ONE, 0, 0, 0),
        ("release", 0, _ONE, 10, 0, 0),
        ("use", 0, _ONE, 0, 0, 0),
        ("use", 0, _ONE, -5, 0, 0),
    ],
]


def _property(tally: dict[str, int], **options: Any) -> Callable[[], None]:
    def seeded(test: Callable[..., None]) -> Callable[..., None]:
        for ops in _SEEDS:
            test = example(root=_ROOT, ops=ops, sizes=[])(test)
        return test

    @settings(
        deadline=None,
        derandomize=True,  # the same examples each run: it fails or passes, never flakes
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        **options,
    )
    @seeded
    @given(**_JOURNALS)
    def check(root: tuple[int, ...], ops: list[Op], sizes: list[int]) -> None:
        _compare(_batches(_build(root, ops), sizes), tally)

    return check


def test_the_calm_path_and_the_general_path_agree() -> None:
    tally = {"calm": 0, "general": 0}
    _property(tally, max_examples=1500)()
    # Both paths were exercised: calm charges and chain walks, in the unforced run.
    assert tally["calm"] > 1000
    assert tally["general"] > 1000


def _keeps_epoch(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    """A mutant: ``Books.<name>`` leaves the epoch where it was (the calm cache is not
    cleared by what it changes)."""

    def mutate(mp: pytest.MonkeyPatch) -> None:
        real = getattr(Books, name)

        def kept(self: Books, *args: Any) -> Any:
            epoch = self.epoch
            out = real(self, *args)
            self.epoch = epoch
            return out

        mp.setattr(Books, name, kept)

    return mutate


def _calm_overlooking(what: str) -> Callable[[pytest.MonkeyPatch], None]:
    """A mutant: ``Books.calm`` overlooks one of its conditions on each ledger."""

    def calm(self: Books, ledger: Ledger) -> int:
        until = 1 << 62
        for node in ledger.path:
            if (node.over and what != "over") or (not node.counted_live and what != "ended"):
                until = 0
                break
            bounds = {
                "released": node.released,
                "expires": node.expires,
                "expiries": node.expiries[0][0] if node.expiries else None,
            }
            for key, bound in bounds.items():
                if key != what and bound is not None:
                    until = min(until, bound)
        ledger.calm_until, ledger.calm_epoch = until, self.epoch
        return until

    return lambda mp: mp.setattr(Books, "calm", calm)


def _frozen(mp: pytest.MonkeyPatch) -> None:
    prop = property(lambda self: 0, lambda self, value: None)
    mp.setattr(Books, "epoch", prop, raising=False)


_MUTANTS = {
    "the epoch never moves": _frozen,
    "a release keeps the epoch": _keeps_epoch("release"),
    "a renewal keeps the epoch": _keeps_epoch("renew"),
    "a grant's expiry keeps the epoch": _keeps_epoch("_push"),
    "going over keeps the epoch": _keeps_epoch("spend"),
    "calm overlooks a release": _calm_overlooking("released"),
    "calm overlooks an expiry": _calm_overlooking("expires"),
    "calm overlooks a child's expiry due": _calm_overlooking("expiries"),
    "calm overlooks being over": _calm_overlooking("over"),
    "calm overlooks an end": _calm_overlooking("ended"),
}


@pytest.mark.parametrize("mutant", list(_MUTANTS))
def test_the_property_finds_a_wrong_calm_path(mutant: str) -> None:
    """Positive control: with the calm cache's clearing (or the calm test) broken, the
    property fails: it can tell a wrong calm path from a right one."""
    tally = {"calm": 0, "general": 0}
    with pytest.MonkeyPatch.context() as mp:
        _MUTANTS[mutant](mp)
        check = _property(
            tally,
            max_examples=1000,
            phases=[Phase.explicit, Phase.generate],  # the first failure is enough
            report_multiple_bugs=False,
        )
        with pytest.raises(_DisagreementError):
            check()
