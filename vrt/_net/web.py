"""The HTTP front of ``vrt.serve``'s port: the browser client's files, and nothing else.

A connection's request head is read here first (h11, bounded in bytes; the caller's
handshake deadline bounds it in time). A WebSocket upgrade is handed back, bytes
untouched, to trio-websocket, where ``allowed_origins`` and ``authenticate`` check it
exactly as before. Any other request is answered here and the connection closed:
``GET``/``HEAD`` of ``/vrt.js``, the modules it imports or loads (``/machines.js``, the
audio worklet and the rest of :data:`WEB_FILES`) or ``/vrt.d.ts`` (the files of
``vrt/web``, with an ETag and ``304`` for a matching ``If-None-Match``, importable from any
origin), ``404`` for any other path (no listing, no other file), ``405`` for another
method.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from collections.abc import Mapping

import attrs
import h11
import trio

from vrt._net.accept import GuardedStream
from vrt._net.metrics import exposition

log = logging.getLogger("vrt.server")

WEB_FILES = {
    "/vrt.js": ("vrt.js", "text/javascript; charset=utf-8"),
    "/vrt.d.ts": ("vrt.d.ts", "text/plain; charset=utf-8"),
    "/machines.js": ("machines.js", "text/javascript; charset=utf-8"),
    # the modules vrt.js imports (by relative URL: they are served beside it)
    "/protocol.js": ("protocol.js", "text/javascript; charset=utf-8"),
    "/views.js": ("views.js", "text/javascript; charset=utf-8"),
    "/runner.js": ("runner.js", "text/javascript; charset=utf-8"),
    "/codec.js": ("codec.js", "text/javascript; charset=utf-8"),
    "/audio.js": ("audio.js", "text/javascript; charset=utf-8"),
    # audio.js's AudioWorklet processors (audio-v1), which it loads by URL beside itself
    "/audio-worklet.js": ("audio-worklet.js", "text/javascript; charset=utf-8"),
}
"""Every path the front serves: the file in ``vrt/web`` and its content type."""

HEALTH = "/healthz"
"""The health check: ``200 ok`` while accepting sessions and able to save them, ``503
draining`` after SIGTERM, ``503 store unreachable`` while the store does not answer."""
METRICS = "/metrics"
"""With ``metrics``: the process's metrics, in Prometheus' text format."""
HEAD_LIMIT = 16 * 1024
"""The largest request head read (bytes): past it, ``431`` and the connection closed."""


@functools.cache
def _file(name: str) -> tuple[bytes, str] | None:
    """A file of ``vrt/web`` and its ETag, read once (package data: it does not change)."""
    from importlib import resources

    try:
        body = resources.files("vrt").joinpath("web", name).read_bytes()
    except FileNotFoundError:
        return None
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


DEMO_FILES = {
    "/": ("demo.html", "text/html; charset=utf-8"),
    "/voice": ("voice.html", "text/html; charset=utf-8"),  # vrt demo --web --voice
}
"""With ``web_demo``: the demo page too."""


async def front(
    stream: GuardedStream,
    *,
    demo: bool = False,
    draining: bool = False,
    store_unreachable: bool = False,
    metrics: bool = False,
) -> bool:
    """Read the request head on ``stream``: True if it was answered here (the caller
    closes the connection), False if it is a WebSocket upgrade, put back for trio-websocket
    to read. ``demo``: serve the demo page at ``/`` as well. ``/healthz`` answers ``200
    ok``, or ``503 draining`` once ``draining``, ``503 store unreachable`` while
    ``store_unreachable`` (a load balancer's health check); with
    ``metrics``, ``/metrics`` answers the Prometheus text format (:mod:`vrt._net.metrics`). Raises
    ``trio.BrokenResourceError`` if the peer goes."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
    seen = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            # Not HTTP, or a head over HEAD_LIMIT: let trio-websocket refuse what it
            # refuses today, except an oversize head, which is ours to answer.
            if len(seen) > HEAD_LIMIT:
                await _send(stream, _response(431, b"request header fields too large", ()))
                return True
            log.debug("not an HTTP request head: %s", exc)
            stream.unread(bytes(seen))
            return False
        if len(seen) > HEAD_LIMIT:  # h11 parses a head that came whole, however long
            await _send(stream, _response(431, b"request header fields too large", ()))
            return True
        if event is h11.NEED_DATA:
            data = await stream.receive_some(4096)
            if not data:
                stream.unread(bytes(seen))
                return False
            seen += data
            conn.receive_data(bytes(data))
            continue
        break
    if not isinstance(event, h11.Request):
        stream.unread(bytes(seen))
        return False
    headers = {k.lower(): v for k, v in event.headers}
    if b"websocket" in headers.get(b"upgrade", b"").lower():
        stream.unread(bytes(seen))  # the upgrade: trio-websocket reads it from the start
        return False
    path = event.target.split(b"?", 1)[0].decode("latin-1")
    response = respond(
        event.method,
        path,
        headers,
        demo=demo,
        draining=draining,
        store_unreachable=store_unreachable,
        metrics=metrics,
    )
    await _send(stream, response)
    return True


@attrs.frozen(kw_only=True)
class Response:
    """One whole HTTP response of the front (``connection: close`` is the caller's)."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    """Every header but the connection's, names lower-case: ``content-length`` too (for
    ``HEAD``, the length of the body ``GET`` gets)."""
    body: bytes


def respond(
    method: bytes,
    path: str,
    headers: Mapping[bytes, bytes],
    *,
    demo: bool = False,
    draining: bool = False,
    store_unreachable: bool = False,
    metrics: bool = False,
) -> Response:
    """The answer to a plain HTTP request (not an upgrade) for ``path`` (no query string),
    its ``headers`` keyed by lower-case name: the one route table of ``vrt.serve``'s front
    and ``vrt.asgi``'s HTTP scope. Pure: no I/O."""
    method = method.upper()
    entry = WEB_FILES.get(path) or (DEMO_FILES.get(path) if demo else None)
    found = _file(entry[0]) if entry is not None else None
    if method not in (b"GET", b"HEAD"):
        return _response(405, b"method not allowed", ((b"allow", b"GET, HEAD"),))
    if path == HEALTH:
        status, text = (
            (503, b"draining\n")
            if draining
            else (503, b"store unreachable\n")
            if store_unreachable
            else (200, b"ok\n")
        )
        no_cache = ((b"cache-control", b"no-store"),)
        return _response(status, text if method == b"GET" else b"", no_cache, length=len(text))
    if path == METRICS and metrics:
        page, kind = exposition()
        no_cache = ((b"cache-control", b"no-store"),)
        body = page if method == b"GET" else b""
        return _response(200, body, no_cache, content_type=kind, length=len(page))
    if entry is None or found is None:
        return _response(404, b"not found", ())
    body, etag = found
    # Any page may import the client (a module script is fetched with CORS); who may
    # open a session is still the upgrade's to decide (allowed_origins, authenticate).
    tagged = (
        (b"etag", etag.encode()),
        (b"cache-control", b"no-cache"),
        (b"access-control-allow-origin", b"*"),
    )
    if headers.get(b"if-none-match", b"").decode("latin-1") in (etag, "*"):
        return _response(304, b"", tagged, content_type=None)
    return _response(
        200,
        body if method == b"GET" else b"",
        tagged,
        content_type=entry[1],
        length=len(body),
    )


def _response(
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...],
    *,
    content_type: str | None = "text/plain; charset=utf-8",
    length: int | None = None,
) -> Response:
    fields = [*headers, (b"x-content-type-options", b"nosniff")]
    if content_type is not None:
        fields.append((b"content-type", content_type.encode()))
    if status != 304:
        fields.append((b"content-length", str(len(body) if length is None else length).encode()))
    return Response(status=status, headers=tuple(fields), body=body)


async def _send(stream: GuardedStream, response: Response) -> None:
    """One whole response, then the connection is the caller's to close."""
    fields = [(b"connection", b"close"), *response.headers]
    conn = h11.Connection(h11.SERVER)
    # h11 needs to have seen a request to write a response: a minimal one of ours
    conn.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    conn.next_event()
    data = conn.send(h11.Response(status_code=response.status, headers=fields)) or b""
    if response.body:
        data += conn.send(h11.Data(data=response.body)) or b""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(data)
