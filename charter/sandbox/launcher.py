"""The cold launcher: one budget, one command, one fresh sandbox, behind the
fail-closed isolation gate."""

from __future__ import annotations

from pathlib import Path

from charter.sandbox._gate import ensure_isolation
from charter.sandbox._launch import (
    EventSink,
    MemorySink,
    Outcome,
    RawLauncher,
    host_facts,
    leased_event,
    new_sandbox_id,
)
from charter.sandbox.egress import EgressBroker
from charter.sandbox.keys import KeyBroker

__all__ = [
    "EventSink",
    "Launcher",
    "MemorySink",
    "Outcome",
    "host_facts",
    "leased_event",
    "new_sandbox_id",
]


class Launcher(RawLauncher):
    """Runs commands in fresh (cold) sandboxes on a host that passed the live probe.

    Refuses (HostCannotIsolateError, journaled through ``sink``) unless the probe passes
    on this host; a pass is remembered per boot, bwrap and sandbox code. There is no
    weaker mode.
    """

    def __init__(
        self,
        sink: EventSink | None = None,
        *,
        state_dir: Path | None = None,
        egress: EgressBroker | None = None,
        keys: KeyBroker | None = None,
        bwrap: str | None = None,
        host_cpus: int | None = None,
    ) -> None:
        super().__init__(
            sink, state_dir=state_dir, egress=egress, keys=keys, bwrap=bwrap, host_cpus=host_cpus
        )
        ensure_isolation(sink, state_dir=self.state_dir, bwrap=self.bwrap)
