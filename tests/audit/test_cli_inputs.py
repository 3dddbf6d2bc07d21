"""Bad input is bad input (exit 2), and the auditor's read-only commands run on a
read-only copy of a journal (issue 24, 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.audit.test_cli_audit import charter, journal_home, ok
from tests.cli import _run
from tests.cli.test_auditor import AUDITOR, _hand_over, evidence

__all__ = ["evidence", "journal_home"]

MALFORMED = ("nonsense", "a+b+c", "charter.journal/x+00000000+AAAA")


def test_a_malformed_verifier_key_is_bad_input_not_tampering(
    journal_home: tuple, tmp_path: Path
) -> None:
    url, home = journal_home
    vkey = ok(charter("checkpoint", "key", home=home, db=url)).strip()
    cp, bundle, proof = tmp_path / "cp", tmp_path / "b.json", tmp_path / "proof"
    ok(charter("checkpoint", "--out", str(cp), home=home, db=url))
    ok(charter("export", str(bundle), home=home, db=url))
    proof.write_text(ok(charter("proof", "inclusion", "1", home=home, db=url)))
    ok(charter("witness", "init", "--name", "w.example", home=tmp_path / "w"))
    commands = {
        "export": ("export", "verify", str(bundle), "--journal-key"),
        "proof": ("proof", "verify", str(proof), "--journal-key"),
        "checkpoint": ("checkpoint", "verify", str(cp), "--journal-key"),
    }
    for args in commands.values():  # positive control: the real key verifies
        ok(charter(*args, vkey, home=home, db=url))
    for key in MALFORMED:
        for name, args in commands.items():
            got = charter(*args, key, home=home, db=url)
            assert got.returncode == 2, (name, key, got.stderr)
            assert "--journal-key" in got.stderr
        witness = charter(
            "witness", "cosign", str(cp), "--log-key", key, home=tmp_path / "w", db=url
        )
        assert witness.returncode == 2, witness.stderr
        extra = charter(
            "export",
            "verify",
            str(bundle),
            "--journal-key",
            vkey,
            "--witness-key",
            key,
            home=home,
        )
        assert extra.returncode == 2, extra.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")
def test_checkpoint_key_runs_on_a_read_only_copy(evidence: Path) -> None:
    url = f"sqlite:///{evidence}"
    owner = _run.charter("--db", url, "checkpoint", "key")  # the owner, read-write
    assert owner.returncode == 0, owner.stderr
    anchor = owner.stdout.strip()
    _hand_over(evidence, file_mode=0o644, dir_mode=0o555)
    before = sorted(p.name for p in evidence.parent.iterdir())
    for args in (("checkpoint", "key"), ("checkpoint", "key", "--current")):
        got = _run.charter("--db", url, *args, uid=AUDITOR)
        assert got.returncode == 0, (args, got.stderr)
        assert got.stdout.strip() == anchor
    assert sorted(p.name for p in evidence.parent.iterdir()) == before
