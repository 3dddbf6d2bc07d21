"""``charter secret``, ``charter keys publish`` and ``charter sandbox run --secrets
[--dry-run]`` through the real command line: no value is ever printed, the JWKS verifies
with PyJWT, and a dry run reaches no destination while the real run injects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

from charter.ledger import Journal

from ._creds_support import FETCH, PKI, Server

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
TOKEN = "cli-" + os.urandom(12).hex()


def _charter(*args: str, env: dict[str, str], rc: int = 0) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "charter", *args], capture_output=True, text=True, timeout=120,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env}, check=False,
    )  # fmt: skip
    assert r.returncode == rc, (r.returncode, r.stdout, r.stderr)
    assert TOKEN not in r.stdout + r.stderr  # never a value, whatever the command
    return r


@pytest.fixture
def env(tmp_path: Path, state_dir: Path) -> dict[str, str]:
    return {
        "CHARTER_HOME": str(tmp_path / "home"),
        "CHARTER_DB": f"sqlite:///{tmp_path}/journal.db",
        "CHARTER_SANDBOX_STATE": str(state_dir),
        "THE_TOKEN": TOKEN,
    }


def test_secret_commands_never_print_a_value(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "tok").write_text(TOKEN + "\n")
    pki = PKI()
    cert, key = pki.issue("client", server=False)
    (tmp_path / "client.pem").write_bytes(cert + key)
    _charter("secret", "add", "from-file", "--from-file", str(tmp_path / "tok"),
             "--for", "api.example.com:8443", env=env)  # fmt: skip
    _charter("secret", "add", "from-env", "--from-env", "THE_TOKEN", "--kind", "header",
             "--header", "X-Api-Key", "--for", "*.example.com", env=env)  # fmt: skip
    _charter("secret", "add", "mtls", "--kind", "client-cert", "--from-file",
             str(tmp_path / "client.pem"), "--for", "mtls.example.com:443", env=env)  # fmt: skip
    _charter("secret", "add", "ident", "--kind", "identity", "--ttl", "60",
             "--for", "id.example.com", env=env)  # fmt: skip
    listed = json.loads(_charter("--json", "secret", "list", env=env).stdout)
    assert [(s["name"], s["kind"]) for s in listed] == [
        ("from-env", "header"), ("from-file", "bearer"), ("ident", "identity"),
        ("mtls", "client-cert"),
    ]  # fmt: skip
    assert listed[0]["header"] == "X-Api-Key"
    assert all("value" not in s and "key" not in s for s in listed)
    assert cert.decode().splitlines()[1] not in json.dumps(listed)
    # Refusals: an existing name (exit 1), an unset variable and a bad destination (exit 2).
    _charter("secret", "add", "from-file", "--from-env", "THE_TOKEN", "--for", "a.example.com",
             env=env, rc=1)  # fmt: skip
    _charter("secret", "add", "x", "--from-env", "NOT_SET_ANYWHERE", "--for", "a.example.com",
             env=env, rc=2)  # fmt: skip
    _charter("secret", "add", "y", "--from-env", "THE_TOKEN", "--for", "not a host!!",
             env=env, rc=2)  # fmt: skip
    # The published JWKS is one ES256 key an outside library reads.
    jwks = json.loads(_charter("keys", "publish", env=env).stdout)
    [published] = jwt.PyJWKSet.from_dict(jwks).keys
    assert published.algorithm_name == "ES256"
    _charter("secret", "remove", "from-env", env=env)
    assert len(json.loads(_charter("--json", "secret", "list", env=env).stdout)) == 3


def test_a_dry_run_withholds_and_a_real_run_injects(tmp_path: Path, env: dict[str, str]) -> None:
    _charter("init", env=env)
    pki = PKI()
    server = Server(pki, "localhost")
    (tmp_path / "ca.pem").write_bytes(pki.pem)
    port = server.port
    _charter("secret", "add", "tok", "--from-env", "THE_TOKEN", "--ca-file",
             str(tmp_path / "ca.pem"), "--for", f"localhost:{port}", env=env)  # fmt: skip
    run = ["sandbox", "run", "--budget", "tokens=0,wall=30s,cpu=30s,mem=256MiB,egress=1MB",
           "--egress", f"localhost:{port},127.0.0.1:{port}", "--secrets", "tok"]  # fmt: skip
    worker = ["--", "/usr/bin/python3", "-I", "-c", FETCH, f"http://localhost:{port}/"]
    dry = _charter(*run, "--dry-run", *worker, env=env)
    assert dry.stdout.splitlines() == ["403 credentials withheld (test run)"]
    assert "dry run: every held credential is withheld (tok)" in dry.stderr
    assert server.accepted == 0  # nothing reached the destination
    real = _charter(*run, *worker, env=env)
    assert real.stdout.splitlines() == ["200 ok with-authorization client=None"]
    assert [s.headers["authorization"] for s in server.seen] == [f"Bearer {TOKEN}"]
    with Journal.open(env["CHARTER_DB"]) as journal:
        withheld = [e.event for e in journal.entries(types=("CredentialWithheld",))]
        injected = [e.event for e in journal.entries(types=("CredentialInjected",))]
    assert [(e.secret, e.destination) for e in withheld] == [("tok", f"localhost:{port}")]
    assert [(e.secret, e.kind, e.destination) for e in injected] == [
        ("tok", "bearer", f"localhost:{port}")
    ]
    # The auditor knows the new events and finds nothing wrong in this history.
    _charter("audit", env=env)
    server.close()
