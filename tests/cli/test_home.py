"""Item 9: the home is found the way people expect (CHARTER_HOME, a walk up to
``.charter`` like git's, a per-user data directory), never committed, and a deleted
journal gets one piece of advice from every command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from charter.core import HomeUnusableError, charter_home
from charter.core.home import find_home
from tests.cli._run import charter


def _no_home(tmp_path: Path) -> dict[str, str]:
    """No CHARTER_HOME, and a per-user data directory inside the test's own directory."""
    return {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path / "user")}


def test_a_home_is_found_by_walking_up_like_git(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".charter").mkdir(parents=True)
    deeper = project / "src" / "pkg"
    deeper.mkdir(parents=True)
    env = _no_home(tmp_path)
    made = charter("--json", "init", cwd=deeper, env=env)
    assert made.returncode == 0, made.stderr
    assert (project / ".charter" / "journal.db").is_file()
    # One `cd` down or up inside the project: the same journal.
    for where in (project, deeper, project / "src"):
        done = charter("--json", "tree", cwd=where, env=env)
        assert done.returncode == 0, done.stderr
    # Control: outside the project the walk finds nothing, and the per-user home is used.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = charter("tree", cwd=outside, env=env)
    assert done.returncode == 1
    assert str(tmp_path / "data" / "charter" / "journal.db") in done.stderr


def test_the_resolution_order(tmp_path: Path) -> None:
    project = tmp_path / "p"
    (project / ".charter").mkdir(parents=True)
    (project / "a" / "b").mkdir(parents=True)
    explicit = {"CHARTER_HOME": str(tmp_path / "mine"), "XDG_DATA_HOME": "/x"}
    assert charter_home(project / "a", explicit) == tmp_path / "mine"
    assert charter_home(project / "a" / "b", {"XDG_DATA_HOME": "/x"}) == project / ".charter"
    assert find_home(tmp_path) is None
    assert charter_home(tmp_path, {"XDG_DATA_HOME": "/x"}) == Path("/x/charter")
    # A relative XDG_DATA_HOME is ignored (the XDG rule): ~/.local/share is used.
    relative = {"XDG_DATA_HOME": "rel"}
    assert charter_home(tmp_path, relative) == Path.home() / ".local/share/charter"
    (tmp_path / "afile").write_text("")
    with pytest.raises(HomeUnusableError, match="not a directory"):
        charter_home(tmp_path, {"CHARTER_HOME": str(tmp_path / "afile")})


def test_init_writes_an_ignore_file_so_git_never_stages_the_keys(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    home = repo / ".charter"
    assert charter("--quiet", "init", home=home).returncode == 0
    assert (home / ".gitignore").read_text().splitlines()[-1] == "*"

    def staged() -> list[str]:
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        listed = subprocess.run([*git, "diff", "--cached", "--name-only"], check=True,
                                capture_output=True, text=True)  # fmt: skip
        shutil.rmtree(repo / ".git")
        return listed.stdout.split()

    (repo / "code.py").write_text("print('hi')\n")
    assert staged() == ["code.py"]
    # Control: without the ignore file, `git add -A` stages the private keys.
    (home / ".gitignore").unlink()
    assert any(name.endswith(".key") for name in staged())


def test_a_deleted_journal_gets_the_same_advice_from_every_command(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert charter("--quiet", "init", home=home).returncode == 0
    (home / "journal.db").unlink()
    advice = set()
    for command in (("tree",), ("budgets",), ("journal", "verify"), ("init",)):
        done = charter(*command, home=home)
        assert done.returncode == 1, done.stderr
        line = done.stderr.strip()
        assert "holds the signing key of a journal that is not at" in line
        assert "put the journal back" in line
        advice.add(line)
    assert len(advice) == 1
    # Control: with the journal back in place, every command works again.
    shutil.rmtree(home)
    assert charter("--quiet", "init", home=home).returncode == 0
    assert charter("tree", home=home).returncode == 0
