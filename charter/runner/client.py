"""The worker's side of the door: stdlib only, importable read-only in any sandbox.

Inside a worker the cell puts a copy of this file at ``/workspace/charter_door.py``::

    import charter_door
    door = charter_door.Door()
    children = door.spawn({"width": 2, "objective": "...", "estimated_cost": {...}},
                          [{"argv": ["/usr/bin/python3", "/workspace/review.py"],
                            "inputs": ["a.py"]}])["children"]
    answers = door.wait(children)["children"]
    door.result("merged report")

Every method returns the JSON-RPC ``result``; an error reply raises :class:`DoorError`
with its ``code``, ``message`` and ``data``. See docs/door.md for the protocol.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import socket
from typing import Any

__all__ = ["DEFAULT_PATH", "MODEL_PATH", "Door", "DoorError", "ModelConnection"]

DEFAULT_PATH = "/run/charter/keys.sock"
MODEL_PATH = "/run/charter/model.sock"


class DoorError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.data = code, message, data


class Door:
    """One connection to the door; requests are answered in order."""

    def __init__(self, path: str = DEFAULT_PATH, timeout: float | None = None) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._reader = self._sock.makefile("rb")
        self._ids = itertools.count(1)

    def close(self) -> None:
        self._reader.close()
        self._sock.close()

    def __enter__(self) -> Door:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        request = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            request["params"] = params
        # Refused on accept, the send may fail: the door's error line is still there.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._sock.sendall(json.dumps(request).encode() + b"\n")
        return self.read_reply()

    def read_reply(self) -> Any:
        line = self._reader.readline()
        if not line:
            raise DoorError(-32603, "the door closed the connection")
        reply = json.loads(line)
        if "error" in reply:
            error = reply["error"]
            raise DoorError(error["code"], error["message"], error.get("data"))
        return reply["result"]

    def spawn(self, intent: dict[str, Any], workers: list[dict[str, Any]]) -> Any:
        return self.call("spawn", {"intent": intent, "workers": workers})

    def wait(self, children: list[str], timeout_s: float = 600.0) -> Any:
        return self.call("wait", {"children": children, "timeout_s": timeout_s})

    def result(self, text: str) -> Any:
        return self.call("result", {"text": text})

    def sign(self, tag: str, message: bytes) -> bytes:
        reply = self.call("sign", {"tag": tag, "message_hex": message.hex()})
        return bytes.fromhex(reply["signature_hex"])

    def secret(self, name: str) -> Any:
        return self.call("secret", {"name": name})

    def revoke(self, lineage: str, reason: str = "") -> Any:
        """Revoke ``lineage``, one of this worker's own descendants, and its subtree."""
        return self.call("revoke", {"lineage": lineage, "reason": reason})

    def act(
        self,
        key: str,
        url: str,
        *,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        body: str = "",
    ) -> Any:
        """An outward-acting HTTP call, sent at most once for ``key`` (a retry with the
        same key gets the recorded outcome: docs/door.md, ``act``)."""
        params = {"key": key, "method": method, "url": url, "headers": headers or {}}
        return self.call("act", params | {"body": body})

    def delegate(
        self, agent: str, inputs: list[str] | None = None, timeout_s: float = 600.0
    ) -> Any:
        """Delegate to own-sandbox agent ``agent`` (docs/delegation.md); returns its
        reply (``{"delegate", "status", "reply", "digest", "timed_out"}``) once it ends.
        Closing this connection meanwhile kills the delegate."""
        params = {"agent": agent, "inputs": inputs or [], "timeout_s": timeout_s}
        return self.call("delegate", params)

    def whoami(self) -> Any:
        return self.call("whoami")


class ModelConnection(http.client.HTTPConnection):
    """An HTTP connection to the model door (docs/model-door.md): an OpenAI-compatible
    ``POST /v1/chat/completions`` on the unix socket bound at :data:`MODEL_PATH`."""

    def __init__(self, path: str = MODEL_PATH, timeout: float | None = None) -> None:
        super().__init__("charter", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)
