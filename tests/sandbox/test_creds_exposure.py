"""A sandbox whose requests carried every kind of held credential never holds one: its
environment, every file it can read and its memory are searched from the host, while it
is still alive after the requests, for the credentials' bytes (in every process of the
sandbox: bwrap, its init and the worker). Canaries the worker made
itself (in its memory and a file) and a variable of its environment are the positive
control: the same search finds them."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import secrets
import signal
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from charter.sandbox import Outcome

from ._creds_support import FETCH
from ._support import PY
from .test_creds import API_KEY, TOKEN, B, World, world  # noqa: F401 (the fixture)

pytestmark = pytest.mark.sandbox

# FETCH, then canaries, then wait (bounded) for SIGUSR1: the host has looked. (The host
# cannot create a file in the sandbox's /tmp for it: its uid 0 is not mapped there.)
WORKER = (
    FETCH.replace("for t in sys.argv[1:]:", "for t in sys.argv[2:]:")
    + r"""
import signal, time
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))  # the host has looked
canary = ("CAN" + "ARY-") + sys.argv[1][::-1]   # made here: argv holds it reversed
keep = [canary.encode() * 4]
with open("/tmp/canary-file", "w") as f:
    f.write(canary)
open("/tmp/ready", "w").close()
deadline = time.monotonic() + 25
while time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(3)
"""
)


def _pid_with(marker: str, deadline: float) -> int:
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in argv and argv[0].endswith(b"python3"):
                return int(entry)
        time.sleep(0.02)
    raise AssertionError("the worker never started")


def _wait_for(path: Path, deadline: float) -> None:
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _memory(pid: int) -> bytes:
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, OverflowError, ValueError):
                continue  # [vvar] and the like
    return b"".join(chunks)


def _same_uid(pid: int) -> list[int]:
    """Every process of the sandbox's host uid (bwrap, its init, the worker)."""

    def uid(p: str) -> int | None:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("Uid:"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None

    mine = uid(str(pid))
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and uid(p) == mine]


def _files(root: Path) -> tuple[bytes, list[str]]:
    """Every regular file the sandbox can see (but the host's read-only /usr, which
    nothing of Charter's writes into, and the kernel's /proc and /sys), concatenated."""
    blobs, names = [], []
    for top in sorted(os.listdir(root)):
        if top in ("usr", "proc", "sys") or (root / top).is_symlink():  # /bin -> usr/bin
            continue
        for dirpath, _dirs, files in os.walk(root / top):
            for name in files:
                path = Path(dirpath) / name
                try:
                    if path.is_symlink() or not path.is_file():
                        continue
                    blobs.append(path.read_bytes()[: 16 << 20])
                    names.append(str(path.relative_to(root)))
                except OSError:
                    continue
    return b"\0".join(blobs), names


def _needles(w: World, tokens: list[str]) -> dict[str, bytes]:
    cert = x509.load_pem_x509_certificate(w.client_cert)
    key = serialization.load_pem_private_key(w.client_key, password=None)
    key_der = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    body = b"".join(w.client_key.split(b"\n")[1:-2])  # the PEM's base64, one line
    found = {
        "bearer token": TOKEN.encode(),
        "api key": API_KEY.encode(),
        "client certificate (DER)": cert.public_bytes(serialization.Encoding.DER),
        "client certificate (PEM line)": w.client_cert.split(b"\n")[2],
        "client key (DER)": key_der,
        "client key (PEM base64)": body[:48],
        "client key (base64 of DER)": base64.b64encode(key_der)[:48],
    }
    for i, token in enumerate(tokens):
        found[f"identity token {i}"] = token.encode()
        found[f"identity token {i} signature"] = token.rsplit(".", 1)[1].encode()
    return found


def test_the_sandbox_never_holds_a_credential(world: World) -> None:  # noqa: F811
    marker = secrets.token_hex(12)
    canary = ("CANARY-" + marker[::-1]).encode()
    targets = [f"http://api.test:{world.api.port}/", f"http://mtls.test:{world.mtls.port}/",
               f"http://id.test:{world.ident.port}/"]  # fmt: skip
    grant = world.grant("api-token", "api-key", "client", "ident")
    result: list[Outcome] = []
    runner = threading.Thread(target=lambda: result.append(world.launcher.run(
        B, [PY, "-I", "-c", WORKER, marker, *targets], capture=True, grant=grant,
    )), daemon=True)  # fmt: skip
    runner.start()
    deadline = time.monotonic() + 60
    pid = _pid_with(marker, deadline)
    root = Path(f"/proc/{pid}/root")
    _wait_for(root / "tmp" / "ready", deadline)
    # The requests went out with the credentials (the servers saw them)...
    assert [s.headers["authorization"] for s in world.api.seen] == [f"Bearer {TOKEN}"]
    assert [s.headers["x-api-key"] for s in world.api.seen] == [API_KEY]
    assert [s.client_cn for s in world.mtls.seen] == ["charter-client"]
    tokens = [s.headers["authorization"].split()[1] for s in world.ident.seen]
    assert len(tokens) == 1
    try:
        everyone = _same_uid(pid)
        assert pid in everyone
        assert len(everyone) >= 3  # bwrap, its init and the worker
        environ = b"\0".join(Path(f"/proc/{p}/environ").read_bytes() for p in everyone)
        memory = b"".join(_memory(p) for p in everyone)
        files, names = _files(root)
        # Positive controls: the search sees the worker's own memory, files, environment.
        assert canary in memory
        assert canary in files
        assert "tmp/canary-file" in names
        assert b"CHARTER_EGRESS_SOCKET=" in environ
        assert len(memory) > 1 << 20
        for what, needle in _needles(world, tokens).items():
            assert needle not in environ, what
            assert needle not in files, what
            assert needle not in memory, what
        # Nor is a credential in the worker's /proc view of itself (cmdline, maps...).
        assert not re.search(re.escape(TOKEN.encode()), Path(f"/proc/{pid}/cmdline").read_bytes())
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have given up waiting
            os.kill(pid, signal.SIGUSR1)
        runner.join(60)
    [outcome] = result
    assert outcome.exit_code == 0, outcome.stderr
    lines = (outcome.stdout or b"").decode().splitlines()
    assert [ln.split()[0] for ln in lines] == ["200"] * 3
