"""The launching mechanism: one budget, one command, one fresh sandbox, journaled end to
end. :class:`RawLauncher` does not check the host; the public
:class:`~charter.sandbox.launcher.Launcher` is this behind the fail-closed isolation
gate, and the probe (which *is* that check) runs its canary with this one.

The order is the design's rule: the lease is appended to the journal, and only after the
append returns is anything started. If the append fails, nothing runs.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from charter.core.budget import Budget
from charter.core.errors import CharterError
from charter.core.events import Event
from charter.sandbox._cgroup import CgroupUsage, cgroup_dirs, cpu_join_files, reap_stale, settle
from charter.sandbox._host import (
    allocate_uid,
    cgroup_mode,
    default_state_dir,
    find_bwrap,
)
from charter.sandbox._janitor import sweep_orphans, sweep_sockets
from charter.sandbox._proc import HeldInterrupt, How, SandboxProcess, Stdio
from charter.sandbox._workspace import PersistentWorkspace, unmount_stale
from charter.sandbox.egress import EgressBroker, EgressGrant, EgressTally
from charter.sandbox.errors import WorkspaceRefusedError
from charter.sandbox.events import (
    SandboxDiscarded,
    SandboxExited,
    SandboxLeased,
    SandboxStarted,
    SandboxUsage,
    WorkspaceRefused,
)
from charter.sandbox.keys import KeyBroker
from charter.sandbox.spec import CgroupMode, HostFacts, SandboxSpec, compile_spec, workspace_cap

__all__ = [
    "MAX_OUTPUT_BYTES",
    "EventSink",
    "RawLauncher",
    "MemorySink",
    "Outcome",
    "host_facts",
    "leased_event",
    "new_sandbox_id",
    "reap",
]


class EventSink(Protocol):
    """What the launcher needs of the journal: ``Journal.append`` fits."""

    def append(self, events: Sequence[Event]) -> object: ...


class MemorySink:
    """An in-memory sink with the journal's append interface (for tests without a DB)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def append(self, events: Sequence[Event]) -> object:
        self.events.extend(events)
        return tuple(events)


MAX_OUTPUT_BYTES = 4 * 1024 * 1024
"""The most of each captured stream (stdout, stderr) the parent reads back. A capture is
a memfd the sandbox holds open: it can write to it, or ftruncate it to any size (a
sparse file costs the sandbox nothing), so the parent never reads it whole. Past the cap
the output is cut and the Outcome says so (``stdout_truncated``/``stderr_truncated``)."""


class Outcome(BaseModel):
    """How a sandboxed command ended and what it used. ``stdout``/``stderr`` (when
    captured) hold at most ``max_output_bytes`` each; ``*_truncated`` says more was there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sandbox_id: str
    exit_code: int
    how: How
    usage: SandboxUsage
    stdout: bytes | None = None
    stderr: bytes | None = None
    # Facts about the captured bytes, left out of dumps as the bytes themselves are.
    stdout_truncated: bool = Field(default=False, exclude=True)
    stderr_truncated: bool = Field(default=False, exclude=True)


def reap(mode: CgroupMode, state_dir: Path) -> int:
    """Clean up after launchers that died without doing it (SIGKILLed): kill what is left
    of their sandboxes and remove their cgroups, then remove their broker sockets,
    warm-pool slot directories and persistent workspaces' overlays (whose changes are
    discarded: only a run that ended commits). Returns how many things were removed."""
    removed = reap_stale(mode, state_dir) + sweep_sockets(state_dir)
    removed += sweep_orphans(state_dir, "slots", os.rmdir)
    return removed + sweep_orphans(state_dir, "ws", unmount_stale)


def new_sandbox_id() -> str:
    return uuid.uuid4().hex[:16]


def leased_event(
    spec: SandboxSpec,
    budget: Budget,
    pool: str | None,
    grant: EgressGrant | None,
    *,
    lineage: str | None = None,
    grant_digest: str | None = None,
) -> SandboxLeased:
    """The lease of the sandbox ``spec`` describes. ``lineage`` is the worker it runs
    for, whose lease it runs under, and ``grant_digest`` the hex sha256 digest of that
    worker's sealed grant; both None when an operator runs it on their own behalf."""
    return SandboxLeased(
        sandbox_id=spec.sandbox_id,
        host_uid=spec.host_uid,
        pool=pool,
        budget=budget,
        pids_max=spec.pids_max,
        memory_bytes=spec.memory_bytes,
        cpu_quota_us=spec.cpu_quota_us,
        cpu_period_us=spec.cpu_period_us,
        wall_ms=spec.wall_ms,
        egress=grant.destinations if grant is not None else (),
        lineage=lineage,
        lease=lineage,
        grant_digest=grant_digest,
    )


def host_facts(
    sandbox_id: str,
    host_uid: int,
    workspace: str | None,
    *,
    egress: EgressBroker | None,
    keys: KeyBroker | None,
    cgroup_mode: CgroupMode,
    host_cpus: int,
) -> HostFacts:
    """The host's side of a sandbox's spec, for the cold launcher and the warm pool alike."""
    return HostFacts(
        sandbox_id=sandbox_id,
        host_uid=host_uid,
        host_gid=host_uid,
        workspace=workspace,
        egress_socket=str(egress.path) if egress else None,
        key_socket=str(keys.path) if keys and keys.path else None,
        model_socket=str(keys.model_path) if keys and keys.model_path else None,
        cgroup_mode=cgroup_mode,
        host_cpus=host_cpus,
    )


def read_capped(fd: int, limit: int = MAX_OUTPUT_BYTES) -> tuple[bytes, bool]:
    """At most ``limit`` bytes from the start of the capture file ``fd`` (positional
    reads: the sandbox may have moved the shared offset), and whether there was more.
    Never allocates more than ``limit``, whatever size the sandbox gave the file."""
    size = os.fstat(fd).st_size
    want = min(size, max(0, limit))
    buf = bytearray(want)
    view = memoryview(buf)
    got = 0
    while got < want:
        n = os.preadv(fd, [view[got:]], got)
        if n == 0:  # shrunk meanwhile
            break
        got += n
    del view
    del buf[got:]
    return bytes(buf), size > got


def read_memfd(fd: int, limit: int = MAX_OUTPUT_BYTES) -> tuple[bytes, bool]:
    """:func:`read_capped` of the memfd ``fd``, which is then closed."""
    try:
        return read_capped(fd, limit)
    finally:
        os.close(fd)


class RawLauncher:
    """Runs commands in fresh (cold) sandboxes, on a host it does not check itself."""

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
        self.sink = sink
        self.keys = keys
        self.state_dir = state_dir or default_state_dir()
        self.egress = egress
        self.bwrap = bwrap or find_bwrap()
        self.mode = cgroup_mode()
        self.host_cpus = host_cpus or os.cpu_count() or 1
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        self.state_dir = self.state_dir.resolve()
        # Sandboxes, empty cgroups and broker sockets left by launchers that were
        # SIGKILLed.
        reap(self.mode, self.state_dir)
        # Persistent workspaces' overlays, made by root: traversable, not listable.
        (self.state_dir / "ws").mkdir(exist_ok=True, mode=0o711)

    def _journal(self, make: Callable[[], Sequence[Event]]) -> None:
        """Append the events ``make`` builds (built only when there is a journal)."""
        if self.sink is not None:
            self.sink.append(list(make()))

    def run(
        self,
        budget: Budget,
        command: list[str],
        *,
        workspace: Path | None = None,
        grant: EgressGrant | None = None,
        stdin: Stdio = None,
        stdout: Stdio = None,
        stderr: Stdio = None,
        capture: bool = False,
        lineage: str | None = None,
        grant_digest: str | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> Outcome:
        """Run ``command`` in a new sandbox and return its outcome (never raises for the
        command's own failure; raises a CharterError when the sandbox cannot be made).

        ``lineage`` and ``grant_digest`` name the worker the sandbox runs for and its
        sealed grant, journaled in ``SandboxLeased`` (None: an operator's own run).
        With ``capture``, at most ``max_output_bytes`` of each stream is returned."""
        sandbox_id = new_sandbox_id()
        # A persistent workspace is reached without following any symlink and overlaid
        # with a size-capped tmpfs that takes every write; its changes are applied to
        # the directory once the sandbox is gone. Without one the workspace is a private
        # size-capped tmpfs.
        ws = (
            PersistentWorkspace(
                workspace, self.state_dir / "ws" / sandbox_id, workspace_cap(budget)
            )
            if workspace is not None
            else None
        )
        try:
            with allocate_uid(self.state_dir) as uid:
                settle(uid)
                spec = compile_spec(
                    budget,
                    host_facts(
                        sandbox_id,
                        uid.uid,
                        str(ws.merged) if ws is not None else None,
                        egress=self.egress,
                        keys=self.keys,
                        cgroup_mode=self.mode,
                        host_cpus=self.host_cpus,
                    ),
                )
                # Named in the uid's lock file before the cgroup exists: should this
                # process die, the next holder of the uid (or the next launcher's
                # reap_stale) kills what is left of the sandbox.
                uid.mark(cgroup_dirs(self.mode, spec.cgroup_name))
                # The lease is committed before anything starts.
                self._journal(
                    lambda: [
                        leased_event(
                            spec, budget, None, grant, lineage=lineage, grant_digest=grant_digest
                        )
                    ]
                )
                return self._run_spec(
                    spec,
                    command,
                    grant=grant,
                    stdio=(stdin, stdout, stderr),
                    capture=max_output_bytes if capture else None,
                    deliver=ws.commit if ws is not None else None,
                )
        finally:
            if ws is not None:
                ws.close()

    def _run_spec(
        self,
        spec: SandboxSpec,
        command: list[str],
        *,
        grant: EgressGrant | None,
        stdio: tuple[Stdio, Stdio, Stdio],
        capture: int | None,
        deliver: Callable[[Sequence[str]], None] | None = None,
    ) -> Outcome:
        """Start, wait, journal the end. ``capture``: None, or how many bytes of each
        captured stream to read back. Whatever goes wrong after the lease was journaled,
        the lease gets its end (``SandboxDiscarded`` at least): no lease dangles.

        ``deliver`` (a persistent workspace's commit) runs once no process of the
        sandbox is left, before its usage is read, given the sandbox's CPU cgroup files
        to join: the copy-back's CPU is in the usage journaled. Its error (a refusal
        over the limits, a failure) is raised once the end is journaled. A run that
        never got to its wait (the sandbox could not start, or its start could not be
        journaled) delivers nothing."""
        stdin, stdout, stderr = stdio
        egress = self.egress
        registered = ended = False
        out_fd = err_fd = None
        proc: SandboxProcess | None = None
        held = HeldInterrupt()  # a Ctrl-C from here on reaches the wait (below)
        try:
            if capture is not None:
                out_fd = os.memfd_create("stdout")
                err_fd = os.memfd_create("stderr")
            registered = self._register_brokers(spec, grant)
            start = time.monotonic()
            proc = self._start(
                spec,
                command,
                (
                    stdin,
                    out_fd if out_fd is not None else stdout,
                    err_fd if err_fd is not None else stderr,
                ),
            )
            code, how = proc.wait_or_interrupt(None, held)
            wall_ms = int((time.monotonic() - start) * 1000)
            cg, undelivered = self._end(proc, deliver)
            tally = EgressTally()
            if egress is not None and registered:
                registered = False
                tally = egress.unregister(spec.host_uid)
            usage = SandboxUsage(wall_ms=wall_ms, egress_bytes=tally.used, **cg.model_dump())
            ended = True  # from here the end is journaled, or its failure is the error
            self._journal(
                lambda: [
                    *tally.attempts,
                    SandboxExited(sandbox_id=spec.sandbox_id, exit_code=code, how=how, usage=usage),
                    *_refusals(spec.sandbox_id, undelivered),
                    SandboxDiscarded(sandbox_id=spec.sandbox_id),
                ]
            )
            if how == "interrupted":
                # The end is on record; now the caller learns it was interrupted.
                raise KeyboardInterrupt  # noqa: TRY301 (the wait caught the original)
            _raise(undelivered)
            return _outcome(spec, code, how, usage, (out_fd, err_fd), capture or 0)
        except BaseException:
            if proc is not None and proc.proc.poll() is None:
                proc.destroy()
            if not ended:
                # The lease is on record: give it its end, so no lease dangles. The
                # original error is what the caller needs; a second one is dropped.
                with contextlib.suppress(Exception):
                    self._journal(lambda: [SandboxDiscarded(sandbox_id=spec.sandbox_id)])
            raise
        finally:
            held.release(raise_pending=False)  # (an error is already on its way)
            if proc is not None and proc.proc.poll() is None:
                proc.destroy()
            if egress is not None and registered:
                egress.unregister(spec.host_uid)
            if self.keys is not None:  # wipes every key issued to this sandbox
                self.keys.unregister(spec.host_uid)
            for fd in (out_fd, err_fd):
                if fd is not None:
                    os.close(fd)

    def _end(
        self, proc: SandboxProcess, deliver: Callable[[Sequence[str]], None] | None
    ) -> tuple[CgroupUsage, CharterError | None]:
        """No process of the sandbox left, its workspace delivered (by a process in its
        CPU cgroups), its usage read, its cgroup's removal deferred; the delivery's
        error, if any, returned for the caller to raise once the end is journaled."""
        try:
            proc.end()
            undelivered = None
            if deliver is not None:
                try:
                    deliver(cpu_join_files(self.mode, proc.cgroup.dirs))
                except CharterError as e:
                    undelivered = e
            return proc.usage(), undelivered
        finally:
            proc.destroy(defer_removal=True)

    def _register_brokers(self, spec: SandboxSpec, grant: EgressGrant | None) -> bool:
        """Make the sandbox known to the brokers (by uid and cgroup); True when the
        egress broker has it, so the caller unregisters it."""
        cgroup = cgroup_dirs(self.mode, spec.cgroup_name)
        if self.keys is not None:
            self.keys.register(spec.host_uid, spec.sandbox_id, cgroup=cgroup)
        if self.egress is None:
            return False
        # The broker enforces the spec's egress bytes (the budget), lowered by the
        # grant's own cap when it has one; it knows the peer by uid and cgroup and
        # journals each connection it opens before opening it.
        grant = grant or EgressGrant()
        self.egress.register(
            spec.host_uid,
            spec.sandbox_id,
            grant,
            byte_cap=grant.byte_cap(spec.egress_bytes),
            cgroup=cgroup,
            journal=lambda events: self._journal(lambda: events),
        )
        return True

    def _start(
        self,
        spec: SandboxSpec,
        command: list[str],
        stdio: tuple[Stdio, Stdio, Stdio],
    ) -> SandboxProcess:
        """Start bwrap and commit ``SandboxStarted``; if that append fails, kill it."""
        stdin, stdout, stderr = stdio
        proc = SandboxProcess(
            spec, command, bwrap=self.bwrap, stdin=stdin, stdout=stdout, stderr=stderr,
        )  # fmt: skip
        try:
            pid = proc.pid
            started = SandboxStarted(sandbox_id=spec.sandbox_id, pid=pid, command=tuple(command))
            self._journal(lambda: [started])
        except BaseException:
            proc.destroy()
            raise
        return proc


def _outcome(
    spec: SandboxSpec,
    code: int,
    how: str,
    usage: SandboxUsage,
    captured: tuple[int | None, int | None],
    limit: int,
) -> Outcome:
    """The run's outcome, with at most ``limit`` bytes of each captured stream."""
    out_fd, err_fd = captured
    out, out_cut = read_capped(out_fd, limit) if out_fd is not None else (None, False)
    err, err_cut = read_capped(err_fd, limit) if err_fd is not None else (None, False)
    return Outcome(
        sandbox_id=spec.sandbox_id, exit_code=code, how=how, usage=usage,
        stdout=out, stderr=err, stdout_truncated=out_cut, stderr_truncated=err_cut,
    )  # fmt: skip


def _raise(error: BaseException | None) -> None:
    if error is not None:
        raise error


def _refusals(sandbox_id: str, undelivered: CharterError | None) -> list[WorkspaceRefused]:
    """The workspace's refusal to journal with the end (none for a failure to apply,
    which the caller gets as the error it is)."""
    if not isinstance(undelivered, WorkspaceRefusedError):
        return []
    return [WorkspaceRefused(sandbox_id=sandbox_id, reason=str(undelivered)[:1000])]
