"""The cold launcher: one budget, one command, one fresh sandbox, behind the
fail-closed isolation gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from charter.core.budget import Budget
from charter.sandbox._gate import ensure_isolation, forget_pass
from charter.sandbox._host import cgroup_mode, default_state_dir
from charter.sandbox._launch import (
    EventSink,
    MemorySink,
    Outcome,
    RawLauncher,
    host_facts,
    leased_event,
    new_sandbox_id,
    reap,
)
from charter.sandbox.egress import EgressBroker
from charter.sandbox.errors import HostCannotIsolateError
from charter.sandbox.keys import KeyBroker

__all__ = [
    "EventSink",
    "Launcher",
    "MemorySink",
    "Outcome",
    "host_facts",
    "leased_event",
    "new_sandbox_id",
    "reap_host",
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
        # The gate comes first: a host without bubblewrap is refused (exit 4, journaled)
        # before anything else looks for it.
        ensure_isolation(sink, state_dir=state_dir, bwrap=bwrap)
        super().__init__(
            sink, state_dir=state_dir, egress=egress, keys=keys, bwrap=bwrap, host_cpus=host_cpus
        )

    def run(self, budget: Budget, command: list[str], **kw: Any) -> Outcome:
        """:meth:`RawLauncher.run`; when the host turns out unable to isolate after all
        (its cgroups became unusable since the remembered pass), the pass is forgotten,
        so the next launcher probes again, and the refusal is raised (exit 4)."""
        try:
            return super().run(budget, command, **kw)
        except HostCannotIsolateError:
            forget_pass(self.state_dir)
            raise


def reap_host(state_dir: Path | None = None) -> int:
    """``charter sandbox reap``: what every launcher and pool does as it starts, on its
    own. Kills the sandboxes of launchers that were SIGKILLed (their uid records name
    their cgroups), removes their cgroups, broker sockets and slot directories; returns
    how many things were removed."""
    return reap(cgroup_mode(), (state_dir or default_state_dir()).resolve())
