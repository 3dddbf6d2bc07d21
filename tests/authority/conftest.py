"""Fixtures: a real SQLite journal, a real key store, a registered root agent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.authority import Clearance, FixedPolicy, PermissionMode, Verdict
from charter.control import AgentRecord, Ceiling, SpawnService, register_root
from charter.core import KeyStore
from charter.ledger import Journal
from tests.authority._support import BIG


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal.create(f"sqlite:///{tmp_path / 'journal.db'}") as j:
        yield j


@pytest.fixture
def keystore(tmp_path: Path) -> KeyStore:
    return KeyStore(tmp_path / "home")


CEILING = Ceiling(
    budget=BIG,
    clearance=Clearance.CONFIDENTIAL,
    mode=PermissionMode.ACCEPT_EDITS,
    depth=3,
    fanout=5000,
    tools=frozenset({"Read", "Bash", "Edit"}),
    egress=frozenset({"*.example.com", "pypi.org"}),
    secrets=frozenset({"GITHUB_TOKEN"}),
)


@pytest.fixture
def root(journal: Journal, keystore: KeyStore) -> AgentRecord:
    return register_root(journal, keystore, "root", CEILING)


@pytest.fixture
def service(journal: Journal, keystore: KeyStore, root: AgentRecord) -> SpawnService:
    del root
    return SpawnService(journal, keystore=keystore, policy=FixedPolicy(Verdict.POSITIVE))
