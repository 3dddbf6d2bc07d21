"""``charter serve`` as the operator runs it: loopback without a token; any other bind
refused without a usable token, and served with one (each refusal beside its control);
``charter serve token`` writes it 0600."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from charter.app import Charter
from tests.runner._support import ROOT_DIR
from tests.serve._support import fan_out, head


def _env(home: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k not in ("CHARTER_DB", "CHARTER_HOME")},
        "CHARTER_HOME": str(home),
        "PYTHONPATH": str(ROOT_DIR),
    }


def _charter(url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, *args],
        env=_env(home), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@contextmanager
def _serving(url: str, home: Path, *args: str) -> Iterator[str]:
    """``charter serve ARGS``: the URL it announces (with the port it bound)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", url, "serve", *args],
        env=_env(home), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    stderr = process.stderr
    threading.Thread(target=lambda: [lines.put(x) for x in stderr], daemon=True).start()
    try:
        line = lines.get(timeout=30)
        assert line.startswith("charter serve: http://"), line
        port = line.split("://", 1)[1].split("/", 1)[0].rpartition(":")[2]
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


def test_loopback_by_default_without_a_token(
    estate: Charter, journal_url: str, charter_home: Path
) -> None:
    fan_out(estate, 2)
    with _serving(journal_url, charter_home, "--bind", "127.0.0.1:0") as url:
        answer = httpx.get(url + "/api/fabric", timeout=10)
        assert answer.status_code == 200
        assert answer.json()["position"] == head(estate)


def test_another_bind_needs_a_token(estate: Charter, journal_url: str, charter_home: Path) -> None:
    refused = _charter(journal_url, charter_home, "serve", "--bind", "0.0.0.0:0")
    assert refused.returncode != 0
    assert "no usable token" in refused.stderr
    made = _charter(journal_url, charter_home, "--json", "serve", "token")
    assert made.returncode == 0, made.stderr
    token_file = charter_home / "serve-token"
    assert os.stat(token_file).st_mode & 0o777 == 0o600
    token = token_file.read_text().strip()
    assert token in made.stdout
    with _serving(journal_url, charter_home, "--bind", "0.0.0.0:0") as url:
        assert httpx.get(url + "/api/head", timeout=10).status_code == 401
        wrong = httpx.get(url + "/api/head", headers={"authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401
        bearer = {"authorization": f"Bearer {token}"}
        answer = httpx.get(url + "/api/head", headers=bearer, timeout=10)  # the control
        assert answer.status_code == 200
        assert answer.json() == {"position": head(estate)}


def test_a_token_file_on_loopback_is_required_too(
    estate: Charter, journal_url: str, charter_home: Path, tmp_path: Path
) -> None:
    del estate
    token_file = tmp_path / "page-token"
    made = _charter(journal_url, charter_home, "serve", "token", "--token-file", str(token_file))
    assert made.returncode == 0, made.stderr
    token = token_file.read_text().strip()
    args = ("--bind", "127.0.0.1:0", "--token-file", str(token_file))
    with _serving(journal_url, charter_home, *args) as url:
        assert httpx.get(url + "/api/head", timeout=10).status_code == 401
        with httpx.Client(base_url=url, timeout=10, follow_redirects=True) as client:
            opened = client.get("/", params={"token": token})  # the 303 sets the session
            assert opened.status_code == 200
            assert "Charter fabric" in opened.text
            assert client.get("/api/head").status_code == 200  # the session serves
