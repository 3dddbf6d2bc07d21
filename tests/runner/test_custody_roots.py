"""The cell reads a root's custody key from the home once per incarnation, not once per
worker's start, and reads it again when a key derived from the one it read is not the
grant's (the file was replaced): the issued key is the grant's subject key either way,
and a grant the key does not match is still refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from nacl.signing import SigningKey

from charter.authority import SealedGrant
from charter.control import WorkerSpec
from charter.core import KeyStore
from charter.runner import NotAWorkerError
from charter.runner._custody import Custody
from tests.runner._support import fan_out, make_cell
from tests.runner.conftest import initialise


class _Broker:
    """Takes issued seeds (no sandbox behind them)."""

    def __init__(self) -> None:
        self.seeds: list[bytes] = []

    def issue(self, seed: bytearray, *, sandbox_id: str) -> str:
        self.seeds.append(bytes(seed))
        return f"handle-{sandbox_id}"


def _grants(sqlite_url: str, tmp_path: Path, state_dir: Path) -> list[tuple[str, SealedGrant]]:
    with initialise(sqlite_url, tmp_path / "home") as charter:
        result = fan_out(charter, 3, WorkerSpec(argv=("/bin/true",)))
        cell = make_cell(charter, None, state_dir)  # not opened: only its view of grants
        with charter.views.lock:
            cell.refresh()
            return [(str(c.lineage), cell._grant(str(c.lineage))) for c in result.children]


def test_a_root_key_is_read_once_and_again_when_it_no_longer_derives_the_grant(
    sqlite_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grants = _grants(sqlite_url, tmp_path, state_dir)
    reads: list[str] = []
    real = KeyStore.load

    def load(self: KeyStore, name: str) -> SigningKey:
        reads.append(name)
        return real(self, name)

    monkeypatch.setattr(KeyStore, "load", load)
    broker = _Broker()
    custody = Custody(KeyStore(tmp_path / "home"), broker)  # type: ignore[arg-type]
    for i, (lineage, grant) in enumerate(grants):
        custody.issue(lineage, grant, f"sb-{i}")
    assert len(reads) == 1  # three starts, one read of the root's key
    for seed, (_, grant) in zip(broker.seeds, grants, strict=True):
        assert bytes(SigningKey(seed).verify_key).hex() == grant.grant.subject_key
    # A root seed that no longer derives the grants' keys (as if the file was replaced
    # since it was read): read again, and the key issued is still the grant's.
    (root,) = custody._roots
    custody._roots[root] = bytes(32)
    lineage, grant = grants[0]
    custody.issue(lineage, grant, "sb-again")
    assert len(reads) == 2
    assert bytes(SigningKey(broker.seeds[-1]).verify_key).hex() == grant.grant.subject_key
    # Fail closed: a grant the derived key is not the subject of is refused, read afresh.
    with pytest.raises(NotAWorkerError):
        custody.issue(grants[1][0], grant, "sb-wrong")
    assert len(reads) == 3
