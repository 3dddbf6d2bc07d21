"""Item 10: what an operator meets when a command cannot do what was asked: a clear
line and the contract's exit code, never a traceback, an empty answer or a journaled
refusal for a typo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli._run import ROOT, _env, charter
from tests.cli.conftest import spawn

NOBODY = 65534
USAGE = "tokens=1,wall=1s,cpu=1s,mem=0,egress=0"


def _head(home: Path) -> int:
    done = charter("--json", "journal", "verify", home=home)
    assert done.returncode == 0, done.stderr
    position: int = json.loads(done.stdout)["head"]["position"]
    return position


@pytest.mark.parametrize("command", ["tree", "budgets"])
def test_an_unknown_lineage_is_an_error_not_an_empty_answer(home: Path, command: str) -> None:
    done = charter(command, "agent:root/sa-99", home=home)
    assert done.returncode == 2
    assert "no lineage agent:root/sa-99 in the journal" in done.stderr
    assert done.stdout == ""
    control = charter("--json", command, "agent:root", home=home)
    assert control.returncode == 0, control.stderr


def test_lease_usage_with_a_typo_is_refused_before_journaling(home: Path) -> None:
    before = _head(home)
    done = charter("lease", "usage", "agent:root/sa-1x", "--amount", USAGE, home=home)
    assert done.returncode == 2
    assert "no lease or budget ledger for agent:root/sa-1x" in done.stderr
    assert _head(home) == before  # no BudgetRefused was journaled
    control = charter("lease", "usage", "agent:root", "--amount", USAGE, home=home)
    assert control.returncode == 0, control.stderr
    assert _head(home) == before + 1


def test_journal_show_lineage_finds_entries_naming_it_inside_a_list(home: Path) -> None:
    worker = spawn(home, 3)[1]
    done = charter("--json", "journal", "show", "--lineage", worker, home=home)
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in done.stdout.splitlines()]
    leases = [e for e in entries if e["type"] == "LeaseGranted"]
    assert len(leases) == 1
    payload = leases[0]["payload"]
    # The control: no top-level value of the entry names the worker; only the list does.
    assert worker in payload["lineages"]
    assert not any(isinstance(v, str) and v.startswith(worker) for v in payload.values())


def test_a_home_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("not a directory")
    for command in (("tree",), ("init",), ("journal", "verify")):
        done = charter(*command, home=home)
        assert done.returncode == 1, done.stderr
        assert f"the Charter home {home} is not a directory" in done.stderr
        assert "Traceback" not in done.stderr
        assert "internal error" not in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")
def test_an_unreadable_home_is_a_clear_error(shared_tmp: Path) -> None:
    home = shared_tmp / "home"
    assert charter("--quiet", "init", home=home).returncode == 0
    home.chmod(0o700)  # root's: the other user may not enter it
    for command in (("tree",), ("journal", "show"), ("agent", "list")):
        done = charter(*command, home=home, cwd=shared_tmp, uid=NOBODY)
        assert done.returncode == 1, done.stderr
        assert "Permission denied" in done.stderr or "permission denied" in done.stderr
        assert "Traceback" not in done.stderr
        assert "internal error" not in done.stderr
    home.chmod(0o755)
    os.chmod(home / "journal.db", 0o644)
    control = charter("journal", "verify", home=home, cwd=shared_tmp, uid=NOBODY)
    assert control.returncode == 0, control.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")
def test_sandbox_run_as_an_unprivileged_user_is_refused_without_a_traceback(
    shared_tmp: Path,
) -> None:
    home = shared_tmp / "home"
    assert charter("--quiet", "init", home=home).returncode == 0
    home.chmod(0o777)
    (home / "journal.db").chmod(0o666)
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); "
        "import charter.catalogue, charter.cli._main, charter.cli.sandbox; "
        f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY}); "
        "from charter.cli import main; main(sys.argv[2:])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), "sandbox", "run", "--", "true"],
        capture_output=True, text=True, env=_env(home, None), cwd=shared_tmp, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "needs root" in done.stderr
    assert "Traceback" not in done.stderr


_PYDANTIC_TELLS = ("errors.pydantic.dev", "validation error for", "[type=", "input_value")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("spawn", "--grant", '{"fanout": -1}'), "fanout"),
        (("spawn", "--grant", '{"bogus": 1}'), "bogus"),
        (("spawn", "--objective", ""), "objective"),
        (("agent", "add", "extra", "--tools", "a b"), "tool name 'a b'"),
        (("agent", "add", "extra", "--egress", "bad host"), "egress destination 'bad host'"),
        (("sandbox", "run", "--egress", "bad host", "--", "true"), "bad host"),
    ],
)
def test_invalid_input_is_one_line_without_pydantic_internals(
    home: Path, args: tuple[str, ...], field: str
) -> None:
    if args[0] == "spawn":
        defaults = {
            "--parent": "agent:root", "--width": "1", "--objective": "scan the estate host",
            "--est-cost": "tokens=100k,wall=1m,cpu=1m,mem=1MiB,egress=0",
        }  # fmt: skip
        given = dict(zip(args[1::2], args[2::2], strict=True))
        args = ("spawn", *[x for k, v in (defaults | given).items() for x in (k, v)])
    done = charter(*args, home=home)
    assert done.returncode == 2, done.stderr
    assert field in done.stderr
    for tell in _PYDANTIC_TELLS:
        assert tell not in done.stderr


_BAD = "tokens=1x,wall=1s,cpu=1s,mem=64MiB,egress=0"
_BUDGET_OPTIONS = [
    ("init", "--budget"),
    ("agent", "add", "extra", "--budget"),
    ("spawn", "--parent", "agent:root", "--width", "1", "--objective", "scan it", "--est-cost"),
    ("lease", "usage", "agent:root", "--amount"),
    ("sandbox", "spec", "--budget"),
    ("sandbox", "run", "--budget"),
]


def test_the_same_malformed_budget_exits_2_everywhere(home: Path) -> None:
    messages = set()
    for prefix in _BUDGET_OPTIONS:
        tail = ("--", "true") if prefix[:2] == ("sandbox", "run") else ()
        done = charter(*prefix, _BAD, *tail, home=home)
        assert done.returncode == 2, (prefix, done.stderr)
        messages.add(next(ln for ln in done.stderr.splitlines() if "budget axis" in ln))
        control = charter(*prefix, _BAD.replace("1x", "1"), *tail, home=home)
        assert control.returncode != 2, (prefix, control.stderr)  # the budget was the fault
    assert len({m[m.index("budget axis") :] for m in messages}) == 1


def test_a_closed_stdout_pipe_ends_quietly(home: Path) -> None:
    spawn(home, 200)  # more than a pipe buffer of `journal show` lines
    reader = subprocess.Popen(
        [sys.executable, "-m", "charter", "journal", "show"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(home, None),
    )  # fmt: skip
    assert reader.stdout is not None
    assert reader.stderr is not None
    first = reader.stdout.readline()
    reader.stdout.close()  # what `| head -1` does after its line
    code = reader.wait(timeout=60)
    stderr = reader.stderr.read().decode()
    assert b"JournalCreated" in first
    assert code == 141, stderr
    assert stderr == ""


def test_a_malformed_setting_in_the_environment_is_one_line(home: Path) -> None:
    done = charter("agent", "list", home=home, env={"CHARTER_CELL": "Bad Cell"})
    assert done.returncode == 2
    assert "Charter settings from the environment: cell:" in done.stderr
    for tell in _PYDANTIC_TELLS:
        assert tell not in done.stderr
    assert charter("agent", "list", home=home).returncode == 0  # control
