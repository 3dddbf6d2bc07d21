"""Registering host processes with the brokers, for tests that play a sandbox from the
host: the brokers admit a peer only inside the registered cgroup, and this test
process's own cgroup is one its children (of any uid) are in."""

from __future__ import annotations

import os
from collections.abc import Sequence

from charter.core.events import Event
from charter.sandbox._peer import cgroup_dirs_of

HERE: tuple[str, ...] = tuple(sorted(cgroup_dirs_of(os.getpid())))
"""The cgroup directories of this process, which the host processes it starts share."""


class Appended:
    """A journal callback for the egress broker that keeps what it was given."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, events: Sequence[Event]) -> object:
        self.events.extend(events)
        return None
