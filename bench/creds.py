"""Held-credential injection per connection, against the plain broker path, same run.

One loopback TLS server (its CA made here with ``cryptography``; a client certificate
required on a second port) and one egress broker holding a bearer token, a client
certificate and an identity secret. Per connection, interleaved in one loop, a host
process registered with the broker as a sandbox (same uid and cgroup check) does:

* ``direct``: TLS straight to the server and one GET (the raw ``ssl`` library: the floor);
* ``plain broker``: ``CONNECT`` through the broker, its own TLS, one GET (what a worker
  does today for an HTTPS destination with no held credential); and the same presenting
  a client certificate of its own to the mTLS port (the baseline of ``mtls``);
* ``bearer``: plain HTTP to the broker, which originates TLS and injects the header;
* ``mtls``: the same, the broker presenting the held client certificate;
* ``identity``: the same, the broker minting an ES256 token for the destination dialed.

Reported: each path's p50 and p90 per connection (connect to the last response byte),
and each injected path's p50 added over its plain broker path (mtls: over the tunnel
whose client presents the certificate itself). The broker's request
allowance (20 a second) is lifted for the run so the loop measures work, not the rate
limit. Run: ``python3 bench/creds.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bench._support import percentile
from charter.core.identity import IdentityKey
from charter.core.secrets import HeldSecret
from charter.sandbox import Credentials, EgressBroker, EgressGrant
from charter.sandbox import egress as egress_module
from charter.sandbox._peer import cgroup_dirs_of

HOST = "svc.bench"
_REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"


def _cert(
    cn: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey]
) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(issuer[0])
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False)
    )
    if issuer[1] is key:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    return builder.sign(issuer[1], hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class _Server:
    """A TLS server on 127.0.0.1 answering every request with a 200 (a thread a connection)."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.ctx = ctx
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            with self.ctx.wrap_socket(conn, server_side=True) as tls:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := tls.recv(4096)):
                    data += chunk
                tls.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
                )
        except (OSError, ssl.SSLError):
            conn.close()


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args(argv)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    ca = _cert("bench CA", ca_key, (ca_name, ca_key))
    server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    server_pem = _cert(HOST, server_key, (ca_name, ca_key)) + _pem_key(server_key)
    client_cert = _cert("bench-client", client_key, (ca_name, ca_key))

    def server_ctx(require_client: bool) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.NamedTemporaryFile() as f:
            f.write(server_pem)
            f.flush()
            ctx.load_cert_chain(f.name)
        if require_client:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cadata=ca.decode())
        return ctx

    plain_srv, mtls_srv = _Server(server_ctx(False)), _Server(server_ctx(True))
    ports = {"bearer": plain_srv.port, "identity": plain_srv.port, "mtls": mtls_srv.port}
    home = Path(tempfile.mkdtemp(prefix="charter-bench-creds-"))
    identity = IdentityKey.load_or_create(home)
    held = {
        "tok": HeldSecret("tok", "bearer", (f"{HOST}:{plain_srv.port}",), value=b"t" * 40, ca=ca),
        "crt": HeldSecret(
            "crt",
            "client-cert",
            (f"{HOST}:{mtls_srv.port}",),
            value=client_cert,
            key=_pem_key(client_key),
            ca=ca,
        ),
        "idt": HeldSecret("idt", "identity", (f"{HOST}:{plain_srv.port}",), ca=ca),
    }

    def resolve(host: str, port: int) -> Sequence[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    # The rate allowance is what a sandbox may ask for; lifted, the loop measures work.
    egress_module._REQUESTS_PER_SECOND = 1e9
    egress_module._REQUEST_BURST = 1e9
    sock_path = home / "egress.sock"
    broker = EgressBroker(sock_path, resolver=resolve,
                          credentials=Credentials(held, identity))  # fmt: skip
    everywhere = (f"{HOST}:{plain_srv.port}", f"127.0.0.1:{plain_srv.port}",
                  f"{HOST}:{mtls_srv.port}", f"127.0.0.1:{mtls_srv.port}")  # fmt: skip
    uid = os.getuid()
    cgroup = tuple(sorted(cgroup_dirs_of(os.getpid())))

    def register(secrets: tuple[str, ...]) -> None:
        broker.unregister(uid)
        broker.register(uid, "bench", EgressGrant(destinations=everywhere, secrets=secrets),
                        byte_cap=1 << 40, cgroup=cgroup, journal=lambda events: None)  # fmt: skip

    client_ctx = ssl.create_default_context(cadata=ca.decode())

    def direct() -> bytes:
        with socket.create_connection(("127.0.0.1", plain_srv.port)) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=HOST) as tls:  # fmt: skip
            tls.sendall(f"GET / HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
            return _read_all(tls)

    cert_ctx = ssl.create_default_context(cadata=ca.decode())
    with tempfile.NamedTemporaryFile() as f:  # the bench's own client holds it here
        f.write(client_cert + _pem_key(client_key))
        f.flush()
        cert_ctx.load_cert_chain(f.name)

    def plain_broker(port: int, ctx: ssl.SSLContext) -> bytes:
        where = f"{HOST}:{port}"
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock_path))
            s.sendall(f"CONNECT {where} HTTP/1.1\r\nHost: {where}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(1)
            with ctx.wrap_socket(s, server_hostname=HOST) as tls:
                tls.sendall(
                    f"GET / HTTP/1.1\r\nHost: {where}\r\nConnection: close\r\n\r\n".encode()
                )
                return _read_all(tls)

    def injected(port: int) -> Callable[[], bytes]:
        def run() -> bytes:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock_path))
                s.sendall(
                    f"GET http://{HOST}:{port}/ HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()
                )
                return _read_all(s)

        return run

    paths: dict[str, tuple[tuple[str, ...], Callable[[], bytes]]] = {
        "direct": ((), direct),
        "plain broker": ((), lambda: plain_broker(plain_srv.port, client_ctx)),
        "plain broker, client's own certificate": (
            (),
            lambda: plain_broker(mtls_srv.port, cert_ctx),
        ),
        "bearer": (("tok",), injected(ports["bearer"])),
        "mtls": (("crt",), injected(ports["mtls"])),
        "identity": (("idt",), injected(ports["identity"])),
    }
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for i in range(args.runs + 10):  # ten warm-ups, then every path once per round
        for name, (secrets, call) in paths.items():
            register(secrets)
            t0 = time.perf_counter()
            reply = call()
            elapsed = time.perf_counter() - t0
            if b" 200 " not in reply.split(b"\r\n", 1)[0] + b" ":
                print(f"{name}: unexpected reply {reply[:80]!r}", file=sys.stderr)
                return 1
            if i >= 10:
                samples[name].append(elapsed * 1000)
    broker.close()
    report: dict[str, Any] = {"runs": args.runs, "paths": {}}
    for name, values in samples.items():
        p50 = percentile(values, 0.5)
        # mTLS is held against the same handshake done by the client; the rest against
        # the plain tunnel.
        mine = "plain broker, client's own certificate" if name == "mtls" else "plain broker"
        base = percentile(samples[mine], 0.5)
        report["paths"][name] = {
            "p50_ms": round(p50, 3),
            "p90_ms": round(percentile(values, 0.9), 3),
            "added_over_baseline_ms": round(p50 - base, 3),
            "ratio_to_baseline": round(p50 / base, 3),
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
