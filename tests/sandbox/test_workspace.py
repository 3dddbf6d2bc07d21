"""Attacks through the workspace: a symlink planted for the next sandbox, a setuid file
left for host users, writes past the cap. Each beside a positive control."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from charter.core import Budget, RefusedError
from charter.sandbox import (
    Launcher,
    MemorySink,
    SandboxDiscarded,
    SandboxLeased,
    WorkspaceRefused,
    WorkspaceRefusedError,
)
from charter.sandbox._workspace import PersistentWorkspace
from charter.sandbox.spec import workspace_cap

from ._support import PY, out, sandboxed

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=128MiB,egress=0MB")
NOBODY = 65534

READ = """
import sys
for p in sys.argv[1:]:
    try:
        print(p, open(p).read().strip())
    except OSError as e:
        print(p, "errno", e.errno)
"""


def _sh(launcher: Launcher, script: str, **kw: object) -> tuple[int, str]:
    o = launcher.run(
        B, ["/bin/sh", "-c", script], capture=True, stdin=subprocess.DEVNULL,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return o.exit_code, out(o) + (o.stderr or b"").decode()


@pytest.fixture
def shared(scratch: Path) -> Path:
    """A persistent workspace every sandbox uid can write (as an operator might give)."""
    ws = scratch / "shared"
    ws.mkdir()
    ws.chmod(0o777)
    return ws


@pytest.fixture
def host_dir(scratch: Path) -> Path:
    """A host directory no sandbox is given, holding a world-readable file."""
    d = scratch / "host-only"
    d.mkdir(mode=0o755)
    (d / "note").write_text("host data\n")
    (d / "note").chmod(0o644)
    (d / "sub").mkdir(mode=0o755)
    return d


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_planted_symlink_is_never_followed_to_the_next_workspace(
    launcher: Launcher, sink: MemorySink, shared: Path, host_dir: Path, where: str
) -> None:
    # The first sandbox plants a link in its workspace, for the next one's path: its
    # links are not delivered any more, so a host user (any local user with a shared
    # directory) plants it instead, and the next sandbox's path must still refuse it.
    code, _ = _sh(launcher, f"ln -s {host_dir} /workspace/next", workspace=shared)
    assert code == 0
    assert not os.path.lexists(shared / "next")
    (shared / "next").symlink_to(host_dir)
    target = shared / "next" if where == "last" else shared / "next" / "sub"
    leased = sum(isinstance(e, SandboxLeased) for e in sink.events)
    with pytest.raises(WorkspaceRefusedError) as refused:
        sandboxed(launcher, B, READ, "/workspace/note", workspace=target)
    assert isinstance(refused.value, RefusedError)  # exit 4 at the CLI
    assert refused.value.reason == "workspace-unsafe"
    assert sum(isinstance(e, SandboxLeased) for e in sink.events) == leased  # nothing ran
    # Positive control: the path the link leads to, given as is, is bound and readable
    # (what following the link handed the next sandbox).
    o = sandboxed(launcher, B, READ, "/workspace/note", workspace=target.resolve().parent
                  if where == "middle" else target.resolve())  # fmt: skip
    assert out(o).split()[1:] == ["host", "data"]


def test_a_real_directory_is_a_workspace(launcher: Launcher, shared: Path) -> None:
    (shared / "in").mkdir(mode=0o777)
    (shared / "in" / "f").write_text("given\n")
    (shared / "in" / "f").chmod(0o644)
    o = sandboxed(launcher, B, READ, "/workspace/f", workspace=shared / "in")
    assert out(o).split()[1:] == ["given"]


def test_a_workspace_path_swapped_after_it_is_opened_changes_nothing(
    launcher: Launcher, shared: Path, host_dir: Path, state_dir: Path
) -> None:
    """The overlay's lower layer is the directory opened at the start, by descriptor:
    renaming it away and putting a link in its place (what a concurrent sandbox could
    do) neither shows the link's target nor sends the commit there."""
    ws = shared / "ws"
    ws.mkdir(mode=0o777)
    (ws / "mine").write_text("mine\n")
    (ws / "mine").chmod(0o644)
    overlay = PersistentWorkspace(ws, state_dir / "ws-swap-test", 1 << 20)
    try:
        ws.rename(shared / "moved")
        ws.symlink_to(host_dir)
        assert sorted(os.listdir(overlay.merged)) == ["mine"]
        (overlay.merged / "new").write_text("new\n")
        overlay.commit()
    finally:
        overlay.close()
    assert (shared / "moved" / "new").read_text() == "new\n"
    assert not (host_dir / "new").exists()
    assert not (state_dir / "ws-swap-test").exists()


def _setid_files(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            st = os.lstat(Path(dirpath) / name)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(f"{dirpath}/{name}")
    return found


WHOAMI = "import os; print(os.geteuid())"


def test_no_setuid_file_survives_in_a_persistent_workspace(
    launcher: Launcher, sink: MemorySink, shared: Path
) -> None:
    script = (
        f"cp {PY} /workspace/py && chmod 6755 /workspace/py && "
        "mkdir -p /workspace/d/e && chmod 2777 /workspace/d && "
        f"cp {PY} /workspace/d/e/py2 && chmod 4755 /workspace/d/e/py2 && "
        "ln -s /usr/bin/passwd /workspace/link && "
        "stat -c %a /workspace/py /workspace/d /workspace/d/e/py2"
    )
    code, text = _sh(launcher, script, workspace=shared)
    # Positive control: inside, the bits were set on files the sandbox owns.
    assert code == 0, text
    assert text.split()[:3] == ["6755", "2777", "4755"]
    uid = next(e.host_uid for e in sink.events if isinstance(e, SandboxLeased))
    assert (shared / "py").stat().st_uid == uid
    # After the run nothing there is setuid or setgid ...
    assert _setid_files(shared) == []
    assert not os.path.lexists(shared / "link")  # ... no link is delivered (none followed)
    assert Path("/usr/bin/passwd").stat().st_mode & stat.S_ISUID
    # ... so a host user running the copies stays themselves.
    for path in (shared / "py", shared / "d" / "e" / "py2"):
        r = subprocess.run(
            [str(path), "-I", "-c", WHOAMI], user=NOBODY, group=NOBODY, extra_groups=[],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert r.stdout.strip() == str(NOBODY), r.stderr


def test_a_surviving_setuid_file_would_run_as_the_sandbox_uid(
    launcher: Launcher, sink: MemorySink, shared: Path
) -> None:
    """Positive control of the attack: the host mount honours setuid, so a file like the
    one a sandbox made, had its bit survived, runs as the sandbox's host uid."""
    code, text = _sh(launcher, f"cp {PY} /workspace/py", workspace=shared)
    assert code == 0, text
    uid = next(e.host_uid for e in sink.events if isinstance(e, SandboxLeased))
    # A copy in a root-owned directory: chown as root, then the bit (as the sandbox did).
    kept = shared.parent / "kept"
    kept.mkdir(mode=0o755)
    shutil.copy(shared / "py", kept / "py")
    os.chown(kept / "py", uid, uid)
    (kept / "py").chmod(0o4755)
    r = subprocess.run(
        [str(kept / "py"), "-I", "-c", WHOAMI], user=NOBODY, group=NOBODY, extra_groups=[],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert r.stdout.strip() == str(uid), r.stderr


FILL = "dd if=/dev/zero of=/workspace/big bs=1M count={mib} 2>&1; stat -f -c %T /workspace"


def test_the_private_workspace_is_capped_and_never_on_the_host_disk(launcher: Launcher) -> None:
    cap = workspace_cap(B)
    code, text = _sh(launcher, FILL.format(mib=cap // 2**20 + 8))
    assert code == 0, text
    assert "No space left on device" in text  # ENOSPC inside, at the cap
    assert text.split()[-1] == "tmpfs"  # the bytes are in memory (charged to its cgroup)


def test_a_persistent_workspace_is_capped_on_the_host_disk(
    launcher: Launcher, shared: Path
) -> None:
    cap = workspace_cap(B)
    _, text = _sh(launcher, FILL.format(mib=cap // 2**20 + 8), workspace=shared)
    assert "No space left on device" in text, text  # ENOSPC inside, at the cap
    assert text.split()[-1] == "overlayfs"
    written = (shared / "big").stat().st_size
    assert 0 < written <= cap  # what reached the host disk stays within the cap
    # A file of any apparent size costs the tmpfs nothing, but it counts at that size:
    # refused whole, nothing of the run delivered (test_workspace_commit.py has more).
    with pytest.raises(WorkspaceRefusedError, match="bytes in all"):
        _sh(launcher, "echo y > /workspace/also && truncate -s 100G /workspace/sparse",
            workspace=shared)  # fmt: skip
    assert not (shared / "sparse").exists()
    assert not (shared / "also").exists()
    # Within the cap, holes stay holes on the disk.
    code, text = _sh(launcher, "truncate -s 1M /workspace/sparse && echo x >> /workspace/sparse",
                     workspace=shared)  # fmt: skip
    assert code == 0, text
    sparse = (shared / "sparse").stat()
    assert sparse.st_size == 2**20 + 2
    assert sparse.st_blocks * 512 < 2**20  # not a MiB of zeros on the disk
    # Nor do hard links: a thousand names of one 1 MiB file are one file on the disk.
    links = "dd if=/dev/urandom of=/workspace/one bs=1M count=1 2>/dev/null && mkdir /workspace/l"
    links += " && for i in $(seq 1000); do ln /workspace/one /workspace/l/$i; done"
    code, text = _sh(launcher, links, workspace=shared)
    assert code == 0, text
    one = (shared / "one").stat()
    assert one.st_nlink == 1001
    assert (shared / "l" / "999").stat().st_ino == one.st_ino
    # Positive control: the directory's own disk takes more than the cap.
    dd = ["dd", "if=/dev/zero", f"of={shared}/big2", "bs=1M", f"count={cap // 2**20 + 8}"]
    subprocess.run(dd, check=True, capture_output=True, timeout=60)
    assert (shared / "big2").stat().st_size > cap


CHANGES = """
set -e
cd /workspace
echo new > created
echo changed > kept
rm gone
rm -r gone_dir
rm -r replaced && echo file > replaced
mkdir -p deep/er && echo deep > deep/er/f
ln -s /etc/passwd link
mv renamed_from renamed_to
ls -A
"""


def test_a_persistent_workspace_keeps_what_the_sandbox_did(
    launcher: Launcher, shared: Path
) -> None:
    (shared / "kept").write_text("old\n")
    (shared / "gone").write_text("x\n")
    (shared / "gone_dir" / "sub").mkdir(parents=True)
    (shared / "gone_dir" / "sub" / "f").write_text("x\n")
    (shared / "replaced").mkdir()
    (shared / "replaced" / "f").write_text("x\n")
    (shared / "renamed_from").write_text("moved\n")
    for path in [shared, *shared.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o666)
    code, text = _sh(launcher, CHANGES, workspace=shared)
    assert code == 0, text
    inside = sorted(text.split())
    assert "link" in inside
    # The host sees what it saw, but for the link: links are not delivered.
    assert sorted(p.name for p in shared.iterdir()) == [n for n in inside if n != "link"]
    assert (shared / "created").read_text() == "new\n"
    assert (shared / "kept").read_text() == "changed\n"
    assert (shared / "replaced").read_text() == "file\n"
    assert (shared / "deep" / "er" / "f").read_text() == "deep\n"
    assert (shared / "renamed_to").read_text() == "moved\n"
    assert not os.path.lexists(shared / "link")  # not delivered, so never followed
    assert not (shared / "gone").exists()
    assert not (shared / "gone_dir").exists()
    assert not list(shared.glob(".charter-commit-*"))


MAKE_FILES = """
import os, sys
for d in range(20):
    os.mkdir(f"/workspace/d{d}")
for i in range(int(sys.argv[1])):
    open(f"/workspace/d{i % 20}/f{i}", "w").write("x")
"""


def _run_measured(launcher: Launcher, workspace: Path | None) -> tuple[int, float]:
    """(the sandbox's journaled CPU in ms, the launcher's own thread CPU in s) of one
    run making 4,000 files in its workspace."""
    start = time.thread_time()
    o = launcher.run(B, [PY, "-I", "-c", MAKE_FILES, "4000"], workspace=workspace)
    own = time.thread_time() - start
    assert o.exit_code == 0
    return o.usage.cpu_ms, own


def test_a_workspaces_copy_back_is_charged_to_the_sandbox_not_the_launcher(
    launcher: Launcher, shared: Path
) -> None:
    # The attack: files that are cheap for the sandbox to make and dear for the
    # launcher to deliver (19,800 cost it 1.12 s, 3.6x the worker's 0.31 s, outside
    # the sandbox's cgroup). The control: the same run in a private workspace, with
    # nothing to deliver, measured in the same way.
    private_ms, private_own = _run_measured(launcher, None)
    persistent_ms, persistent_own = _run_measured(launcher, shared)
    assert len(list(shared.glob("d*/f*"))) == 4000  # delivered
    in_sandbox_ms = persistent_ms - private_ms  # the copy-back, in the journaled usage
    launcher_ms = (persistent_own - private_own) * 1000
    # Before the copy-back ran in the sandbox's CPU cgroups, the launcher's side was
    # about 4x the sandbox's difference; now the sandbox's is several times the
    # launcher's (its tmpfs unmount and spawning the child).
    assert in_sandbox_ms > 100, (in_sandbox_ms, launcher_ms)
    assert launcher_ms < in_sandbox_ms / 3, (in_sandbox_ms, launcher_ms)


def test_a_refused_copy_back_is_journaled_with_the_sandboxs_end(
    launcher: Launcher, sink: MemorySink, shared: Path
) -> None:
    # The attack: a file of 100 GB apparent size (free in the tmpfs) next to an
    # ordinary change. Refused whole, on record, the directory as it was.
    (shared / "kept").write_text("the host's own\n")
    (shared / "kept").chmod(0o666)
    with pytest.raises(WorkspaceRefusedError, match="bytes in all") as refused:
        _sh(launcher, "echo new > /workspace/kept && truncate -s 100G /workspace/sparse",
            workspace=shared)  # fmt: skip
    assert refused.value.reason == "workspace-unsafe"
    assert sorted(p.name for p in shared.iterdir()) == ["kept"]
    assert (shared / "kept").read_text() == "the host's own\n"
    names = [type(e).__name__ for e in sink.events]
    assert names[-3:] == ["SandboxExited", "WorkspaceRefused", "SandboxDiscarded"], names
    event = sink.events[-2]
    assert isinstance(event, WorkspaceRefused)
    assert event.sandbox_id == sink.events[-1].sandbox_id  # type: ignore[attr-defined]
    assert "bytes in all" in event.reason
    # Control: a run within the limits is delivered and journals no refusal.
    sink.events.clear()
    code, text = _sh(launcher, "echo new > /workspace/kept", workspace=shared)
    assert code == 0, text
    assert (shared / "kept").read_text() == "new\n"
    assert not [e for e in sink.events if isinstance(e, WorkspaceRefused)]
    assert isinstance(sink.events[-1], SandboxDiscarded)
