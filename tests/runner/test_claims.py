"""The claim an incarnation holds its cell by, in one process (both backends): a second
incarnation waits while the claim holds (and says so when it stops waiting), takes it
over at once with ``take_over``; the fenced one's every decision is refused from the
takeover's position on, and a claim that lapsed is never renewed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from charter.control import CellSupersededError, WorkerKilled
from charter.core import now_ms
from charter.runner.errors import CellClaimHeldError
from charter.runner.events import CellClaimRenewed, CellStarted
from tests.runner._support import make_cell
from tests.runner.conftest import initialise


def test_a_held_claim_is_waited_for_then_refused_and_a_take_over_fences(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home") as charter:
        first = make_cell(charter, None, state_dir)
        first.claim_s = 30.0
        first.open()
        try:
            second = make_cell(charter, None, state_dir)
            second.claim_wait_s = 0.5
            with pytest.raises(CellClaimHeldError, match="holds it for"):
                second.open()  # waited half a second: the first still holds the cell
            assert [
                e.event.incarnation
                for e in charter.journal.entries(types=("CellStarted",))
                if isinstance(e.event, CellStarted)
            ] == [1]
            third = make_cell(charter, None, state_dir)
            third.take_over = True
            third.open()  # fences the first at once
            try:
                assert third.incarnation == 2
                # Every decision of the first is refused from here on: a kill it would
                # journal, a renewal of its claim.
                with pytest.raises(CellSupersededError):
                    first.lifecycle.record([WorkerKilled(lineage="agent:estate/x", reason="r")])
                with pytest.raises(CellSupersededError):
                    first.lifecycle.renew(30_000)
                with pytest.raises(CellSupersededError):
                    first.step()
            finally:
                third.close()
        finally:
            first.close()


def test_a_lapsed_claim_is_never_renewed(journal_url: str, tmp_path: Path, state_dir: Path) -> None:
    with initialise(journal_url, tmp_path / "home") as charter:
        cell = make_cell(charter, None, state_dir)
        cell.claim_s = 3600.0  # the renewer does not run during the test
        cell.open()
        try:
            claim = cell.lifecycle.renew(50)  # a claim of 50 ms
            assert claim.until_ms > 0
            while now_ms() <= claim.until_ms:  # until the claim has lapsed, by the clock
                time.sleep(0.01)
            with pytest.raises(CellSupersededError, match="fenced"):
                cell.lifecycle.renew(30_000)  # the journal refuses it past the lapse
            renewals = [
                e.event
                for e in charter.journal.entries(types=("CellClaimRenewed",))
                if isinstance(e.event, CellClaimRenewed)
            ]
            assert [r.until_ms for r in renewals] == [claim.until_ms]
        finally:
            cell.fenced = CellSupersededError("the test lapsed it")
            cell.close()


def test_a_renewal_is_not_held_behind_the_cells_other_decisions(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """The views' lock held (as a cell ending hundreds of workers holds it, one end's
    commit after another) for longer than a whole claim: the claim is still renewed
    meanwhile, and the incarnation is not fenced. Renewals once took that lock, so a
    claim lapsed behind the ends and the cell fenced itself."""
    with initialise(journal_url, tmp_path / "home") as charter:
        cell = make_cell(charter, None, state_dir)
        cell.claim_s = 1.5  # renewed every half second
        cell.open()
        try:
            start = now_ms()
            with charter.views.lock:  # everything else the cell decides waits here
                while now_ms() < start + 3 * 1500:  # two whole claims' length
                    time.sleep(0.05)
                renewed = [
                    e.event
                    for e in charter.journal.entries(types=("CellClaimRenewed",))
                    if isinstance(e.event, CellClaimRenewed)
                ]
            # Renewed while the lock was held, and the last renewal holds the cell now.
            assert len(renewed) >= 3
            assert renewed[-1].until_ms > now_ms()
            assert cell.fenced is None
            assert not cell.lifecycle.fenced()
            cell.step()  # it still acts
        finally:
            cell.close()
