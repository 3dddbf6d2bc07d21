"""Errors of the auditor's side, over the fault groups in :mod:`charter.core.errors`."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from charter.core.errors import TamperedError

__all__ = ["ChainBrokenError"]


class _Finding(Protocol):
    """What a failed report says (``ChainReport`` fits)."""

    @property
    def first_bad_position(self) -> int | None: ...
    @property
    def reason(self) -> str | None: ...


R = TypeVar("R", bound=_Finding)


class ChainBrokenError(TamperedError, Generic[R]):
    """The journal does not verify; ``report`` says where and why."""

    def __init__(self, report: R) -> None:
        super().__init__(
            f"journal does not verify at position {report.first_bad_position}: {report.reason}"
        )
        self.report = report
