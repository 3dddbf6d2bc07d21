"""A loopback HTTP server that counts what reaches it: the sends of outward calls."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class CountingServer:
    """Answers every request ``201 created <n>`` and counts it by path, once its body
    is read (a send is counted when it arrived whole). ``hold`` makes it wait before
    answering, until ``release``; ``arrived`` is set when a request has arrived."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.hold = False
        self.arrived = threading.Event()
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    n = outer.counts[self.path] = outer.counts.get(self.path, 0) + 1
                    outer.bodies.append(body)
                    outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                outer.arrived.set()
                if outer.hold:
                    outer.released.wait(60)
                answer = f"created {n}".encode()
                self.send_response(201)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_POST = do_PUT = do_GET = _serve  # noqa: N815

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def sends(self, path: str) -> int:
        with self.lock:
            return self.counts.get(path, 0)

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
