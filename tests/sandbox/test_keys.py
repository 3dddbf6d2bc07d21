"""The key broker: keys stay in the parent, handles are opaque and bound to a host uid,
signatures are domain-separated, keys are wiped on release."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from charter.core import Budget
from charter.sandbox import (
    KeyBroker,
    KeyHandleError,
    KeySeedError,
    SignatureTagError,
    WarmPool,
    framed,
    verify_signature,
)

from ._brokers import HERE

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=0MB")


def test_sign_verify_and_domain_separation() -> None:
    with KeyBroker() as broker:
        seed = bytearray(secrets.token_bytes(32))
        handle = broker.issue(seed)
        assert seed == bytearray(32)  # the caller's copy is wiped once taken
        pk = broker.public_key(handle)
        sig = broker.sign(handle, "worker/report", b"hello")
        assert verify_signature(pk, "worker/report", b"hello", sig)
        # The same bytes under another tag, or as a bare Ed25519 message, do not verify.
        assert not verify_signature(pk, "worker/other", b"hello", sig)
        with pytest.raises(BadSignatureError):
            VerifyKey(pk).verify(b"hello", sig)
        # Length prefixes: moving bytes between tag and message changes the signed bytes.
        assert framed("ab", b"c") != framed("a", b"bc")
        with pytest.raises(SignatureTagError):
            broker.sign(handle, "Not A Tag!", b"x")


def test_release_wipes_the_key_and_kills_the_handle() -> None:
    broker = KeyBroker()
    handle = broker.issue(bytearray(secrets.token_bytes(32)))
    key = broker._keys[handle]  # the broker's own buffer, inspected from outside
    assert any(key.secret)  # control: a live key is not all zeros
    broker.release(handle)
    assert key.secret == bytearray(64)
    with pytest.raises(KeyHandleError):
        broker.sign(handle, "worker/report", b"x")
    with pytest.raises(KeySeedError):
        broker.issue(bytearray(31))


SIGN = """
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["CHARTER_KEY_SOCKET"])
s.sendall(json.dumps({"handle": sys.argv[1], "tag": "worker/report",
                      "message_hex": b"result".hex()}).encode() + b"\\n")
print(s.makefile().readline().strip())
"""


@pytest.fixture
def keyed_pool(scratch: Path, state_dir: Path) -> Iterator[tuple[WarmPool, KeyBroker]]:
    template = scratch / "t"
    template.mkdir(mode=0o755)
    with (
        KeyBroker(state_dir / "keys.sock") as keys,
        WarmPool(template, B, capacity=2, keys=keys, state_dir=state_dir) as pool,
    ):
        yield pool, keys


@pytest.mark.sandbox
def test_a_sandbox_signs_only_with_its_own_handle(keyed_pool: tuple[WarmPool, KeyBroker]) -> None:
    import json

    pool, keys = keyed_pool
    mine, other = pool.lease(), pool.lease()
    handle = keys.issue(bytearray(secrets.token_bytes(32)), sandbox_id=mine.sandbox_id)
    # The other sandbox holds a handle of its own, so the broker admits its connection.
    theirs = keys.issue(bytearray(secrets.token_bytes(32)), sandbox_id=other.sandbox_id)
    try:
        # The attack: another sandbox presents the handle.
        stolen = json.loads(
            other.run(["/usr/bin/python3", "-I", "-c", SIGN, handle]).stdout or b"{}"
        )
        assert stolen == {"error": "this key handle was issued to another sandbox"}
        # Control: the sandbox it was issued to gets a signature that verifies.
        ok = json.loads(mine.run(["/usr/bin/python3", "-I", "-c", SIGN, handle]).stdout or b"{}")
        sig = bytes.fromhex(ok["signature_hex"])
        assert verify_signature(keys.public_key(handle), "worker/report", b"result", sig)
    finally:
        keys.release(handle)
        keys.release(theirs)
        pool.release(mine, refill=False)
        pool.release(other, refill=False)


def test_a_peer_that_never_finishes_its_request_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import socket
    import time

    from charter.sandbox import keys as keys_module

    monkeypatch.setattr(keys_module, "_REQUEST_TIMEOUT", 0.2)
    with KeyBroker(tmp_path / "keys.sock") as broker:
        assert broker.path is not None
        # This process's uid holds a handle: only such peers are admitted at all.
        broker.register(os.getuid(), "sbx-here", cgroup=HERE)
        broker.issue(bytearray(secrets.token_bytes(32)), sandbox_id="sbx-here")
        with socket.socket(socket.AF_UNIX) as silent:
            silent.connect(str(broker.path))
            silent.settimeout(5)
            start = time.monotonic()
            silent.sendall(b'{"handle": ')  # and nothing more, never a newline
            assert silent.recv(1) == b""  # the broker hung up instead of waiting forever
            assert time.monotonic() - start < 5
        # Control: a peer that sends its line gets an answer on the same broker.
        with socket.socket(socket.AF_UNIX) as peer:
            peer.connect(str(broker.path))
            peer.settimeout(5)
            peer.sendall(b'{"handle": "kh_none", "tag": "worker/report", "message_hex": ""}\n')
            assert b"unknown or released key handle" in peer.recv(4096)


def test_a_bad_tag_over_the_socket_is_answered(tmp_path: Path) -> None:
    """A tag the broker refuses is an error reply to the peer, not a dead thread and a
    silent hang-up."""
    import json
    import os
    import socket

    with KeyBroker(tmp_path / "keys.sock") as broker:
        assert broker.path is not None
        broker.register(os.getuid(), "sbx-here", cgroup=HERE)
        handle = broker.issue(bytearray(secrets.token_bytes(32)), sandbox_id="sbx-here")

        def ask(tag: str) -> dict[str, str]:
            with socket.socket(socket.AF_UNIX) as peer:
                peer.connect(str(broker.path))
                peer.settimeout(5)
                request = {"handle": handle, "tag": tag, "message_hex": b"m".hex()}
                peer.sendall(json.dumps(request).encode() + b"\n")
                reply: dict[str, str] = json.loads(peer.makefile().readline() or "{}")
                return reply

        assert "must match" in ask("Not A Tag!")["error"]
        # Control: a well-formed tag is signed over the same socket.
        sig = bytes.fromhex(ask("worker/report")["signature_hex"])
        assert verify_signature(broker.public_key(handle), "worker/report", b"m", sig)
