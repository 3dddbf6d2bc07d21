"""A small OpenAI-compatible server of the tests' own, on loopback (stdlib http.server).

``POST /v1/chat/completions``, streamed (server-sent events, one chunk per token, then a
usage chunk when ``stream_options.include_usage`` is set, then ``[DONE]``) or not. It
answers ``max_tokens`` tokens (at most ``length``), and reports as usage its own prompt
count (the words of the messages, plus 3 per message: never the door's estimate) and
the tokens it sent, so a test can tell a settlement from the server's usage from one
estimated. ``POST /v1/responses`` is the Responses shape of the same: ``input`` (a
string, or messages), ``max_output_tokens``, usage as ``input_tokens`` and
``output_tokens`` (streamed: ``response.created``, one ``response.output_text.delta``
per token, then ``response.completed`` carrying the usage; no ``[DONE]``).
``ignore_max_tokens`` makes it stream ``length`` tokens whatever it was told
(a server that does not honour the cap); ``hold`` makes a stream stop after
``hold_after`` tokens until the event is set (a client can then disconnect mid-stream).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Behaviour:
    length: int = 8
    ignore_max_tokens: bool = False
    hold: threading.Event | None = None
    hold_after: int = 2
    seen: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reported: list[tuple[int, int]] = field(default_factory=list)


def prompt_tokens(messages: list[dict[str, Any]] | str) -> int:
    if isinstance(messages, str):  # a Responses input given as text: one message
        messages = [{"role": "user", "content": messages}]
    total = 0
    for m in messages:
        content = m.get("content", "")
        if isinstance(content, list):  # input parts: [{"type": "input_text", "text"}]
            content = " ".join(str(p.get("text", "")) for p in content)
        total += len(str(content).split()) + 3
    return total


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each write goes at once (no delayed-ACK stalls)
    behaviour: Behaviour

    def log_message(self, format: str, *args: Any) -> None:
        del format, args

    def do_POST(self) -> None:
        b = self.behaviour
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with b.lock:
            b.seen.append(body)
            b.auth.append(self.headers.get("Authorization"))
        responses = self.path.endswith("/responses")
        if not (responses or self.path.endswith("/chat/completions")):
            self.send_error(404)
            return
        cap = (
            body.get("max_tokens") or body.get("max_completion_tokens")
            or body.get("max_output_tokens") or b.length
        )  # fmt: skip
        n = b.length if b.ignore_max_tokens else min(cap, b.length)
        prompt = prompt_tokens(body["input"] if responses else body["messages"])
        if responses:
            self._responses(body, n, prompt)
        elif body.get("stream"):
            self._stream(body, n, prompt)
        else:
            with b.lock:
                b.reported.append((prompt, n))
            answer = {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": body.get("model", "test"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "tok " * n},
                        "finish_reason": "length",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": n,
                    "total_tokens": prompt + n,
                },
            }
            self._json(answer)

    def _json(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream_head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, payload: dict[str, Any], event: str | None = None) -> None:
        data = b"data: " + json.dumps(payload).encode() + b"\n\n"
        if event is not None:
            data = f"event: {event}\n".encode() + data
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, body: dict[str, Any], n: int, prompt: int) -> None:
        b = self.behaviour
        self._stream_head()
        base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "model": "test"}
        try:
            self._chunk({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            for i in range(n):
                if b.hold is not None and i == b.hold_after:
                    b.hold.wait(60)
                self._chunk({**base, "choices": [{"index": 0, "delta": {"content": "tok "}}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                with b.lock:
                    b.reported.append((prompt, n))
                usage = {
                    "prompt_tokens": prompt,
                    "completion_tokens": n,
                    "total_tokens": prompt + n,
                }
                self._chunk({**base, "choices": [], "usage": usage})
            data = b"data: [DONE]\n\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            return  # the door hung up (a cut, a client gone)

    def _responses(self, body: dict[str, Any], n: int, prompt: int) -> None:
        b = self.behaviour
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + n,
        }
        message = {
            "id": "msg-test", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "tok " * n, "annotations": []}],
        }  # fmt: skip
        whole = {
            "id": "resp-test", "object": "response", "created_at": 0, "status": "completed",
            "model": body.get("model", "test"), "output": [message], "usage": usage,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        }  # fmt: skip
        if not body.get("stream"):
            with b.lock:
                b.reported.append((prompt, n))
            self._json(whole)
            return
        self._stream_head()
        started = {**whole, "status": "in_progress", "output": [], "usage": None}
        try:
            seq = 0
            self._chunk({"type": "response.created", "sequence_number": seq,
                         "response": started}, "response.created")  # fmt: skip
            for i in range(n):
                if b.hold is not None and i == b.hold_after:
                    b.hold.wait(60)
                seq += 1
                delta = {
                    "type": "response.output_text.delta", "sequence_number": seq,
                    "item_id": "msg-test", "output_index": 0, "content_index": 0,
                    "delta": "tok ", "logprobs": [],
                }  # fmt: skip
                self._chunk(delta, "response.output_text.delta")
            with b.lock:
                b.reported.append((prompt, n))
            done = {"type": "response.completed", "sequence_number": seq + 1, "response": whole}
            self._chunk(done, "response.completed")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            return


@contextmanager
def model_server(behaviour: Behaviour | None = None) -> Iterator[tuple[str, Behaviour]]:
    """The server on 127.0.0.1 (a free port): its base URL (``http://…/v1``) and its
    behaviour (what it saw, what it reported)."""
    b = behaviour or Behaviour()
    handler = type("Handler", (_Handler,), {"behaviour": b})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", b
    finally:
        server.shutdown()
        server.server_close()
