"""A test CA made here with ``cryptography``, loopback servers that record what reached
them (TLS with or without a required client certificate, and plain HTTP), and a resolver
that names them."""

from __future__ import annotations

import datetime
import socket
import ssl
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NAMES = ("api.test", "mtls.test", "other.test", "id.test")


def resolver(host: str, port: int) -> Sequence[tuple[Any, ...]]:
    """The test names all live on 127.0.0.1 (the grant names those addresses too)."""
    if host in NAMES:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
    raise OSError("unknown test name")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class PKI:
    """A CA and the certificates it issues, all made in the test."""

    def __init__(self, cn: str = "charter test CA") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(_name(cn))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, cn: str, *, server: bool) -> tuple[bytes, bytes]:
        """(certificate PEM, PKCS#8 key PEM) for ``cn`` (a DNS SAN for a server)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False
            )
        cert = builder.sign(self.key, hashes.SHA256())
        return (
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )


class Seen:
    """One request that reached a server: its head's headers and the client's cert CN."""

    def __init__(self, headers: dict[str, str], client_cn: str | None) -> None:
        self.headers = headers
        self.client_cn = client_cn


class Server:
    """A loopback HTTP server, TLS when given a PKI (a client certificate from that CA
    required with ``require_client``). It records every request and handshake refusal
    and answers ``200`` with a body that never echoes a header."""

    def __init__(self, pki: PKI | None = None, name: str = "", *, require_client: bool = False):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.refused_handshakes = 0
        self.seen: list[Seen] = []
        self.ctx: ssl.SSLContext | None = None
        if pki is not None:
            cert, key = pki.issue(name, server=True)
            self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            with tempfile.TemporaryDirectory() as d:
                path = Path(d) / "server.pem"
                path.write_bytes(cert + key)
                self.ctx.load_cert_chain(path)
            if require_client:
                self.ctx.verify_mode = ssl.CERT_REQUIRED
                self.ctx.load_verify_locations(cadata=pki.pem.decode())
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            if self.ctx is not None:
                try:
                    conn = self.ctx.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    with self._lock:
                        self.refused_handshakes += 1
                    conn.close()
                    return
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            lines = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
            headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
            cn = None
            if isinstance(conn, ssl.SSLSocket):
                peer = conn.getpeercert()
                if peer:
                    cn = dict(x[0] for x in peer["subject"]).get("commonName")
            with self._lock:
                self.seen.append(Seen(headers, cn))
            auth = "with-authorization" if "authorization" in headers else "no-authorization"
            body = f"ok {auth} client={cn}\n".encode()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
                + body
            )
        except OSError:
            pass
        finally:
            conn.close()


# Inside the sandbox: one plain-HTTP request per argument (a URL, or "CONNECT host:port"
# for a tunnel with the worker's own TLS, no certificate; "URL|HOST" sends its own Host
# header), printed as
# "<status-or-error> <first body line>" per line.
FETCH = r"""
import os, socket, ssl, sys
def ask(target):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(15)
    s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
    if target.startswith("CONNECT "):
        where = target.split()[1]
        s.sendall(f"CONNECT {where} HTTP/1.1\r\nHost: {where}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and (c := s.recv(1)):
            head += c
        if b" 200 " not in head.split(b"\r\n")[0] + b" ":
            return head.split(b"\r\n")[0].decode()
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            t = ctx.wrap_socket(s, server_hostname=where.split(":")[0])
            t.sendall(f"GET / HTTP/1.1\r\nHost: {where}\r\n\r\n".encode())
            data = b""
            while c := t.recv(4096):
                data += c
        except (OSError, ssl.SSLError) as e:
            return "tls-refused " + type(e).__name__
        if not data:
            # TLS 1.3 finishes the client's side of the handshake before the server checks
            # its certificate; the server's alert can then be lost to a reset (it has closed
            # when the GET arrives), so a refusal may reach this end as a bare EOF.
            return "tls-refused EOF"
    else:
        target, _, extra = target.partition("|")  # "URL|HOST": a Host header of its own
        extra = extra or target.split("/")[2]
        auth = "Authorization: Bearer worker-made"
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {extra}\r\n{auth}\r\n\r\n".encode())
        data = b""
        while c := s.recv(4096):
            data += c
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b" ")[1].decode() if head else "none"
    return status + " " + (body.decode().splitlines() or [""])[0]
for t in sys.argv[1:]:
    print(ask(t), flush=True)
"""


def token_estate(tmp_path: Path, token: str, root: Any) -> tuple[Any, Server, list[str]]:
    """A Charter (SQLite, the home at ``tmp_path/home``) whose root ``estate`` may reach a
    loopback TLS server of a test CA (by ``localhost`` and ``127.0.0.1``) and holds the
    bearer secret ``tok`` (``token``), bound to ``localhost:PORT``: the Charter, the
    server and those two destinations."""
    from charter.app import CellSetup, Charter, Settings
    from charter.control import Ceiling
    from charter.core import KeyStore
    from charter.core.secrets import HeldSecret, SecretStore

    pki = PKI()
    server = Server(pki, "localhost")
    where = [f"localhost:{server.port}", f"127.0.0.1:{server.port}"]
    home = tmp_path / "home"
    SecretStore(home).add(
        HeldSecret("tok", "bearer", (where[0],), value=token.encode(), ca=pki.pem)
    )
    charter, _ = Charter.initialise(
        f"sqlite:///{tmp_path}/journal.db", root="estate",
        ceiling=Ceiling(budget=root, depth=4, fanout=20, egress=frozenset(where),
                        secrets=frozenset({"tok"})),
        cell=CellSetup(cores=2, processing=2, coordination=2), keys=KeyStore(home),
        settings=Settings(),
    )  # fmt: skip
    return charter, server, where
