"""The model door's stream reader (charter/runner/_sse.py): the chunked framing taken off
as bytes come, in any split, and the events cut out unchanged, whatever the reads."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from charter.runner._sse import Dechunker, split_events


def chunked(pieces: list[bytes], trailers: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p)
    return framed + b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *at, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@given(
    st.lists(st.binary(max_size=40), max_size=8),
    st.lists(st.sampled_from([b"X-Trailer: 1", b"Server-Timing: a"]), max_size=2),
    st.lists(st.integers(min_value=0), max_size=12),
)
def test_the_data_is_the_chunks_joined_whatever_the_reads(
    pieces: list[bytes], trailers: list[bytes], cuts: list[int]
) -> None:
    body = chunked(pieces, trailers)
    chunks = Dechunker()
    out = b""
    for part in splits(body, cuts):
        assert not chunks.done
        out += chunks.feed(part)
    assert chunks.done
    assert not chunks.extra
    assert out == b"".join(pieces)


def test_bytes_after_the_last_chunk_are_flagged() -> None:
    chunks = Dechunker()
    assert chunks.feed(chunked([b"abc"]) + b"HTTP/1.1 200 OK\r\n") == b"abc"
    assert chunks.done
    assert chunks.extra


@pytest.mark.parametrize(
    "body",
    [
        b"0x3\r\nabc\r\n0\r\n\r\n",  # int(..., 16) would take this
        b"-3\r\nabc\r\n0\r\n\r\n",
        b"3\r\nabcX\r\n0\r\n\r\n",  # data longer than its size
        b"1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n",
        b"f" * 5000,  # a size line without end
    ],
)
def test_a_malformed_frame_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        Dechunker().feed(body)


line = st.binary(max_size=20).filter(lambda b: b"\n" not in b)


@given(
    st.lists(
        st.tuples(
            st.lists(
                st.binary(max_size=20).filter(lambda b: b"\n" not in b), min_size=1, max_size=3
            ),
            st.sampled_from([b"\n", b"\r\n"]),
        ),
        max_size=6,
    ),
    st.lists(st.integers(min_value=0), max_size=10),
)
def test_events_are_cut_at_blank_lines_and_their_bytes_kept(
    events: list[tuple[list[bytes], bytes]], cuts: list[int]
) -> None:
    whole = [b"".join(b"data: " + line + end for line in lines) + end for lines, end in events]
    stream = b"".join(whole)
    got: list[bytes] = []
    rest = b""
    for part in splits(stream, cuts):
        done, rest = split_events(rest + part)
        got.extend(done)
    assert b"".join(got) + rest == stream  # nothing lost, nothing added
    assert all(e.endswith((b"\n\n", b"\n\r\n")) for e in got)
    assert len(got) == sum(1 for e in whole if e.endswith((b"\n\n", b"\n\r\n")))
