"""Brokers know a sandbox by its host uid *and* its cgroup, and key handles belong to the
sandbox they were issued to, not to its host uid: a host process running as a live
sandbox's uid is refused by both brokers, and a handle dies with its sandbox's slot."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import charter.sandbox._host as host_module
from charter.core import Budget
from charter.sandbox import (
    FIRST_SANDBOX_UID,
    EgressBroker,
    EgressGrant,
    KeyBroker,
    KeyHandleError,
    MemorySink,
    WarmPool,
    verify_signature,
)

from ._brokers import HERE, Appended
from ._egress_support import CLIENT, PAYLOAD, Server
from ._support import PY

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=10MB")

# Ask the key broker at argv[1] to sign with each handle in argv[2:]; print each reply.
SIGN = """
import json, socket, sys
for handle in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(sys.argv[1])
    try:  # a peer refused on accept may be closed on before its request is sent
        s.sendall(json.dumps({"handle": handle, "tag": "worker/report",
                              "message_hex": b"result".hex()}).encode() + b"\\n")
    except OSError:
        pass
    print(s.makefile().readline().strip() or "{}")
"""

KEYS_IN_SANDBOX = "/run/charter/keys.sock"


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def _as_uid(uid: int, code: str, *args: str) -> str:
    """Run ``code`` on the host as ``uid`` (``setpriv --reuid``): outside any sandbox
    cgroup, in this test process's cgroup."""
    r = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
         PY, "-I", "-c", code, *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return r.stdout + r.stderr


def test_a_host_process_with_the_sandbox_uid_is_refused_by_both_brokers(
    state_dir: Path, scratch: Path, sink: MemorySink, server: Server
) -> None:
    template = scratch / "t"
    template.mkdir(mode=0o755)
    target = f"127.0.0.1:{server.port}"
    grant = EgressGrant(destinations=(target,))
    with (
        EgressBroker(state_dir / "egress-id.sock") as egress,
        KeyBroker(state_dir / "keys-id.sock") as keys,
        WarmPool(
            template, B, 1, sink=sink, egress=egress, keys=keys, state_dir=state_dir
        ) as pool,  # fmt: skip
    ):
        assert keys.path is not None
        slot = pool.lease(grant)
        uid = slot.host_uid
        handle = keys.issue(bytearray(secrets.token_bytes(32)), sandbox_id=slot.sandbox_id)
        # The attack: a host process with the live sandbox's uid asks both brokers.
        to_egress = CLIENT.replace('os.environ["CHARTER_EGRESS_SOCKET"]', repr(str(egress.path)))
        assert _as_uid(uid, to_egress, target).split() == ["403", "0"]
        assert (uid, "outside") in egress.unknown_attempts
        assert json.loads(_as_uid(uid, SIGN, str(keys.path), handle)) == {
            "error": "not the sandbox"
        }
        assert server.accepted == 0
        # Control: the sandbox itself, same uid, is served by both.
        sandbox_egress = slot.run([PY, "-I", "-c", CLIENT, target])
        assert (sandbox_egress.stdout or b"").split() == [b"200", str(PAYLOAD).encode()]
        pool.release(slot, refill=False)
        assert server.accepted == 1
        slot = pool.lease(grant)
        handle = keys.issue(bytearray(secrets.token_bytes(32)), sandbox_id=slot.sandbox_id)
        o = slot.run([PY, "-I", "-c", SIGN, KEYS_IN_SANDBOX, handle])
        signed = json.loads(o.stdout or b"{}")
        sig = bytes.fromhex(signed["signature_hex"])
        assert verify_signature(keys.public_key(handle), "worker/report", b"result", sig)
        uid = slot.host_uid
        pool.release(slot, refill=False)
        # Control: the cgroup check is all that stopped the host process. Registered
        # with the cgroup it runs in, the same process is served by both brokers.
        egress.register(uid, "sbx-host", grant, byte_cap=10 * PAYLOAD, cgroup=HERE,
                        journal=Appended())  # fmt: skip
        keys.register(uid, "sbx-host", cgroup=HERE)
        handle = keys.issue(bytearray(secrets.token_bytes(32)), sandbox_id="sbx-host")
        try:
            assert _as_uid(uid, to_egress, target).split() == ["200", str(PAYLOAD)]
            assert "signature_hex" in json.loads(_as_uid(uid, SIGN, str(keys.path), handle))
        finally:
            egress.unregister(uid)
            keys.unregister(uid)


def test_a_key_handle_dies_with_its_sandbox(
    state_dir: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = scratch / "t"
    template.mkdir(mode=0o755)
    with (
        KeyBroker(state_dir / "keys-slot.sock") as keys,
        WarmPool(template, B, 1, keys=keys, state_dir=state_dir) as pool,
    ):
        first = pool.lease()
        uid = first.host_uid
        old = keys.issue(bytearray(secrets.token_bytes(32)), sandbox_id=first.sandbox_id)
        public = keys.public_key(old)
        # Control: while its sandbox lives, the handle signs for it.
        reply = json.loads(first.run([PY, "-I", "-c", SIGN, KEYS_IN_SANDBOX, old]).stdout or b"{}")
        sig = bytes.fromhex(reply["signature_hex"])
        assert verify_signature(public, "worker/report", b"result", sig)
        pool.release(first, refill=False)
        # The slot is discarded: its key is wiped and the handle is dead.
        with pytest.raises(KeyHandleError):
            keys.public_key(old)
        # The attack: the next sandbox is given the same host uid (the uid allocator's
        # cursor is pointed at it) and presents the old handle.
        monkeypatch.setattr(host_module, "_cursor", uid - FIRST_SANDBOX_UID)
        second = pool.lease()
        assert second.host_uid == uid
        own = keys.issue(bytearray(secrets.token_bytes(32)), sandbox_id=second.sandbox_id)
        o = second.run([PY, "-I", "-c", SIGN, KEYS_IN_SANDBOX, old, own])
        stolen, mine = (json.loads(line) for line in (o.stdout or b"").splitlines())
        assert stolen == {"error": "unknown or released key handle"}
        # Control: the same sandbox is served with its own handle.
        sig = bytes.fromhex(mine["signature_hex"])
        assert verify_signature(keys.public_key(own), "worker/report", b"result", sig)
        pool.release(second, refill=False)
        # A handle for a sandbox that is gone cannot even be issued.
        with pytest.raises(KeyHandleError, match="not registered"):
            keys.issue(bytearray(secrets.token_bytes(32)), sandbox_id=second.sandbox_id)
