"""Applying a sandbox's changes to its persistent workspace is bounded and delivers only
directories and regular files: a tree too deep, too many entries or files too big (a
sparse file at its apparent size) are refused with the host directory unchanged;
symlinks and special files are never delivered. The sandbox is stood in for by writes
into the overlay's merged view (where its writes land)."""

from __future__ import annotations

import os
import resource
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.sandbox._workspace import MAX_COMMIT_DEPTH, MAX_COMMIT_ENTRIES, PersistentWorkspace
from charter.sandbox.errors import SandboxUnavailableError, WorkspaceRefusedError

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
    """The launcher's open-file limit lowered to 256 (a common default is 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
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
