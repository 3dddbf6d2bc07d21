"""The sandbox lifecycle events (registered in charter/catalogue.py with every other
event type). The lease is journaled before the start, always."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from charter.core.budget import Budget
from charter.core.events import Event
from charter.core.lineage import Lineage

__all__ = [
    "CredentialInjected",
    "CredentialWithheld",
    "EgressAttempted",
    "EgressOpened",
    "SandboxDiscarded",
    "SandboxExited",
    "SandboxLeased",
    "SandboxProbeRefused",
    "WorkspaceRefused",
    "SandboxQuarantined",
    "SandboxStarted",
    "SandboxUsage",
]


class SandboxUsage(BaseModel):
    """What a sandbox consumed, read from its cgroup and the clock."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_ms: int
    cpu_ms: int
    memory_peak_bytes: int
    oom_kills: int
    pids_limit_hits: int
    egress_bytes: int = 0


class _SandboxEvent(Event):
    sandbox_id: str

    def stream(self) -> str | None:
        return f"sandbox:{self.sandbox_id}"


Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""A sha256 digest as 64 lower-case hex digits."""


class SandboxLeased(_SandboxEvent):
    """A sandbox (cold or a warm-pool slot) is leased to run one command.

    ``lineage``, ``lease`` and ``grant_digest`` join the sandbox to the worker it runs
    for: the worker's lineage, the lease it runs under (named by the lineage holding
    it) and the digest of the worker's sealed grant. All three are None for a sandbox
    run on an operator's own behalf (``charter sandbox run``), and in entries written
    before they existed, which is why they have defaults. ``budget`` is stored as the
    budget's JSON form, so entries written when it was a plain dict decode unchanged.
    """

    type_name = "SandboxLeased"
    host_uid: int
    pool: str | None
    budget: Budget
    pids_max: int
    memory_bytes: int
    cpu_quota_us: int
    cpu_period_us: int
    wall_ms: int
    egress: tuple[str, ...]
    lineage: Lineage | None = None
    lease: Lineage | None = None
    grant_digest: Sha256Hex | None = None


class SandboxStarted(_SandboxEvent):
    type_name = "SandboxStarted"
    pid: int
    command: tuple[str, ...]


class SandboxExited(_SandboxEvent):
    """The command ended: ``how`` says whether by itself, by a signal, by the wall clock,
    or killed because its launcher was interrupted (Ctrl-C: exit code 130)."""

    type_name = "SandboxExited"
    exit_code: int
    how: Literal["exited", "signalled", "wall_clock", "interrupted"]
    usage: SandboxUsage


class WorkspaceRefused(_SandboxEvent):
    """The sandbox's changes to its persistent workspace were over the copy-back's
    limits (entries, nesting depth, apparent bytes: docs/sandbox.md) and none of them
    was applied; the directory is as it was before the run. Journaled with the
    sandbox's end, before the refusal (``workspace-unsafe``) reaches the caller."""

    type_name = "WorkspaceRefused"
    reason: Annotated[str, StringConstraints(max_length=1000)]


class SandboxDiscarded(_SandboxEvent):
    """The sandbox and its overlay are destroyed; the slot is never reused."""

    type_name = "SandboxDiscarded"


class SandboxQuarantined(_SandboxEvent):
    """An anomalous sandbox was destroyed and its slot withheld for good."""

    type_name = "SandboxQuarantined"
    reason: str


class SandboxProbeRefused(Event):
    """The host failed the isolation probe; spawning is refused."""

    type_name = "SandboxProbeRefused"
    failed: tuple[str, ...]
    detail: str


class EgressAttempted(_SandboxEvent):
    """Attempts to leave a sandbox through the egress broker, allowed or denied.

    The broker aggregates: one entry stands for ``count`` attempts with the same
    destination, outcome and reason, and ``bytes_out``/``bytes_in`` are their sums. A
    sandbox journals a bounded number of them; destination ``(other)`` with reason
    ``over the record cap`` counts the attempts beyond that bound (its ``allowed`` is
    False whatever they were, and its bytes are those of any allowed ones among them).
    Entries written before ``count`` existed stand for one attempt, hence its default.
    """

    type_name = "EgressAttempted"
    host_uid: int
    destination: str
    allowed: bool
    reason: str
    bytes_out: int = 0
    bytes_in: int = 0
    count: int = Field(default=1, ge=1)


class EgressOpened(_SandboxEvent):
    """An allowed egress connection, committed before the broker opens it: ``destination``
    is what the sandbox asked for (``host:port``), ``address`` the one address the name
    was resolved to and that the broker then connects to. Whether the connection then
    succeeded, and the bytes it moved, are in the sandbox's ``EgressAttempted`` records
    at its exit; this entry is there even if the launcher never gets that far."""

    type_name = "EgressOpened"
    host_uid: int
    destination: str
    address: str


class CredentialInjected(_SandboxEvent):
    """The broker presents the held secret ``secret`` (by name: never its value) on one
    connection to ``destination`` (``host:port`` as dialed), committed with that
    connection's :class:`EgressOpened` before anything is opened. ``kind`` says how:
    a header (``bearer``, ``header``), a minted identity token (``identity``) or the
    client certificate of its TLS handshake (``client-cert``)."""

    type_name = "CredentialInjected"
    host_uid: int
    secret: str
    kind: str
    destination: str


class CredentialWithheld(_SandboxEvent):
    """A test run (the sandbox's grant says ``withhold_credentials``) asked for a
    destination a held secret is bound to: the secret was withheld and nothing was
    opened (no destination sees the request, with or without a substitute value)."""

    type_name = "CredentialWithheld"
    host_uid: int
    secret: str
    destination: str
    reason: str
