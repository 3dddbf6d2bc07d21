"""The model door's client of the model endpoint (charter/runner/_upstream.py): the
request it writes, and an answer's head and body read off the socket, whatever their
framing, with the connection kept only when the answer was read to its end and said
nothing against it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

from charter.runner._upstream import (
    MAX_HEAD,
    Answer,
    UpstreamConnection,
    UpstreamProtocolError,
    request_head,
)
from tests.runner.test_model_door_sse import chunked

URL = urlsplit("http://127.0.0.1:8000/v1")
HEAD = request_head(URL, "/v1/chat/completions", {"Authorization": "Bearer k"})


@contextmanager
def answered(raw: bytes, *, close: bool = True) -> Iterator[tuple[Answer, UpstreamConnection]]:
    """An answer read from a server that sends ``raw`` (then hangs up, if ``close``)
    to the one request it reads."""
    ours, theirs = socket.socketpair()
    got: list[bytes] = []

    def serve() -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += theirs.recv(65536)
        got.append(data)
        theirs.sendall(raw)
        if close:
            theirs.close()

    server = threading.Thread(target=serve)
    server.start()
    conn = UpstreamConnection(URL, 5.0)
    conn.sock = ours
    try:
        answer = conn.request(HEAD, b'{"messages": []}')
        yield answer, conn
    finally:
        server.join()
        conn.close()
        theirs.close()
    assert got[0].endswith(b'Content-Length: 16\r\n\r\n{"messages": []}')


def test_the_request_names_the_host_no_content_coding_and_the_held_key() -> None:
    lines = HEAD.decode().split("\r\n")
    assert lines[:3] == ["POST /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1:8000",
                         "Accept-Encoding: identity"]  # fmt: skip
    assert "Authorization: Bearer k" in lines
    v6 = request_head(urlsplit("https://[::1]/v1"), "/v1/responses", {})
    assert v6.split(b"\r\n")[1] == b"Host: [::1]"


def test_a_chunked_answer_read_to_its_end_keeps_its_connection() -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n"
    with answered(raw + b"\r\n" + chunked([b"data: 1\n\n", b"data: 2\n\n"]), close=False) as (
        answer, conn,
    ):  # fmt: skip
        assert answer.status == 200
        assert answer.header("Content-Type", "") == "text/event-stream"
        assert b"".join(answer.pieces()) == b"data: 1\n\ndata: 2\n\n"
        assert answer.done
        assert conn.reusable  # the connection can carry the next request


def test_a_chunked_answer_cut_short_raises_and_is_not_kept() -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n5\r\ndat"
    with answered(raw) as (answer, conn):
        with pytest.raises(UpstreamProtocolError):
            list(answer.pieces())
        assert not answer.done
        assert not conn.reusable


def test_an_answer_with_a_length_is_read_to_it_and_bytes_past_it_drop_the_connection() -> None:
    with answered(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ndata: 1\n\n", close=False) as (
        answer, conn,
    ):  # fmt: skip
        assert answer.read(1024) == b"data: 1\n\n"
        assert answer.done
        assert conn.reusable
    with answered(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1") as (answer, conn):
        assert answer.read(1024) == b"ok"
        assert not conn.reusable  # the server sent more than was asked for


def test_an_answer_short_of_its_length_raises() -> None:
    with answered(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nshort") as (answer, conn):
        with pytest.raises(UpstreamProtocolError, match="15 B short"):
            answer.read(1024)
        assert not conn.reusable


def test_close_an_old_version_or_no_length_ends_the_connection() -> None:
    for raw in (
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n\r\nok",  # delimited by the connection's end
    ):
        with answered(raw) as (answer, conn):
            assert answer.read(1024) == b"ok"
            assert answer.done
            assert not conn.reusable, raw
    with answered(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok") as (
        answer, conn,
    ):  # fmt: skip
        assert answer.read(1024) == b"ok"
        assert conn.reusable


def test_a_head_whose_lines_end_in_a_bare_lf_is_read() -> None:
    with answered(b"HTTP/1.1 200 OK\nContent-Length: 2\nX-A: b\n\nok", close=False) as (
        answer, conn,
    ):  # fmt: skip
        assert (answer.status, answer.header("x-a", "")) == (200, "b")
        assert answer.read(1024) == b"ok"
        assert conn.reusable


def test_an_interim_answer_is_skipped_and_a_no_content_answer_has_no_body() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"
    with answered(raw, close=False) as (answer, conn):
        assert answer.status == 204
        assert answer.read(1024) == b""
        assert conn.reusable


def test_an_answer_over_the_limit_is_not_read_to_its_end() -> None:
    with answered(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789") as (answer, conn):
        assert answer.read(4) == b"0123"
        assert not answer.done
        assert not conn.reusable


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nNo-Colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nA: 1\r\n folded\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nName : 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD,
        b"HTTP/1.1 200 OK\r\n",  # the server hung up in the head
        b"",  # or before it
    ],
)
def test_a_malformed_answer_head_is_refused(raw: bytes) -> None:
    with pytest.raises(UpstreamProtocolError), answered(raw):
        pass
