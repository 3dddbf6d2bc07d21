"""The warm pool: sandboxes prepared ahead, each leased once and discarded, never reused.

A slot is a complete sandbox (cgroup caps joined, unique host uid, overlay workspace over
a read-only template on a size-capped tmpfs, bwrap namespaces, seccomp) whose process is
parked *just before exec*: a bash stub waiting to read the command's argv from a pipe.
Leasing writes the argv; the stub execs it. Release kills the slot, and the private mount
namespace holding the overlay dies with it, so nothing a lease wrote reaches the next.

The pool's capacity is the cell's admission cap for sandboxes: ``lease`` refuses
(:class:`PoolExhaustedError`) or waits when every slot is leased. There is no second count.
``spare`` slots may be parked beyond it (never leased beyond it), so that a start finds
one ready when workers end close together.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from charter.core.budget import Budget
from charter.core.events import Event
from charter.sandbox._cgroup import cgroup_dirs, settle
from charter.sandbox._gate import ensure_isolation, forget_pass
from charter.sandbox._host import UidLease, allocate_uid, cgroup_mode, default_state_dir, find_bwrap
from charter.sandbox._launch import (
    MAX_OUTPUT_BYTES,
    EventSink,
    Outcome,
    host_facts,
    leased_event,
    new_sandbox_id,
    read_memfd,
    reap,
)
from charter.sandbox._proc import HeldInterrupt, Overlay, SandboxProcess
from charter.sandbox.egress import EgressBroker, EgressGrant
from charter.sandbox.errors import (
    HostCannotIsolateError,
    PoolCapacityError,
    PoolExhaustedError,
    SandboxUnavailableError,
    SlotStateError,
)
from charter.sandbox.events import (
    SandboxDiscarded,
    SandboxExited,
    SandboxLeased,
    SandboxProbeRefused,
    SandboxQuarantined,
    SandboxStarted,
    SandboxUsage,
)
from charter.sandbox.keys import KeyBroker
from charter.sandbox.spec import compile_spec

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
        self.leased: SandboxLeased | None = None  # what its lease journals (or its caller)
        self.proc: SandboxProcess | None = None
        self._args_w = self._out = self._err = -1
        self._made_dir = False
        self.slot_dir = pool.state_dir / "slots" / self.sandbox_id
        self._uid: UidLease | None = allocate_uid(pool.state_dir)
        self.host_uid = self._uid.uid
        ready_r = ready_w = args_r = -1
        try:  # from here on, any failure gives back the uid, the directory and every fd
            settle(self._uid)  # no survivor of a dead holder's sandbox keeps this uid
            self.slot_dir.mkdir(parents=True, mode=0o755)
            self._made_dir = True
            self.overlay = Overlay(pool.template, self.slot_dir, 0)
            self.facts = host_facts(
                self.sandbox_id,
                self.host_uid,
                str(self.overlay.merged),
                egress=pool.egress,
                keys=pool.keys,
                cgroup_mode=pool.mode,
                host_cpus=pool.host_cpus,
            )
            self.budget = pool.budget  # what the slot runs under (see ``narrow``)
            self.spec = compile_spec(pool.budget, self.facts)
            self.overlay.size_bytes = self.spec.tmp_bytes
            self._uid.mark(cgroup_dirs(pool.mode, self.spec.cgroup_name))
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

    def narrow(self, budget: Budget) -> None:
        """Lower this parked slot's caps to ``budget`` (each axis at most the pool's): a
        worker runs under its own lease, not the pool's slot budget. The cgroup limits
        are rewritten before anything runs; the wall clock ``run`` enforces and the
        egress bytes the broker counts come from the narrowed spec. The workspace tmpfs
        keeps the size it was mounted with (its pages count in the memory cap)."""
        if self.state is not SlotState.PARKED or self.proc is None:
            raise SlotStateError(f"slot {self.sandbox_id} is {self.state}; narrow it parked")
        capped = self.pool.budget.minimum(budget)
        spec = compile_spec(capped, self.facts).model_copy(
            update={"tmp_bytes": self.spec.tmp_bytes, "shm_bytes": self.spec.shm_bytes}
        )
        try:
            self.proc.cgroup.write_limits(spec)
        except OSError as e:
            raise SandboxUnavailableError(f"cannot lower the sandbox's limits: {e}") from e
        self.spec, self.budget = spec, capped

    def _await_parked(self, ready_r: int) -> None:
        if not _wait_readable(ready_r, _PARK_TIMEOUT) or os.read(ready_r, 1) != b"r":
            raise SandboxUnavailableError(
                "a warm-pool slot did not reach its parked state "
                f"(stderr: {read_memfd(os.dup(self._err), 4096)[0][-500:]!r})"
            )

    def run(
        self, command: list[str], *, capture: bool = True, max_output_bytes: int = MAX_OUTPUT_BYTES
    ) -> Outcome:
        """Exec ``command`` in this leased slot and wait (wall clock from the budget).
        Pooled sandboxes have no stdin. With ``capture``, at most ``max_output_bytes`` of
        each stream is read back (the Outcome says when more was there)."""
        if self.state is not SlotState.LEASED or self.proc is None:
            raise SlotStateError(f"slot {self.sandbox_id} is {self.state}; lease a fresh one")
        if not command:
            raise SlotStateError("an empty command cannot run")
        self.state = SlotState.RAN
        pool, proc = self.pool, self.proc
        started = SandboxStarted(sandbox_id=self.sandbox_id, pid=proc.pid, command=tuple(command))
        held = HeldInterrupt()  # a Ctrl-C from here on reaches the wait, never in between
        try:
            # The start is committed before the command can run: the stub is still
            # parked (reading its argv). If the append fails the stub is killed, never fed.
            try:
                if pool.lifecycle:
                    pool.journal(started)
            except BaseException:
                self._destroy()
                raise
            start = time.monotonic()
            os.write(self._args_w, b"".join(a.encode() + b"\0" for a in command))
            os.close(self._args_w)
            self._args_w = -1
            code, how = proc.wait_or_interrupt(start + self.spec.wall_ms / 1000, held)
        finally:
            held.release(raise_pending=False)  # (an error is already on its way)
        wall_ms = int((time.monotonic() - start) * 1000)
        cg = proc.usage()
        attempts = pool.egress.attempts(self.spec.host_uid) if pool.egress else []
        used = pool.egress.used(self.spec.host_uid) if pool.egress else 0
        usage = SandboxUsage(wall_ms=wall_ms, egress_bytes=used, **cg.model_dump())
        exited = SandboxExited(sandbox_id=self.sandbox_id, exit_code=code, how=how, usage=usage)
        pool.journal(*attempts, *((exited,) if pool.lifecycle else ()))
        if how == "interrupted":
            raise KeyboardInterrupt  # its end is on record; the caller releases the slot
        no: tuple[None, bool] = (None, False)
        out, out_cut = read_memfd(os.dup(self._out), max_output_bytes) if capture else no
        err, err_cut = read_memfd(os.dup(self._err), max_output_bytes) if capture else no
        return Outcome(
            sandbox_id=self.sandbox_id, exit_code=code, how=how, usage=usage, stdout=out,
            stderr=err, stdout_truncated=out_cut, stderr_truncated=err_cut,
        )  # fmt: skip

    def output(self, stream: str, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of what the command wrote to ``stream`` (``stdout`` or
        ``stderr``) from ``offset`` on, read while it runs (b"" once the slot is gone)."""
        fd = self._out if stream == "stdout" else self._err
        if fd < 0:
            return b""
        try:
            return os.pread(fd, limit, offset)
        except OSError:
            return b""  # destroyed meanwhile

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
        if self.pool.keys is not None:  # wipes every key issued to this slot
            self.pool.keys.unregister(self.host_uid)
        if self._made_dir:
            self._made_dir = False
            with contextlib.suppress(FileNotFoundError):
                self.slot_dir.rmdir()
        if self._uid is not None:
            self._uid.release()
            self._uid = None


class _ProbeRefusals:
    """``sink`` for the isolation probe of a pool that journals no lifecycle: only the
    probe's refusal (:class:`SandboxProbeRefused`) reaches it."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink

    def append(self, events: Sequence[Event]) -> object:
        refused = [e for e in events if isinstance(e, SandboxProbeRefused)]
        return self.sink.append(refused) if refused else None


def _wait_readable(fd: int, timeout: float) -> bool:
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    return bool(poller.poll(int(timeout * 1000)))


class WarmPool:
    """``capacity`` sandboxes of one budget over one read-only template.

    Every slot counts against ``capacity`` (plus ``spare``, which only parked slots may
    use) for as long as it holds anything of the host (a uid, a cgroup, processes): from
    the reservation of its build until its destruction is done. At every instant parked
    + leased + being built + being destroyed <= capacity + spare, and leased <= capacity.
    Slots are built and destroyed outside the pool's lock (a build can take up to
    ``_PARK_TIMEOUT``); only reservations and hand-overs happen under it. A slot's bwrap
    dies with the thread that built it (``--die-with-parent``): fill and release from
    long-lived threads.
    """

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
        parked: int | None = None,
        lifecycle: bool = True,
        spare: int = 0,
    ) -> None:
        if capacity < 1:
            raise PoolCapacityError("a warm pool needs a capacity of at least 1")
        if spare < 0:
            raise PoolCapacityError("a warm pool cannot hold a negative number of spare slots")
        if parked is not None and parked < 0:
            raise PoolCapacityError("a warm pool cannot keep a negative number parked")
        if not template.is_dir():
            raise SandboxUnavailableError(f"template {template} is not a directory")
        self.template = template.resolve()
        self.budget = budget
        self.capacity = capacity  # the most slots leased at once
        self.spare = spare  # room beyond it that only parked slots take
        # How many idle slots ``fill`` keeps ready (the rest of the capacity is built on
        # demand): each parked slot holds a host uid and processes while it waits.
        self.parked_target = capacity if parked is None else min(parked, capacity + spare)
        self.sink = sink
        # Whether the pool journals each slot's lifecycle (leased, started, exited,
        # discarded) through ``sink``; without it the caller journals it (the cell, pinned
        # to its worker's stream) and ``sink`` hears only the brokers and the probe.
        self.lifecycle = lifecycle
        self.egress = egress
        self.keys = keys
        self.state_dir = state_dir or default_state_dir()
        self.name = name
        # Fail closed, first. Without the lifecycle, the probe's canary (the pool's own
        # check, not a sandbox the caller runs) is not journaled; a refusal still is.
        probe_sink = sink if lifecycle or sink is None else _ProbeRefusals(sink)
        ensure_isolation(probe_sink, state_dir=self.state_dir, bwrap=bwrap)
        self.bwrap = bwrap or find_bwrap()
        self.mode = cgroup_mode()
        self.host_cpus = os.cpu_count() or 1
        reap(self.mode, self.state_dir)  # what launchers that were SIGKILLed left running
        self._parked: list[Slot] = []
        self._leased: set[Slot] = set()
        self._building = 0  # reserved capacity whose slot is being built (outside the lock)
        self._filling = 0  # of those, the builds ``fill`` parks when done
        self._dropping = 0  # slots out of the books whose destruction is not done yet
        self._closed = False
        self._cond = threading.Condition()
        self.quarantined = 0
        self.discarded = 0

    def journal(self, *events: Event) -> None:
        if self.sink is not None and events:
            self.sink.append(list(events))

    @property
    def leased(self) -> int:
        return len(self._leased)

    @property
    def parked(self) -> int:
        return len(self._parked)

    @property
    def live(self) -> int:
        """Slots holding host resources: parked, leased, being built or being destroyed."""
        with self._cond:
            return self._held()

    def _held(self) -> int:  # under self._cond
        return len(self._parked) + len(self._leased) + self._building + self._dropping

    def fill(self) -> None:
        """Park slots until ``parked_target`` are ready (or all of the capacity is held).
        The builds run one at a time on the calling thread, each reserved under the lock
        and built outside it, so concurrent fills never hold more than ``capacity``
        between them."""
        while True:
            with self._cond:
                if self._closed or self._held() >= self.capacity + self.spare:
                    return
                if len(self._parked) + self._building >= self.parked_target:
                    return
                self._building += 1
                self._filling += 1
            try:
                slot = self._build()
            except BaseException:
                with self._cond:  # a lease waiting for this build builds its own now
                    self._filling -= 1
                    self._cond.notify_all()
                raise
            with self._cond:
                self._filling -= 1
                self._building -= 1
                self._cond.notify_all()
                if not self._closed:
                    self._parked.append(slot)
                    continue
                self._dropping += 1  # closed meanwhile: the slot is discarded, not parked
            self._discard(slot)
            return

    def _build(self) -> Slot:
        """Build a slot whose capacity the caller reserved; a failed build gives it back."""
        try:
            return Slot(self)
        except HostCannotIsolateError:
            forget_pass(self.state_dir)  # unusable cgroups since the pass: probe again
            with self._cond:
                self._building -= 1
                self._cond.notify_all()
            raise
        except BaseException:
            with self._cond:
                self._building -= 1
                self._cond.notify_all()
            raise

    def _discard(self, slot: Slot) -> None:
        """Destroy a slot counted in ``_dropping``; its capacity is free once it is gone."""
        try:
            slot._destroy()
        finally:
            with self._cond:
                self._dropping -= 1
                self._cond.notify_all()

    def lease(
        self,
        grant: EgressGrant | None = None,
        *,
        timeout: float = 0.0,
        lineage: str | None = None,
        grant_digest: str | None = None,
        budget: Budget | None = None,
    ) -> Slot:
        """Take a parked slot (journaling the lease first). ``lineage`` and
        ``grant_digest`` name the worker it is leased for and its sealed grant, journaled
        in ``SandboxLeased`` (None: an operator's own lease). Over capacity this waits up
        to ``timeout`` seconds, then refuses: backpressure, never oversubscription.
        When no slot is parked but not every slot is leased, the rest of the capacity is
        being built or destroyed on other threads: this waits for that (bounded by their
        work, not by ``timeout``), or builds a slot itself, outside the lock, when
        capacity is free. ``budget`` narrows the slot's caps to a worker's lease
        (:meth:`Slot.narrow`) before the brokers learn its egress bytes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxUnavailableError(f"pool {self.name!r} is closed")
                if len(self._leased) < self.capacity:
                    # A slot being parked is nearer than one built from nothing here (and a
                    # build on the caller's thread is on its path): wait for it.
                    if self._parked or (
                        not self._filling and self._held() < self.capacity + self.spare
                    ):
                        break
                    self._cond.wait()  # a build or a destruction elsewhere will notify
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PoolExhaustedError(
                        f"all {self.capacity} sandboxes of pool {self.name!r} are leased; "
                        "retry after one is released"
                    )
                self._cond.wait(remaining)
            parked = self._parked.pop() if self._parked else None
            if parked is not None:
                self._leased.add(parked)
            else:
                self._building += 1  # a cold fill within capacity, built outside the lock
        slot = parked if parked is not None else self._lease_cold()
        try:
            if budget is not None:
                slot.narrow(budget)
            cgroup = cgroup_dirs(self.mode, slot.spec.cgroup_name)
            if self.egress is not None:
                # The broker enforces the spec's egress bytes (the budget), lowered by
                # the grant's own cap when it has one; it knows the peer by uid and cgroup
                # and journals each connection it opens before opening it.
                admitted = grant or EgressGrant()
                self.egress.register(
                    slot.spec.host_uid, slot.sandbox_id, admitted,
                    byte_cap=admitted.byte_cap(slot.spec.egress_bytes),
                    cgroup=cgroup, journal=lambda events: self.journal(*events),
                )  # fmt: skip
            if self.keys is not None:  # handles issued to the slot die with it
                self.keys.register(slot.spec.host_uid, slot.sandbox_id, cgroup=cgroup)
            leased = leased_event(
                slot.spec, slot.budget, self.name, grant, lineage=lineage, grant_digest=grant_digest
            )
            slot.leased = leased
            if self.lifecycle:
                self.journal(leased)
        except BaseException:
            self._drop(slot, quarantine=None)
            raise
        slot.grant = grant
        slot.state = SlotState.LEASED
        return slot

    def _lease_cold(self) -> Slot:
        """Build the slot ``lease`` reserved and put it in the leased set."""
        slot = self._build()
        with self._cond:
            self._building -= 1
            self._cond.notify_all()
            if not self._closed:
                self._leased.add(slot)
                return slot
            self._dropping += 1
        self._discard(slot)
        raise SandboxUnavailableError(f"pool {self.name!r} is closed")

    def release(self, slot: Slot, *, refill: bool = True) -> None:
        """Discard a leased slot (never reused) and, with ``refill``, park a fresh one in
        its place. The refill runs on the caller's thread (up to ``_PARK_TIMEOUT``) and
        its bwrap dies with that thread; pass ``refill=False`` and call :meth:`fill`
        from a long-lived thread to keep it off the caller's path."""
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
            self._dropping += 1  # still holds its uid, cgroup and processes
        try:
            slot._destroy()
        finally:
            try:
                if not self.lifecycle:
                    pass  # the caller journals the discard
                elif quarantine is None:
                    self.journal(SandboxDiscarded(sandbox_id=slot.sandbox_id))
                else:
                    self.journal(SandboxQuarantined(sandbox_id=slot.sandbox_id, reason=quarantine))
            finally:
                with self._cond:  # the capacity is free only once the slot is gone
                    if quarantine is None:
                        self.discarded += 1
                    else:
                        self.quarantined += 1
                    self._dropping -= 1
                    self._cond.notify_all()

    def close(self) -> None:
        """Destroy every parked slot (leased ones are destroyed by their release). A
        closed pool parks nothing more (a build finishing later is discarded) and
        refuses leases."""
        with self._cond:
            self._closed = True
            parked, self._parked = self._parked, []
            self._dropping += len(parked)
            self._cond.notify_all()
        for slot in parked:
            self._discard(slot)

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            leased = list(self._leased)
        for slot in leased:
            with contextlib.suppress(Exception):
                self.release(slot, refill=False)
        self.close()
