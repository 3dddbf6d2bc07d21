"""The warm pool: sandboxes prepared ahead, each leased once and discarded, never reused.

A slot is a complete sandbox (cgroup caps joined, unique host uid, overlay workspace over
a read-only template on a size-capped tmpfs, bwrap namespaces, seccomp) whose process is
parked *just before exec*: a bash stub waiting to read the command's argv from a pipe.
Leasing writes the argv; the stub execs it. Release kills the slot, and the private mount
namespace holding the overlay dies with it, so nothing a lease wrote reaches the next.

The pool's capacity is the cell's admission cap for sandboxes: ``lease`` refuses
(:class:`PoolExhaustedError`) or waits when every slot is leased. There is no second count.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from enum import StrEnum
from pathlib import Path

from charter.ledger.budget import Budget
from charter.ledger.events import Event
from charter.ledger.lifecycle import (
    SandboxDiscarded,
    SandboxExited,
    SandboxQuarantined,
    SandboxStarted,
    SandboxUsage,
)
from charter.sandbox._host import UidLease, allocate_uid, cgroup_mode, default_state_dir, find_bwrap
from charter.sandbox._proc import Overlay, SandboxProcess
from charter.sandbox.egress import EgressBroker, EgressGrant
from charter.sandbox.errors import PoolExhaustedError, SandboxUnavailableError, SlotStateError
from charter.sandbox.keys import KeyBroker
from charter.sandbox.launcher import EventSink, Outcome, leased_event, new_sandbox_id, read_memfd
from charter.sandbox.spec import HostFacts, compile_spec

__all__ = ["Slot", "SlotState", "WarmPool"]

_PARK_TIMEOUT = 10.0


class SlotState(StrEnum):
    PARKED = "parked"
    LEASED = "leased"
    RAN = "ran"
    GONE = "gone"


def _stub(ready_fd: int, args_fd: int) -> list[str]:
    """The parked program: say ready, read NUL-separated argv, exec it (bash is in Debian's
    essential set; ``mapfile -d ''`` is the one builtin that reads NUL-separated words)."""
    script = (
        f"printf r >&{ready_fd}; exec {ready_fd}>&-; "
        f"mapfile -d '' -t a <&{args_fd}; exec {args_fd}<&-; "
        '[ "${#a[@]}" -gt 0 ] && exec "${a[@]}"'
    )
    return ["/bin/bash", "--noprofile", "--norc", "-c", script]


class Slot:
    """One parked sandbox. Run exactly one command in it, then give it back to the pool."""

    def __init__(self, pool: WarmPool) -> None:
        self.pool = pool
        self.sandbox_id = new_sandbox_id()
        self.state = SlotState.PARKED
        self.grant: EgressGrant | None = None
        self.proc: SandboxProcess | None = None
        self._args_w = self._out = self._err = -1
        self._made_dir = False
        self.slot_dir = pool.state_dir / "slots" / self.sandbox_id
        self._uid: UidLease | None = allocate_uid(pool.state_dir)
        self.host_uid = self._uid.uid
        ready_r = ready_w = args_r = -1
        try:  # from here on, any failure gives back the uid, the directory and every fd
            self.slot_dir.mkdir(parents=True, mode=0o755)
            self._made_dir = True
            self.overlay = Overlay(pool.template, self.slot_dir, 0)
            self.spec = compile_spec(
                pool.budget,
                HostFacts(
                    sandbox_id=self.sandbox_id,
                    host_uid=self.host_uid,
                    host_gid=self.host_uid,
                    workspace=str(self.overlay.merged),
                    egress_socket=str(pool.egress.path) if pool.egress else None,
                    key_socket=str(pool.keys.path) if pool.keys and pool.keys.path else None,
                    cgroup_mode=pool.mode,
                    host_cpus=pool.host_cpus,
                ),
            )
            self.overlay.size_bytes = self.spec.tmp_bytes
            ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
            args_r, self._args_w = os.pipe2(os.O_CLOEXEC)
            self._out = os.memfd_create("stdout", os.MFD_CLOEXEC)
            self._err = os.memfd_create("stderr", os.MFD_CLOEXEC)
            self.proc = SandboxProcess(
                self.spec,
                _stub(ready_w, args_r),
                bwrap=pool.bwrap,
                overlay=self.overlay,
                extra_fds=(ready_w, args_r),
                stdin=None,
                stdout=self._out,
                stderr=self._err,
            )
            os.close(ready_w)
            os.close(args_r)
            ready_w = args_r = -1
            self._await_parked(ready_r)
        except BaseException:
            self._destroy()
            raise
        finally:
            for fd in (ready_r, ready_w, args_r):
                if fd >= 0:
                    os.close(fd)

    def _await_parked(self, ready_r: int) -> None:
        if not _wait_readable(ready_r, _PARK_TIMEOUT) or os.read(ready_r, 1) != b"r":
            raise SandboxUnavailableError(
                "a warm-pool slot did not reach its parked state "
                f"(stderr: {read_memfd(os.dup(self._err))[-500:]!r})"
            )

    def run(self, command: list[str], *, capture: bool = True) -> Outcome:
        """Exec ``command`` in this leased slot and wait (wall clock from the budget).
        Pooled sandboxes have no stdin."""
        if self.state is not SlotState.LEASED or self.proc is None:
            raise SlotStateError(f"slot {self.sandbox_id} is {self.state}; lease a fresh one")
        if not command:
            raise SlotStateError("an empty command cannot run")
        self.state = SlotState.RAN
        start = time.monotonic()
        os.write(self._args_w, b"".join(a.encode() + b"\0" for a in command))
        os.close(self._args_w)
        self._args_w = -1
        pool, proc = self.pool, self.proc
        started = SandboxStarted(sandbox_id=self.sandbox_id, pid=proc.pid, command=tuple(command))
        pool.journal(started)
        code, how = proc.wait(deadline=start + self.spec.wall_ms / 1000)
        wall_ms = int((time.monotonic() - start) * 1000)
        cg = proc.usage()
        attempts = pool.egress.attempts(self.spec.host_uid) if pool.egress else []
        used = pool.egress.used(self.spec.host_uid) if pool.egress else 0
        usage = SandboxUsage(wall_ms=wall_ms, egress_bytes=used, **cg.model_dump())
        pool.journal(
            *attempts,
            SandboxExited(sandbox_id=self.sandbox_id, exit_code=code, how=how, usage=usage),
        )
        out = read_memfd(os.dup(self._out)) if capture else None
        err = read_memfd(os.dup(self._err)) if capture else None
        return Outcome(
            sandbox_id=self.sandbox_id, exit_code=code, how=how, usage=usage, stdout=out, stderr=err
        )

    def _destroy(self) -> None:
        """Kill the slot's processes; its mount namespace (and overlay upper) dies with them."""
        self.state = SlotState.GONE
        for fd in (self._args_w, self._out, self._err):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._args_w = self._out = self._err = -1
        if self.proc is not None:
            self.proc.destroy()
        if self.pool.egress is not None:
            self.pool.egress.unregister(self.host_uid)
        if self._made_dir:
            self._made_dir = False
            with contextlib.suppress(FileNotFoundError):
                self.slot_dir.rmdir()
        if self._uid is not None:
            self._uid.release()
            self._uid = None


def _wait_readable(fd: int, timeout: float) -> bool:
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    return bool(poller.poll(int(timeout * 1000)))


class WarmPool:
    """``capacity`` sandboxes of one budget over one read-only template."""

    def __init__(
        self,
        template: Path,
        budget: Budget,
        capacity: int,
        *,
        sink: EventSink | None = None,
        egress: EgressBroker | None = None,
        keys: KeyBroker | None = None,
        state_dir: Path | None = None,
        name: str = "default",
        bwrap: str | None = None,
    ) -> None:
        if capacity < 1:
            raise PoolExhaustedError("a warm pool needs a capacity of at least 1")
        if not template.is_dir():
            raise SandboxUnavailableError(f"template {template} is not a directory")
        self.template = template.resolve()
        self.budget = budget
        self.capacity = capacity
        self.sink = sink
        self.egress = egress
        self.keys = keys
        self.state_dir = state_dir or default_state_dir()
        self.name = name
        self.bwrap = bwrap or find_bwrap()
        self.mode = cgroup_mode()
        self.host_cpus = os.cpu_count() or 1
        from charter.sandbox._gate import ensure_isolation

        ensure_isolation(sink, state_dir=self.state_dir, bwrap=self.bwrap)  # fail closed
        self._parked: list[Slot] = []
        self._leased: set[Slot] = set()
        self._cond = threading.Condition()
        self.quarantined = 0
        self.discarded = 0

    def journal(self, *events: Event) -> None:
        if self.sink is not None:
            self.sink.append(list(events))

    @property
    def leased(self) -> int:
        return len(self._leased)

    @property
    def parked(self) -> int:
        return len(self._parked)

    def fill(self) -> None:
        """Park slots until parked + leased == capacity."""
        while True:
            with self._cond:
                if len(self._parked) + len(self._leased) >= self.capacity:
                    return
            slot = Slot(self)
            with self._cond:
                self._parked.append(slot)
                self._cond.notify()

    def lease(self, grant: EgressGrant | None = None, *, timeout: float = 0.0) -> Slot:
        """Take a parked slot (journaling the lease first). Over capacity this waits up
        to ``timeout`` seconds, then refuses: backpressure, never oversubscription."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._leased) >= self.capacity:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PoolExhaustedError(
                        f"all {self.capacity} sandboxes of pool {self.name!r} are leased; "
                        "retry after one is released"
                    )
                self._cond.wait(remaining)
            slot = self._parked.pop() if self._parked else None
            if slot is None:
                slot = Slot(self)  # a cold fill within capacity
            self._leased.add(slot)
        try:
            if self.egress is not None:
                # The broker enforces the spec's egress bytes (the budget), lowered by
                # the grant's own cap when it has one.
                admitted = grant or EgressGrant()
                self.egress.register(
                    slot.spec.host_uid, slot.sandbox_id, admitted,
                    byte_cap=admitted.byte_cap(slot.spec.egress_bytes),
                )  # fmt: skip
            self.journal(leased_event(slot.spec, self.budget, self.name, grant))
        except BaseException:
            self._drop(slot, quarantine=None)
            raise
        slot.grant = grant
        slot.state = SlotState.LEASED
        return slot

    def release(self, slot: Slot, *, refill: bool = True) -> None:
        """Discard a leased slot (never reused) and park a fresh one in its place."""
        self._drop(slot, quarantine=None)
        if refill:
            self.fill()

    def quarantine(self, slot: Slot, reason: str, *, refill: bool = True) -> None:
        """Destroy an anomalous slot; it is journaled as quarantined and never returned."""
        self._drop(slot, quarantine=reason)
        if refill:
            self.fill()

    def _drop(self, slot: Slot, quarantine: str | None) -> None:
        with self._cond:
            if slot not in self._leased:
                raise SlotStateError(f"slot {slot.sandbox_id} is not leased from this pool")
            self._leased.discard(slot)
        try:
            slot._destroy()
        finally:
            if quarantine is None:
                self.discarded += 1
                self.journal(SandboxDiscarded(sandbox_id=slot.sandbox_id))
            else:
                self.quarantined += 1
                self.journal(SandboxQuarantined(sandbox_id=slot.sandbox_id, reason=quarantine))
            with self._cond:
                self._cond.notify_all()

    def close(self) -> None:
        """Destroy every parked slot (leased ones are destroyed by their release)."""
        with self._cond:
            parked, self._parked = self._parked, []
        for slot in parked:
            slot._destroy()

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        for slot in list(self._leased):
            with contextlib.suppress(Exception):
                self.release(slot, refill=False)
        self.close()
