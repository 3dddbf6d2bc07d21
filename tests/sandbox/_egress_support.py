"""Pieces the broker tests share: a counting loopback server and in-sandbox clients."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

PAYLOAD = 256 * 1024

# Inside the sandbox: CONNECT argv[1] (host:port, sent as is) through the broker; if the
# tunnel opens, send a line and read to EOF. Prints the status and the bytes received.
CLIENT = """
import os, socket, sys
target = sys.argv[1]
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
try:  # a peer refused on accept may be closed on before its head is sent
    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
except OSError:
    pass
data = b""
while b"\\r\\n\\r\\n" not in data and (chunk := s.recv(4096)):
    data += chunk
head, _, rest = data.partition(b"\\r\\n\\r\\n")
status, n = (head.split(b" ")[1].decode() if head else "none"), len(rest)
if status == "200":
    s.sendall(b"go\\n")
    while chunk := s.recv(65536):
        n += len(chunk)
print(status, n if status == "200" else 0)
"""


class Server:
    """A host TCP server (IPv4 or IPv6 loopback) that, per connection, reads a line and
    sends PAYLOAD bytes. ``on_accept`` runs on its thread for each connection, first."""

    def __init__(
        self, host: str = "127.0.0.1", on_accept: Callable[[], None] | None = None
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, 0), family=family)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.on_accept = on_accept
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.on_accept is not None:
                self.on_accept()
            with conn:
                try:
                    conn.settimeout(10)
                    line = b""
                    while not line.endswith(b"\n") and (chunk := conn.recv(16)):
                        line += chunk
                    if line.endswith(b"\n"):
                        conn.sendall(b"x" * PAYLOAD)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
