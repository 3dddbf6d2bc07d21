"""The decoy egress destination, caught where Charter sees it: the egress broker's
attempts, sampled live (``sample_signals``) and matched against the sandbox's canaries;
beside a granted destination that is reached and is no canary."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import EgressBroker, EgressGrant, MemorySink, WarmPool, sample_signals
from charter.supervision import CanaryTouch, QuarantineVerdict, canaries_for, touched
from tests.sandbox._egress_support import Server

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=30s,cpu=30s,mem=64MiB,egress=1MB")

# CONNECT to each argv target in turn through the broker; print each status.
CLIENT = r"""
import os, socket, sys
for target in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data and (chunk := s.recv(4096)):
        data += chunk
    status = data.split(b" ")[1].decode() if data else "none"
    if status == "200":
        s.sendall(b"go\n")
        while s.recv(65536):
            pass
    s.close()
    print(status, flush=True)
"""


@pytest.fixture
def pool(scratch: Path, state_dir: Path) -> Iterator[tuple[WarmPool, EgressBroker]]:
    template = scratch / "template"
    template.mkdir(mode=0o755)
    with EgressBroker(state_dir / "egress-canary.sock") as broker, WarmPool(
        template, B, capacity=1, sink=MemorySink(), state_dir=state_dir, egress=broker,
        parked=0,
    ) as p:  # fmt: skip
        yield p, broker


def test_an_attempt_on_the_decoy_destination_is_a_quarantine(
    pool: tuple[WarmPool, EgressBroker],
) -> None:
    warm, broker = pool
    server = Server()
    try:
        granted = f"127.0.0.1:{server.port}"
        slot = warm.lease(grant=EgressGrant(destinations=(granted,)))
        try:
            canaries = canaries_for(slot.sandbox_id, secrets.token_bytes(16))
            outcome = slot.run(
                ["/usr/bin/python3", "-I", "-c", CLIENT, granted, canaries.egress_destination]
            )
            assert (outcome.stdout or b"").decode().split() == ["200", "403"]
            signals = sample_signals(slot.spec, egress=broker)
            assert (signals.egress_attempts, signals.egress_refusals) == (2, 1)
            attempts = broker.attempts(slot.spec.host_uid)
            verdicts = [
                touched(
                    canaries,
                    CanaryTouch(
                        sandbox_id=slot.sandbox_id,
                        kind="egress_destination",
                        value=a.destination,
                        at_ms=0,
                    ),
                    lineage="w",
                    task_class="review",
                    policy_version=1,
                )
                for a in attempts
            ]
            by_dest = dict(zip((a.destination for a in attempts), verdicts, strict=True))
            # The granted destination was reached and is no canary (the control).
            assert by_dest[granted] is None
            hit = by_dest[canaries.egress_destination]
            assert isinstance(hit, QuarantineVerdict)
            assert hit.evidence[0].canary == f"egress_destination:{canaries.egress_destination}"
        finally:
            warm.release(slot, refill=False)
    finally:
        server.close()
