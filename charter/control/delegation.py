"""``sandbox: own`` delegation: durable agents that run in a sandbox of their own, and
the journal of each delegation to one (docs/delegation.md).

An own-sandbox agent is a durable agent (its directory entry, custody key and ceiling
grant, as ``charter agent add`` journals them) whose registration also declares what it
runs (:class:`OwnSandboxDeclared`): the program, and the budget one delegation reserves.
Its ceiling grant *is* its profile: the tools, egress and secrets the operator gave it.

A worker delegates to it through its door. The delegate is minted as a child of the
**agent** (its grant the agent's ceiling, attenuated by the pipeline like any child's,
with no depth or fan-out left), never of the caller, so it holds none of the caller's
tools, secrets or network; its **lease** is carved out of the **caller's** remainder (a
``LeaseGranted`` whose parent is the caller), so the calling flow pays for it and
conservation holds over the caller's tree. In one append, in this order:
``DelegationRequested``, the reservation (``LeaseGranted``), the schedule and the slot;
then the cell's start; then, when the delegate has ended and its reply went back,
``DelegationReplied``. A refusal is ``DelegationRefused`` (and nothing starts).
"""

from __future__ import annotations

from pydantic import Field

from charter.control.workers import MAX_ARGS, Arg
from charter.core import Budget, Lineage
from charter.core.events import Event
from charter.ledger import JournalFold

__all__ = [
    "DelegationRefused",
    "DelegationReplied",
    "DelegationRequested",
    "DelegationView",
    "OwnSandboxDeclared",
    "delegation_stream",
]


def delegation_stream(delegate: str) -> str:
    """The stream of one delegation: its request, then its one reply."""
    return f"delegation:{delegate}"


class OwnSandboxDeclared(Event):
    """Durable agent ``name`` runs in a sandbox of its own: ``argv`` is what each
    delegation to it runs, ``budget`` what each reserves from its caller. Journaled in
    its registration's append (so never without its ceiling grant, the profile)."""

    type_name = "OwnSandboxDeclared"

    name: str
    lineage: Lineage
    argv: tuple[Arg, ...] = Field(min_length=1, max_length=MAX_ARGS)
    budget: Budget

    def stream(self) -> str:
        return str(self.lineage)


class DelegationRequested(Event):
    """``caller`` delegates to ``agent``: ``delegate`` is the child of the agent minted
    for it, whose lease (the reservation, next in the same append) the caller pays."""

    type_name = "DelegationRequested"

    fanout: str
    caller: str
    agent: str
    delegate: str
    reserved: Budget

    def stream(self) -> str:
        return delegation_stream(self.delegate)


class DelegationReplied(Event):
    """What went back to the caller: the delegate's outcome and the digest of its reply
    (the text itself is its ``WorkerResult``). At most one per delegation."""

    type_name = "DelegationReplied"

    caller: str
    delegate: str
    outcome: str
    digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    def stream(self) -> str:
        return delegation_stream(self.delegate)


class DelegationRefused(Event):
    """A delegation that did not happen, and why (``reason`` the error's stable code):
    nothing was minted, reserved or started for it."""

    type_name = "DelegationRefused"

    caller: str
    agent: str
    reason: str
    error: str
    message: str = Field(max_length=2000)


class DelegationView(JournalFold):
    """Own-sandbox agents by name, and every delegation by its delegate."""

    types = (
        OwnSandboxDeclared.type_name,
        DelegationRequested.type_name,
        DelegationReplied.type_name,
    )

    def __init__(self) -> None:
        super().__init__()
        self.profiles: dict[str, OwnSandboxDeclared] = {}
        self.delegations: dict[str, DelegationRequested] = {}  # by delegate
        self.replied: set[str] = set()

    def apply(self, event: Event, position: int, at_ms: int = 0) -> None:
        del position, at_ms
        match event:
            case OwnSandboxDeclared():
                self.profiles.setdefault(event.name, event)
            case DelegationRequested():
                self.delegations.setdefault(event.delegate, event)
            case DelegationReplied():
                self.replied.add(event.delegate)
            case _:
                pass

    def is_delegate(self, lineage: str) -> bool:
        """Whether ``lineage`` is a delegate (or below one: none is ever minted)."""
        node = Lineage(lineage)
        return any(str(n) in self.delegations for n in (node, *node.ancestors()))
