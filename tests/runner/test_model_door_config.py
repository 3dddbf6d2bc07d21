"""`charter model configure|show`: the one place the model endpoint and its key are kept
(the home, mode 0600), never shown, read by the cell's door."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from charter.core import BadInputError
from charter.runner.model import ModelEndpoint, load_endpoint, prompt_estimate


def charter_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": os.getcwd()}
    return subprocess.run(
        [sys.executable, "-m", "charter", *args], env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip


def test_configure_keeps_the_key_in_the_home_and_never_shows_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    key = tmp_path / "key"
    key.write_text("sk-secret-value\n")
    done = charter_cli(home, "--json", "model", "configure", "--url", "http://127.0.0.1:9/v1",
                       "--key-file", str(key))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "sk-secret-value" not in done.stdout
    held = home / "model-api-key"
    assert stat.S_IMODE(held.stat().st_mode) == 0o600
    shown = charter_cli(home, "--json", "model", "show")
    assert json.loads(shown.stdout) == {"url": "http://127.0.0.1:9/v1", "key": True}
    assert "sk-secret" not in shown.stdout + shown.stderr
    endpoint = load_endpoint(home)
    assert endpoint == ModelEndpoint("http://127.0.0.1:9/v1", "sk-secret-value")
    assert "sk-secret" not in repr(endpoint)
    # Not an http(s) URL: refused before anything is written (exit 2).
    bad = charter_cli(home, "model", "configure", "--url", "file:///etc/passwd")
    assert bad.returncode == 2, bad.stderr
    assert load_endpoint(home) == endpoint


def test_an_endpoint_is_an_http_url_with_a_host() -> None:
    with pytest.raises(BadInputError):
        ModelEndpoint("ftp://example.com/v1")


def test_the_prompt_estimate_is_the_body_bytes_over_four_rounded_up() -> None:
    assert [prompt_estimate(b"x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
