"""A TCP proxy for fault tests: forwards bytes between clients and PostgreSQL, and can
lose the acknowledgement of a COMMIT and then every connection (a short outage).

Pure Python threads; nothing is mocked: the server really receives and runs the COMMIT,
only its reply never reaches the client, exactly as when a network drops after the
server committed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType


class CommitCuttingProxy:
    """``127.0.0.1:port`` → ``upstream``. :meth:`cut_next_commit` arms it: the next
    client message holding ``COMMIT`` is forwarded, its reply is dropped, and after
    ``settle`` seconds every connection is closed and new ones are refused for
    ``outage`` seconds."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._armed: tuple[float, float] | None = None
        self._down_until = 0.0
        self.commits_forwarded = 0
        self.cuts = 0  # acknowledgements lost so far
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def cut_next_commit(self, *, outage: float, settle: float = 0.3) -> None:
        with self._lock:
            self._armed = (outage, settle)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if time.monotonic() < self._down_until:
                client.close()  # the outage: connections are refused
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            pair = (client, server)
            with self._lock:
                self._pairs.append(pair)
            state = {"mute": False}
            threading.Thread(target=self._pump_up, args=(pair, state), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(pair, state), daemon=True).start()

    def _pump_up(self, pair: tuple[socket.socket, socket.socket], state: dict[str, bool]) -> None:
        client, server = pair
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                return
            if not data:
                self._close(pair)
                return
            cut = None
            if b"COMMIT" in data:
                with self._lock:
                    cut, self._armed = self._armed, None
            if cut is not None:
                state["mute"] = True  # the server's reply to this COMMIT is lost
                self.cuts += 1
            try:
                server.sendall(data)
            except OSError:
                return
            if b"COMMIT" in data:
                self.commits_forwarded += 1
            if cut is not None:
                outage, settle = cut
                threading.Thread(target=self._outage, args=(outage, settle), daemon=True).start()

    def _pump_down(self, pair: tuple[socket.socket, socket.socket], state: dict[str, bool]) -> None:
        client, server = pair
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                return
            if not data:
                self._close(pair)
                return
            if state["mute"]:
                continue
            try:
                client.sendall(data)
            except OSError:
                return

    def _outage(self, outage: float, settle: float) -> None:
        time.sleep(settle)  # the server has had time to commit
        with self._lock:
            self._down_until = time.monotonic() + outage
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            self._close(pair)

    @staticmethod
    def _close(pair: tuple[socket.socket, socket.socket]) -> None:
        for s in pair:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._stop.set()
        # shutdown wakes the thread blocked in accept(); close alone would leave the
        # socket listening until that call returns.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            self._close(pair)

    def __enter__(self) -> CommitCuttingProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
