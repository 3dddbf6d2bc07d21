"""The one wall clock and the one conversion of commit times, both in whole epoch
milliseconds (the unit of every deadline), so every reader agrees on when a lease ended."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["Clock", "entry_ms", "now_ms"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Clock = Callable[[], int]
"""A source of epoch milliseconds (``now_ms``, or a test's fixed clock)."""


def now_ms() -> int:
    """The wall clock in whole epoch milliseconds."""
    return time.time_ns() // 1_000_000


def entry_ms(recorded_at: datetime) -> int:
    """An entry's commit time in whole epoch milliseconds (integer arithmetic)."""
    return (recorded_at - _EPOCH) // timedelta(milliseconds=1)
