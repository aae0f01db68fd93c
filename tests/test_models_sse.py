"""vrt.models._sse: the SSE decoder, bytes in, events out, whatever the chunking."""

from __future__ import annotations

import itertools

import pytest

import vrt
from vrt.models._sse import SSEDecoder, SSEEvent


def decode(body: bytes, *, cuts: list[int] | None = None) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    points = [0, *(cuts or []), len(body)]
    for start, end in itertools.pairwise(points):
        events.extend(decoder.feed(body[start:end]))
    events.extend(decoder.close())
    return events


BODY = (
    b"\xef\xbb\xbf: a comment, then an event\r\n"
    b"event: content_block_delta\r\n"
    b'data: {"a":\r\n'
    b"data:  1}\r\n"
    b"id: 7\r\n"
    b"\r\n"
    b"data: caf\xc3\xa9\n\n"
    b"retry: 100\rdata:x\r\r"
    b"event: empty\n\n"  # no data: not dispatched
    b"data\n\n"  # a field without a colon: empty data, dispatched
)
EXPECTED = [
    SSEEvent(event="content_block_delta", data='{"a":\n 1}', id="7"),
    SSEEvent(event="message", data="café", id="7"),
    SSEEvent(event="message", data="x", id="7"),
    SSEEvent(event="message", data="", id="7"),
]


def test_the_standards_rules() -> None:
    assert decode(BODY) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(BODY)))
def test_every_chunking_gives_the_same_events(cut: int) -> None:
    """Cut anywhere: inside a line, between CR and LF, inside a UTF-8 character."""
    assert decode(BODY, cuts=[cut]) == EXPECTED


def test_byte_by_byte() -> None:
    assert decode(BODY, cuts=list(range(1, len(BODY)))) == EXPECTED


def test_an_event_not_ended_by_a_blank_line_is_dropped() -> None:
    assert decode(b"data: a\n\ndata: b") == [SSEEvent(data="a")]


def test_a_bom_only_at_the_start() -> None:
    assert decode(b"data: \xef\xbb\xbfx\n\n") == [SSEEvent(data="\ufeffx")]


@pytest.mark.parametrize(
    "body",
    [b"data: " + b"x" * 2000 + b"\n\n", b"data: " + b"x" * 2000, b"data: a\n" * 600 + b"\n"],
)
def test_an_event_over_the_bound_is_a_model_error(body: bytes) -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    with pytest.raises(vrt.ModelError, match="over 1000 bytes"):
        decoder.feed(body)


def test_a_long_line_in_small_chunks() -> None:
    """The unfinished line is kept in pieces and joined once (not copied every chunk)."""
    value = b"y" * 50_000
    body = b"data: " + value + b"\n\n"
    assert decode(body, cuts=list(range(7, len(body), 7))) == [SSEEvent(data=value.decode())]


def test_a_line_over_the_bound_in_small_chunks_is_a_model_error() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    for _ in range(100):  # 1000 bytes: at the bound
        assert decoder.feed(b"zzzzzzzzzz") == []
    with pytest.raises(vrt.ModelError, match="a line over 1000 bytes"):
        decoder.feed(b"z")


def test_an_error_field_is_an_error_event() -> None:
    """llama.cpp's server reports a failure mid-stream as an ``error:`` line."""
    body = b'data: {"a": 1}\n\nerror: {"message": "context full"}\n\n'
    assert decode(body) == [
        SSEEvent(data='{"a": 1}'),
        SSEEvent(event="error", data='{"message": "context full"}'),
    ]
