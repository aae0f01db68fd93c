"""A hand-written vrt/1 server that speaks ``audio-v1``, for tests/test_browser_audio.py.

A stand-in for the servers' audio side (not what the test is about): it welcomes a
client that offers ``audio-v1`` with the rates of :data:`AUDIO`, keeps every binary frame
the client sends (the microphone) and every message, and answers each ``input`` by its
text, each a turn of the agent's voice (a sine tone, PCM16 at the output rate):

- ``speak``: 3 s of tone in 20 ms frames at the pace of real time, until the client's
  ``interrupt``; then one more frame of the turn (one that crossed the interrupt on the
  wire: the client must drop it), ``audio.end`` and ``turn.ended`` ``interrupted``.
- ``burst``: first a whole span of an epoch behind the client's (stale: never played),
  then the turn: 2 s of tone at once, and 0.4 s later a server-side interrupt
  (``audio.end``, ``turn.ended`` ``interrupted`` with the epoch raised).

The browser loads the page and ``/vrt.js`` from :attr:`AudioServer.front`, a plain HTTP
server answering with vrt's own route table (:func:`vrt._net.web.respond`: the worklet's
route is the real one).
"""

from __future__ import annotations

import functools
import http.server
import json
import math
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

from vrt._net.web import respond

AUDIO: dict[str, Any] = {
    "input": {"format": "pcm16", "rate": 16000},
    "output": {"format": "pcm16", "rate": 24000},
}
"""The rates the welcome grants: the page resamples its context's rate (44.1 or 48 kHz) to 16 kHz
for the microphone, and 24 kHz to its context's rate for the voice."""
OUTPUT_RATE: int = AUDIO["output"]["rate"]
TONE = 660.0  # Hz of the agent's voice
FRAME = OUTPUT_RATE // 50  # samples of one 20 ms frame


def tone(samples: int, start: int = 0, amplitude: float = 0.5) -> bytes:
    """``samples`` of the agent's tone from sample ``start``, PCM16 LE."""
    step = 2 * math.pi * TONE / OUTPUT_RATE
    values = (round(amplitude * 32767 * math.sin(step * (start + i))) for i in range(samples))
    return struct.pack(f"<{samples}h", *values)


@attrs.define
class Heard:
    """What the server received: the client's messages and its binary frames, each with
    the time it came (``time.monotonic()``)."""

    messages: list[dict[str, Any]] = attrs.Factory(list)
    frames: list[tuple[float, bytes]] = attrs.Factory(list)
    sent: dict[str, int] = attrs.Factory(dict)
    """Per turn, the ms of audio sent (``audio.end``'s ``sentMs``)."""


class _Session:
    def __init__(self, ws: WebSocketConnection, heard: Heard) -> None:
        self.ws = ws
        self.heard = heard
        self.seq = 0
        self.epoch = 0
        self.turns = 0
        self.interrupted = trio.Event()

    async def send(self, **message: Any) -> None:
        self.seq += 1
        await self.ws.send_message(json.dumps({**message, "seq": self.seq}))

    async def run(self) -> None:
        hello = json.loads(await self.ws.get_message())
        self.heard.messages.append(hello)
        granted = [c for c in hello["capabilities"] if c in ("audio-v1", "tool-stream-v1")]
        welcome = {"sessionId": "s_audio", "resumeToken": "k" * 32, "epoch": 0,
                   "capabilities": granted, "resumed": False, "lastSeq": hello["seq"]}  # fmt: skip
        if "audio-v1" in granted:
            welcome["audio"] = AUDIO
        await self.send(type="welcome", **welcome)
        async with trio.open_nursery() as nursery:
            while True:
                data = await self.ws.get_message()
                if isinstance(data, bytes):
                    self.heard.frames.append((time.monotonic(), data))
                    continue
                message = json.loads(data)
                self.heard.messages.append(message)
                if message["type"] == "interrupt":
                    self.epoch = max(self.epoch, message["epoch"])
                    self.interrupted.set()
                elif message["type"] == "input":
                    self.interrupted = trio.Event()
                    nursery.start_soon(getattr(self, message["text"]))
                elif message["type"] == "close":
                    await self.send(type="closed", reason="client")
                    nursery.cancel_scope.cancel()
                    return

    async def _start(self) -> str:
        self.turns += 1
        turn = f"t{self.turns}"
        await self.send(type="turn.started", turnId=turn, epoch=self.epoch)
        await self.send(type="audio.start", turnId=turn, epoch=self.epoch)
        return turn

    async def _end(self, turn: str, samples: int, reason: str) -> None:
        sent_ms = samples * 1000 // OUTPUT_RATE
        self.heard.sent[turn] = sent_ms
        await self.send(type="audio.end", turnId=turn, sentMs=sent_ms)
        await self.send(type="turn.ended", turnId=turn, epoch=self.epoch, reason=reason)

    async def speak(self) -> None:
        turn = await self._start()
        sent = 0
        began = trio.current_time()
        while sent < 3 * OUTPUT_RATE and not self.interrupted.is_set():
            await self.ws.send_message(tone(FRAME, sent))
            sent += FRAME
            with trio.move_on_at(began + sent / OUTPUT_RATE):
                await self.interrupted.wait()
        if not self.interrupted.is_set():
            await self._end(turn, sent, "finished")
            return
        await self.ws.send_message(tone(FRAME, sent))  # crossed the interrupt: dropped there
        sent += FRAME
        await self._end(turn, sent, "interrupted")

    async def burst(self) -> None:
        stale = "t_stale"  # a span of the epoch before the client's: never played
        await self.send(type="audio.start", turnId=stale, epoch=self.epoch - 1)
        for i in range(5):
            await self.ws.send_message(tone(FRAME, i * FRAME, amplitude=0.9))
        await self.send(type="audio.end", turnId=stale, sentMs=100)
        turn = await self._start()
        samples = 2 * OUTPUT_RATE
        for start in range(0, samples, FRAME):
            await self.ws.send_message(tone(FRAME, start))
        await trio.sleep(0.4)
        self.epoch += 1  # a server-side interrupt raises the epoch
        await self._end(turn, samples, "interrupted")


class _Page(http.server.BaseHTTPRequestHandler):
    """vrt's HTTP front, over http.server: the browser client's files (a page of this
    origin imports /vrt.js)."""

    def do_GET(self) -> None:
        headers = {k.lower().encode(): v.encode("latin-1") for k, v in self.headers.items()}
        response = respond(b"GET", self.path.split("?")[0], headers)
        self.send_response(response.status)
        for name, value in response.headers:
            self.send_header(name.decode(), value.decode())
        self.end_headers()
        self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # (the test reads the page's console)


@attrs.frozen
class AudioServer:
    url: str
    """The WebSocket's ws:// URL."""
    front: str
    """The HTTP front's, as ``tests/test_browser.open_page`` takes a server's (ws://): its
    pages are of the origin that serves /vrt.js (http://127.0.0.1, a secure context)."""
    heard: Heard


@contextmanager
def audio_server() -> Iterator[AudioServer]:
    """The WebSocket server (trio, in a thread) and the page's HTTP server (in another)."""
    heard = Heard()
    ready: list[Any] = []
    started = threading.Event()

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            await _Session(ws, heard).run()
        except ConnectionClosed:
            pass

    async def main() -> None:
        with trio.CancelScope() as scope:
            serve = functools.partial(serve_websocket, handler, "127.0.0.1", 0, ssl_context=None)
            async with trio.open_nursery() as nursery:
                server = await nursery.start(serve)
                ready.extend([server.port, trio.lowlevel.current_trio_token(), scope])
                started.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert started.wait(10)
    port, token, scope = ready
    front = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    pages = threading.Thread(target=front.serve_forever, daemon=True)
    pages.start()
    try:
        yield AudioServer(
            f"ws://127.0.0.1:{port}/", f"ws://127.0.0.1:{front.server_address[1]}/", heard
        )
    finally:
        front.shutdown()
        front.server_close()
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(10)
