"""Server-Sent Events, sans-IO: bytes in, events out (the WHATWG ``text/event-stream`` rules).

:class:`SSEDecoder` takes the response body in whatever chunks the network gives and
returns each complete event: its ``event`` name (``message`` by default), its ``data``
(lines joined with ``\\n``) and its ``id``. Lines end with CRLF, LF or CR; a line that
starts with ``:`` is a comment (keep-alives); a field without a colon has an empty value;
one space after the colon is dropped; a UTF-8 BOM at the start is skipped; an ``error:``
line (llama.cpp's way to fail a stream) becomes an event named ``error``. An event is
dispatched at a blank line, and only if it has data. A line or an event larger than
``max_event_bytes`` raises :class:`~vrt.ModelError`: a provider's stream is untrusted
input, and the buffer is bounded.
"""

from __future__ import annotations

import codecs

import attrs

from vrt._errors import ModelError

MAX_EVENT_BYTES = 8 * 1024 * 1024
"""The largest event (or line) a stream may send; a provider's events are a few KiB."""


@attrs.frozen(kw_only=True)
class SSEEvent:
    """One dispatched event."""

    event: str = "message"
    data: str = ""
    id: str | None = None


class SSEDecoder:
    """Decode one ``text/event-stream`` body (see the module)."""

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pieces: list[str] = []  # the text after the last line break, in pieces
        self._pending_size = 0
        self._cr = False  # the last chunk ended with CR: an LF next is part of that break
        self._first = True
        self._max = max_event_bytes
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        self._id: str | None = None
        self.last_id: str | None = None
        """The last ``id`` field seen (what a reconnecting client would send back)."""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by ``chunk``."""
        text = self._decoder.decode(chunk)
        if self._first and text:
            self._first = False
            text = text.removeprefix("\ufeff")
        if self._cr:
            self._cr = False
            text = text.removeprefix("\n")
        if "\n" not in text and "\r" not in text:
            # Still inside one line: keep the piece, join once the line ends (a long line
            # in small chunks would otherwise be copied again with every chunk).
            self._pieces.append(text)
            self._pending_size += len(text)
            if self._pending_size > self._max:
                raise ModelError(f"the event stream sent a line over {self._max} bytes")
            return []
        if self._pieces:
            self._pieces.append(text)
            text = "".join(self._pieces)
            self._pieces = []
        if "\r" in text:
            if text.endswith("\r"):
                self._cr = True  # an LF starting the next chunk belongs to this break
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        pending = lines.pop()  # the text after the last break: an unfinished line
        self._pieces = [pending] if pending else []
        self._pending_size = len(pending)
        if self._pending_size > self._max:
            raise ModelError(f"the event stream sent a line over {self._max} bytes")
        events: list[SSEEvent] = []
        for line in lines:
            if line.startswith("data:"):  # the common line, inline
                value = line[6:] if line.startswith("data: ") else line[5:]
                self._size += len(value) + 1
                if self._size > self._max:
                    raise ModelError(f"the event stream sent an event over {self._max} bytes")
                self._data.append(value)
                continue
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """The end of the body: an event not ended by a blank line is dropped (the
        standard's rule), but a last line without its break is still read."""
        tail = "".join(self._pieces) + self._decoder.decode(b"", final=True)
        self._pieces = []
        if tail:
            self._line(tail)
        return []

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: keep-alive
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._add(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "error":
            # Not a standard field: llama.cpp's server reports a failure mid-stream as an
            # ``error:`` line. Dispatched as an ``error`` event, so the stream fails.
            self._event = "error"
            self._add(value)
        # "retry" and unknown fields: ignored (we never reconnect a model stream)
        return None

    def _add(self, value: str) -> None:
        self._size += len(value) + 1
        if self._size > self._max:
            raise ModelError(f"the event stream sent an event over {self._max} bytes")
        self._data.append(value)

    def _dispatch(self) -> SSEEvent | None:
        data, event, self._data, self._event, self._size = self._data, self._event, [], "", 0
        if self._id is not None:
            self.last_id = self._id
        if not data:
            return None
        return SSEEvent(event=event or "message", data="\n".join(data), id=self.last_id)
