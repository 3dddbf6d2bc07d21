"""``charter logs LINEAGE [-f]``: a worker's live stdout and stderr tail, kept by its cell
in bounded files: shown while it runs, followed until it ends, escaped for the terminal
(a worker's control characters never reach it raw), exact under --json, and never more
than the cap however much it writes (real sandboxes, both backends)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from charter.control import WorkerSpec
from charter.runner import LOG_CAP, log_dir
from tests.runner._support import cli_env, fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise

# Writes a line, a line with a terminal escape on stderr and half a line, then, 10 s
# later (the test reads it live meanwhile: "two" not there yet is asserted, so a host
# too slow for the margin fails loudly, never passes wrongly), the rest, and ends.
TALKER = (
    'printf "one\\n"; printf "\\033[31mred\\033[0m\\n" >&2; printf "partial"; '
    'sleep 10; printf " line\\ntwo\\n"'
)


def _cli(url: str, home: Path, state_dir: Path, *args: str, **kw: Any) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, *args],
        env=cli_env(home, state_dir), capture_output=True, timeout=120, check=False, **kw,
    )  # fmt: skip


def test_logs_show_follow_escape_and_bound_a_workers_output(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=2) as charter:
        (talker,) = (
            str(c.lineage)
            for c in fan_out(charter, 1, WorkerSpec(argv=("/bin/sh", "-c", TALKER))).children
        )
        # The second runs a program that writes far more than the cap, then a marker.
        charter_flood = fan_out(
            charter,
            1,
            WorkerSpec(
                argv=(
                    "/bin/sh",
                    "-c",
                    f"head -c {4 * LOG_CAP} /dev/zero | tr '\\0' x; printf '\\nEND\\n'",
                )
            ),
        )
        (flood,) = (str(c.lineage) for c in charter_flood.children)
        with running(make_cell(charter, None, state_dir)) as cell:
            directory = log_dir(state_dir, talker)
            deadline = time.monotonic() + 60
            while (
                not (directory / "stdout").exists()
                or b"one" not in (directory / "stdout").read_bytes()
            ):
                assert time.monotonic() < deadline, "the talker's output never showed"
                time.sleep(0.05)
            # While it runs: what it wrote so far, escaped; not the partial line yet.
            live = _cli(journal_url, home, state_dir, "logs", talker, text=True)
            assert live.returncode == 0, live.stderr
            assert "one" in live.stdout.splitlines()
            assert "stderr: \\x1b[31mred\\x1b[0m" in live.stdout.splitlines()
            assert "\x1b" not in live.stdout  # the escape never reaches the terminal raw
            assert "two" not in live.stdout
            # Followed: until it ends, and every line once.
            follow = _cli(journal_url, home, state_dir, "logs", talker, "-f", "--stream", "stdout",
                          text=True)  # fmt: skip
            assert follow.returncode == 0, follow.stderr
            assert follow.stdout.splitlines() == ["one", "partial line", "two"]
            until_idle(cell)
        # Exact under --json: the bytes as written.
        exact = _cli(journal_url, home, state_dir, "--json", "logs", talker, text=True)
        assert exact.returncode == 0, exact.stderr
        chunks = [json.loads(line) for line in exact.stdout.splitlines()]
        got = {c["stream"]: base64.b64decode(c["bytes_b64"]) for c in chunks}
        assert got == {"stdout": b"one\npartial line\ntwo\n", "stderr": b"\x1b[31mred\x1b[0m\n"}
        # Bounded: the flood's file holds at most twice the cap, ending with its tail.
        kept = (log_dir(state_dir, flood) / "stdout").read_bytes()
        assert len(kept) <= 2 * LOG_CAP
        assert kept.endswith(b"x\nEND\n")
        # A lineage nothing was scheduled for is refused, and says so.
        none = _cli(journal_url, home, state_dir, "logs", "agent:estate/nobody", text=True)
        assert none.returncode != 0
        assert "no worker" in none.stderr
