"""Applying a sandbox's changes to its persistent workspace is bounded and delivers only
directories and regular files: a tree too deep, too many entries or files too big (a
sparse file at its apparent size) are refused with the host directory unchanged;
symlinks and special files are never delivered. The sandbox is stood in for by writes
into the overlay's merged view (where its writes land)."""

from __future__ import annotations

import ast
import os
import resource
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.sandbox import _copyback
from charter.sandbox._cgroup import cgroup_dirs, controller_dir, cpu_join_files, read_int
from charter.sandbox._host import cgroup_mode
from charter.sandbox._workspace import MAX_COMMIT_DEPTH, MAX_COMMIT_ENTRIES, PersistentWorkspace
from charter.sandbox.errors import SandboxUnavailableError, WorkspaceRefusedError
from charter.sandbox.spec import CgroupMode

pytestmark = pytest.mark.sandbox

CAP = 4 << 20


def _tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under ``root`` (not following links): mode, size, and a file's bytes."""
    found: dict[str, tuple[int, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = os.lstat(path)
            data = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
            found[str(path.relative_to(root))] = (st.st_mode, st.st_size, data)
    return found


@pytest.fixture
def host(state_dir: Path, tmp_path: Path) -> Path:
    path = tmp_path / "host-ws"
    path.mkdir()
    (path / "kept.txt").write_text("the host's own\n")
    (path / "old").mkdir()
    (path / "old" / "f").write_text("old\n")
    return path


@pytest.fixture
def overlay(
    request: pytest.FixtureRequest, host: Path, state_dir: Path
) -> Iterator[PersistentWorkspace]:
    limits = getattr(request, "param", {})
    ws = PersistentWorkspace(host, state_dir / f"ws-commit-{os.getpid()}-{id(host)}", CAP, **limits)
    try:
        yield ws
    finally:
        ws.close()


def _deep(merged: Path, levels: int) -> None:
    """``levels`` nested directories (made through descriptors: no path this long)."""
    fd = os.open(merged, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"bottom\n")
        os.close(leaf)
    finally:
        os.close(fd)


def _changes(merged: Path) -> None:
    """Ordinary changes next to the attack, which must not land either."""
    (merged / "new.txt").write_text("new\n")
    (merged / "kept.txt").write_text("overwritten\n")
    os.unlink(merged / "old" / "f")


def test_a_tree_800_levels_deep_is_refused_and_nothing_is_applied(
    overlay: PersistentWorkspace, host: Path
) -> None:
    before = _tree(host)
    _changes(overlay.merged)
    _deep(overlay.merged, 800)
    with pytest.raises(WorkspaceRefusedError, match="deeper than 64"):
        overlay.commit()  # not a RecursionError
    assert _tree(host) == before


def test_a_tree_at_the_depth_limit_is_delivered(overlay: PersistentWorkspace, host: Path) -> None:
    _changes(overlay.merged)
    _deep(overlay.merged, MAX_COMMIT_DEPTH - 1)  # its leaf at depth 64
    overlay.commit()
    leaf = host.joinpath(*["d"] * (MAX_COMMIT_DEPTH - 1), "leaf")
    assert leaf.read_text() == "bottom\n"
    assert (host / "new.txt").read_text() == "new\n"
    assert (host / "kept.txt").read_text() == "overwritten\n"
    assert not (host / "old" / "f").exists()


@pytest.mark.parametrize("overlay", [{"max_entries": 50}], indirect=True)
def test_too_many_entries_are_refused_and_nothing_is_applied(
    overlay: PersistentWorkspace, host: Path
) -> None:
    before = _tree(host)
    _changes(overlay.merged)  # 2 entries (+ the deletion's whiteout and its directory)
    for i in range(50):
        (overlay.merged / f"f{i}").write_text("x")
    with pytest.raises(WorkspaceRefusedError, match="more than 50 entries"):
        overlay.commit()
    assert _tree(host) == before


@pytest.mark.parametrize("overlay", [{"max_entries": 50}], indirect=True)
def test_entries_up_to_the_limit_are_delivered(overlay: PersistentWorkspace, host: Path) -> None:
    for i in range(50):
        (overlay.merged / f"f{i}").write_text(str(i))
    overlay.commit()
    assert sorted(p.name for p in host.glob("f*")) == sorted(f"f{i}" for i in range(50))
    assert MAX_COMMIT_ENTRIES == 20_000  # the default, as documented


def test_a_sparse_file_past_the_cap_is_refused_and_nothing_is_applied(
    overlay: PersistentWorkspace, host: Path
) -> None:
    before = _tree(host)
    _changes(overlay.merged)
    with (overlay.merged / "huge").open("wb") as f:
        f.truncate(1 << 40)  # 1 TiB apparent, no byte of it written
    with pytest.raises(WorkspaceRefusedError, match=f"more than {CAP} bytes"):
        overlay.commit()
    assert _tree(host) == before


def test_a_sparse_file_within_the_cap_is_delivered(
    overlay: PersistentWorkspace, host: Path
) -> None:
    with (overlay.merged / "sparse").open("wb") as f:
        f.seek(CAP // 2)
        f.write(b"end")
    overlay.commit()
    assert (host / "sparse").stat().st_size == CAP // 2 + 3
    assert (host / "sparse").read_bytes().endswith(b"end")


def test_links_and_special_files_are_not_delivered(
    overlay: PersistentWorkspace, host: Path
) -> None:
    merged = overlay.merged
    (merged / "report.txt").symlink_to("/etc/shadow")
    (merged / "kept.txt").unlink()
    (merged / "kept.txt").symlink_to("/etc/shadow")  # a host file replaced by a link
    os.mkfifo(merged / "fifo")
    (merged / "sub").mkdir()
    (merged / "sub" / "passwd").symlink_to("/etc/passwd")
    (merged / "sub" / "real.txt").write_text("real\n")  # control: delivered
    overlay.commit()
    assert not os.path.lexists(host / "report.txt")
    assert not os.path.lexists(host / "fifo")
    assert not os.path.lexists(host / "sub" / "passwd")
    assert (host / "kept.txt").read_text() == "the host's own\n"  # left as it was
    assert not (host / "kept.txt").is_symlink()
    assert (host / "sub" / "real.txt").read_text() == "real\n"


@pytest.fixture
def few_files() -> Iterator[int]:
    """The launcher's open-file limit lowered to 256 descriptors more than it holds
    open now (a test process in a long run already holds some of its own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, held + 256), hard))
    try:
        yield 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_many_linked_files_do_not_exhaust_the_launchers_descriptors(
    overlay: PersistentWorkspace, host: Path, few_files: int
) -> None:
    # The attack: more files with a second name than the launcher may hold open (the
    # copy once kept a descriptor per such file: EMFILE half-way, half applied).
    merged = overlay.merged
    (merged / "a").mkdir()
    (merged / "b").mkdir()
    for i in range(few_files + 50):
        (merged / "a" / str(i)).write_text(str(i))
        os.link(merged / "a" / str(i), merged / "b" / str(i))
    overlay.commit()
    for i in (0, few_files + 49):
        assert (host / "b" / str(i)).read_text() == str(i)
        # Control: the second name is still a link to the first, not a copy.
        assert (host / "a" / str(i)).stat().st_ino == (host / "b" / str(i)).stat().st_ino


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A host directory on a file system of 1 MiB (a tmpfs mounted for the test)."""
    path = tmp_path / "small"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], check=True)
    try:
        (path / "kept.txt").write_text("the host's own\n")
        (path / "gone.txt").write_text("deleted in the sandbox\n")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _small_overlay(small_disk: Path, state_dir: Path) -> PersistentWorkspace:
    return PersistentWorkspace(small_disk, state_dir / f"ws-small-{os.getpid()}", CAP)


def test_a_disk_that_fills_while_delivering_leaves_the_directory_as_it_was(
    small_disk: Path, state_dir: Path
) -> None:
    before = _tree(small_disk)
    ws = _small_overlay(small_disk, state_dir)
    try:
        (ws.merged / "gone.txt").unlink()
        (ws.merged / "kept.txt").write_text("overwritten\n")
        (ws.merged / "d").mkdir()
        for i in range(3):  # 3 MiB: within the workspace cap, past the host's disk
            (ws.merged / "d" / str(i)).write_bytes(os.urandom(1 << 20))
        with pytest.raises(SandboxUnavailableError, match="No space left"):
            ws.commit()
    finally:
        ws.close()
    assert _tree(small_disk) == before  # no file, deletion or stage left half-applied


def test_changes_that_fit_the_disk_are_delivered(small_disk: Path, state_dir: Path) -> None:
    ws = _small_overlay(small_disk, state_dir)
    try:
        (ws.merged / "gone.txt").unlink()
        (ws.merged / "kept.txt").write_text("overwritten\n")
        (ws.merged / "d").mkdir()
        (ws.merged / "d" / "f").write_bytes(b"x" * (256 << 10))
        ws.commit()
    finally:
        ws.close()
    assert sorted(p.name for p in small_disk.iterdir()) == ["d", "kept.txt"]
    assert (small_disk / "kept.txt").read_text() == "overwritten\n"
    assert (small_disk / "d" / "f").stat().st_size == 256 << 10


@pytest.fixture
def cpu_cgroup() -> Iterator[tuple[list[str], Path]]:
    """A fresh cgroup of the CPU controllers, as a sandbox's is (nobody in it yet): the
    files a copy-back joins, and the file that counts its CPU."""
    mode = cgroup_mode()
    dirs = cgroup_dirs(mode, f"test-copyback-{os.getpid()}-{time.monotonic_ns()}")
    made = [controller_dir(mode, dirs, c) for c in ("cpu", "cpuacct")]
    for d in made:
        d.mkdir(parents=True)
    try:
        if mode is CgroupMode.V1:
            yield cpu_join_files(mode, dirs), controller_dir(mode, dirs, "cpuacct")
        else:
            yield cpu_join_files(mode, dirs), made[0]
    finally:
        for d in dict.fromkeys(made):
            d.rmdir()


@pytest.fixture
def roomy(host: Path, state_dir: Path) -> Iterator[PersistentWorkspace]:
    """An overlay with room for thousands of files (each takes a page of its tmpfs)."""
    ws = PersistentWorkspace(host, state_dir / f"ws-roomy-{os.getpid()}", 64 << 20)
    try:
        yield ws
    finally:
        ws.close()


def _cgroup_cpu_s(counter: Path) -> float:
    if (counter / "cpuacct.usage").exists():
        return read_int(counter / "cpuacct.usage") / 1e9
    return read_int(counter / "cpu.stat", "usage_usec") / 1e6


def _many_files(merged: Path, n: int) -> None:
    for d in range(20):
        (merged / f"d{d}").mkdir()
    for i in range(n):
        (merged / f"d{i % 20}" / f"f{i}").write_text("x")


def _commit_measured(overlay: PersistentWorkspace, join: list[str]) -> tuple[float, float]:
    """(the launcher's thread CPU, the copy-back child's whole CPU) of one commit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.thread_time()
    overlay.commit(join)
    own = time.thread_time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return own, child


def test_the_copy_back_runs_in_the_sandboxs_cpu_cgroup(
    roomy: PersistentWorkspace, host: Path, cpu_cgroup: tuple[list[str], Path]
) -> None:
    # The attack: files that cost the control plane CPU to deliver (19,800 once took
    # the launcher 1.12 s of its own, 3.6x the worker's). Now a child joins the
    # sandbox's CPU cgroups first and does the work there.
    join, counter = cpu_cgroup
    _many_files(roomy.merged, 3000)
    own, child = _commit_measured(roomy, join)
    assert len(list(host.glob("d*/f*"))) == 3000
    charged = _cgroup_cpu_s(counter)
    # Nearly all of the child's CPU is the cgroup's (only the interpreter's start
    # precedes the join), and the launcher's own thread did next to nothing.
    assert charged >= 0.7 * child, (charged, child)
    assert own < 0.25 * charged, (own, charged)


def test_a_copy_back_given_no_cgroup_charges_none(
    roomy: PersistentWorkspace, host: Path, cpu_cgroup: tuple[list[str], Path]
) -> None:
    # Control: the same delivery not told to join leaves the cgroup's count at zero,
    # so the count above is the copy-back's, not the cgroup's own.
    _, counter = cpu_cgroup
    _many_files(roomy.merged, 3000)
    _, child = _commit_measured(roomy, [])
    assert len(list(host.glob("d*/f*"))) == 3000
    assert child > 0
    assert _cgroup_cpu_s(counter) == 0


def test_the_copy_back_child_imports_nothing_of_charter() -> None:
    # It runs as `python -I -S FILE`: an import of the package would fail there, or
    # load another tree's code than the launcher's.
    tree = ast.parse(Path(_copyback.__file__).read_text())
    imported = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    ]
    assert "os" in imported  # control: the walk sees the imports
    assert not [m for m in imported if m and m.split(".")[0] == "charter"]


def test_a_copy_back_child_killed_while_staging_leaves_no_stage(
    roomy: PersistentWorkspace, host: Path
) -> None:
    # A copy-back killed half-way (an operator's SIGKILL; on cgroup v2 the sandbox's
    # memory cap) cannot remove its own stage: the launcher removes it, found by the
    # child's pid in its name.
    _many_files(roomy.merged, 5000)
    failed: list[BaseException] = []

    def commit() -> None:
        try:
            roomy.commit()
        except SandboxUnavailableError as e:
            failed.append(e)

    worker = threading.Thread(target=commit)
    worker.start()
    deadline = time.monotonic() + 30
    stage = None
    while stage is None and time.monotonic() < deadline and worker.is_alive():
        stage = next((p for p in host.iterdir() if p.name.startswith(".charter-stage-")), None)
    assert stage is not None, "the stage was never seen"
    os.kill(int(stage.name.split("-")[2]), signal.SIGKILL)  # .charter-stage-PID-HEX
    worker.join(30)
    assert failed, "the killed copy-back was not reported"
    assert "exit -9" in str(failed[0])
    assert not [p for p in host.iterdir() if p.name.startswith(".charter-stage-")]
    assert (host / "kept.txt").read_text() == "the host's own\n"  # staging changes nothing
