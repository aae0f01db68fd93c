"""``FakeRealtime``: a loopback WebSocket server that plays scripts as a realtime model.

A realtime agent is tested through its real adapter over a real WebSocket: the server
speaks the OpenAI Realtime API (GA) or the Gemini Live API, replays ``vrt.say`` /
``vrt.call`` / ``vrt.pause`` steps, one step per response, hears the user through an
energy-based voice detector on the audio the client sends, and can be told to hear the
user, to drop the connection, and to behave as real servers sometimes do (``quirks``).
It records what it was sent and every misuse of the protocol by the client.

The servers themselves are sans-IO (``_realtime_openai``, ``_realtime_gemini``, on the
common ground of ``_realtime_core``); this module only serves them over trio-websocket.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    wrap_server_stream,
)

from vrt._net.accept import abort
from vrt.models._scripted import ScriptItem
from vrt.testing import _realtime_gemini, _realtime_openai
from vrt.testing._loopback import LoopbackServer
from vrt.testing._realtime_core import QUIRKS, Config, Script, ServerCore

log = logging.getLogger("vrt.testing")

APIS = ("openai", "gemini")
MAX_FRAME = 16 * 1024 * 1024
"""Frames over 16 MiB are refused (the connection is closed with 1009)."""
HANDSHAKE_TIMEOUT = 10.0
"""Seconds a client has for its upgrade request (and, for Gemini, its ``setup``)."""
CLOSE_TIMEOUT = 2.0
"""Seconds a client has to answer a close."""
SEND_TIMEOUT = 10.0
"""Seconds a client may leave a message unread (TCP full) before it is dropped."""
_SECRET_PARAMS = {"key", "api_key", "apikey", "access_token", "token"}


@attrs.define(eq=False)
class _Connection:
    ws: WebSocketConnection
    server: ServerCore
    stream: trio.SocketStream
    scope: trio.CancelScope
    wake: trio.Event = attrs.Factory(trio.Event)
    gone: trio.Event = attrs.Factory(trio.Event)
    drained: trio.Event = attrs.Factory(trio.Event)
    """Set whenever the sender finds the server's outbox empty."""
    closed: trio.Event = attrs.Factory(trio.Event)
    """Set once the server's close is done (the client answered, or the time ran out)."""
    dropped: bool = False

    def poke(self) -> None:
        """Something arrived: the sender looks at its server again."""
        self.wake.set()


class FakeRealtime(LoopbackServer):
    """Play ``steps`` as a realtime model's server: ``api="openai"`` (the Realtime API,
    GA) or ``"gemini"`` (the Live API), one step per response, then ``say("ok")``.

    ``async with FakeRealtime(steps, api=...) as fake:`` serves on 127.0.0.1 (a free port)
    and gives :attr:`url` (``ws://127.0.0.1:PORT/v1/realtime``, to which the client adds
    ``?model=...``; for Gemini the ``BidiGenerateContent`` path), :attr:`received` (every
    message the clients sent, decoded, in order, across connections), :attr:`headers`
    (each connection's), :attr:`connections`, :attr:`responses` (responses started),
    :attr:`audio_received` (bytes of audio heard) and :attr:`violations`. It stops at the
    end of the block, closing what is still open (1001).

    What each API does, event by event, is told in ``_realtime_openai`` and
    ``_realtime_gemini`` (the server sends the real events in the real order, with the
    real error codes where they are known). In short: OpenAI sends ``session.created``,
    answers ``session.update``, ``conversation.item.create`` (refusing an output for a
    call the conversation lacks or has answered), ``response.create`` (refused while a
    response is active), ``response.cancel`` (refused with none),
    ``conversation.item.truncate`` (refused past the audio it sent); a ``say`` is an
    assistant message (audio chunks and transcript, or text, after the session's
    ``output_modalities``), a ``call`` a function call item streaming its arguments in
    ``chunks`` pieces (``truncate=True``: cut off there, the item and the response
    ``incomplete``). Gemini wants ``setup`` first, answers ``clientContent`` that
    completes a turn, sends a step's calls in one ``toolCall`` and waits for the
    ``toolResponse`` answering them all before the next step.

    The voice detector: the RMS of each 20 ms of the PCM16 a client sends (OpenAI
    ``input_audio_buffer.append`` at 24 kHz; Gemini ``realtimeInput.audio`` at the rate its
    mime type says) is compared with ``vad_threshold`` (full scale 1.0); 100 ms of loud
    audio is the user starting, the silence the session sets (OpenAI
    ``silence_duration_ms``, 500 by default; Gemini ``silenceDurationMs``, else 300 ms) the
    user stopping. Speech during a response interrupts it (OpenAI: when turn detection's
    ``interrupt_response`` is on, ``response.done`` ``cancelled``; Gemini
    ``interrupted``, ``toolCallCancellation`` for the calls it waited answers for, then
    ``turnComplete``), and its end starts the next response, with the user's transcript
    (:meth:`user_said`, else ``"(speech)"``) where the session asked for one. The test can
    say the same without audio: :meth:`speech_started`, :meth:`speak`.

    The fake's voice: a 400 Hz tone, 60 ms a word, in chunks of ``chunk_ms``; ``audio``
    False: text instead, until the client's session says otherwise (OpenAI
    ``output_modalities``, Gemini ``responseModalities``); ``delay`` paces every message
    of a response. ``quirks`` (any of them): ``"no-created"`` (OpenAI:
    a response without ``response.created``), ``"no-cancellation"`` (Gemini: no
    ``toolCallCancellation``, ever), ``"late-cancellation"`` (Gemini: the
    cancellation and ``turnComplete`` come 0.3 s after ``interrupted``; an answer to a
    cancelled call in between is a violation), ``"duplicate-call"`` (the same call twice: OpenAI a
    second function call item with the same ``call_id``; Gemini the ``toolCall`` sent
    twice), ``"late-done"`` (OpenAI: after a cancel, the open item's last events, or the
    last item's ``response.output_item.done``, arrive after ``response.done``).

    ``key``: the connection must carry it (OpenAI ``Authorization: Bearer KEY``; Gemini
    ``x-goog-api-key: KEY``), else the upgrade is refused with HTTP 401; a key in the URL
    is refused too, and is a violation whether or not ``key`` is given.

    Every wait on a client has a deadline: its upgrade request and Gemini's ``setup``
    (:data:`HANDSHAKE_TIMEOUT`), its answer to a close (:data:`CLOSE_TIMEOUT`), a message
    it leaves unread (:data:`SEND_TIMEOUT`, then it is dropped); a client may stay idle.
    """

    def __init__(
        self,
        steps: Sequence[Sequence[ScriptItem]],
        *,
        api: str = "openai",
        audio: bool = True,
        quirks: Iterable[str] = (),
        vad_threshold: float = 0.02,
        chunk_ms: int = 20,
        delay: float = 0.0,
        key: str | None = None,
    ) -> None:
        if api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")
        chosen = frozenset(quirks)
        if not chosen <= QUIRKS:
            raise ValueError(f"unknown quirks {sorted(chosen - QUIRKS)}; known: {sorted(QUIRKS)}")
        if chunk_ms < 1:
            raise ValueError("chunk_ms must be >= 1")
        self.api = api
        self.key = key
        self.config = Config(
            audio=audio,
            quirks=chosen,
            vad_threshold=vad_threshold,
            chunk_ms=chunk_ms,
            delay=delay,
        )
        self.script = Script(steps)
        super().__init__()
        self.received: list[Any] = []
        """Every message the clients sent, decoded (a frame that was not JSON: as it came),
        in order, across connections."""
        self.headers: list[dict[str, str]] = []
        """Each connection's upgrade request headers (names lower-case), refused ones too."""
        self.violations: list[str] = []
        """Every misuse of the protocol by a client, as a short sentence: a test asserts it
        empty. OpenAI's server also answers each with its ``error`` event."""
        self.connections = 0
        """Connections accepted (past the upgrade)."""
        self._servers: list[ServerCore] = []
        self._open: list[_Connection] = []

    # -- what a test reads -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Where the client connects (OpenAI: add ``?model=...``)."""
        path = _realtime_openai.PATH if self.api == "openai" else _realtime_gemini.PATHS[0]
        return f"ws://127.0.0.1:{self.port}{path}"

    @property
    def responses(self) -> int:
        """Responses the fake started (steps played, a Gemini step after a
        ``toolResponse`` included)."""
        return self.script.served

    @property
    def audio_received(self) -> int:
        """Bytes of PCM the clients sent (decoded), across connections."""
        return sum(server.audio_received for server in self._servers)

    # -- what a test does --------------------------------------------------------------------

    def speech_started(self) -> None:
        """The voice detector of the current connection hears the user start, as if the
        audio said so (OpenAI ``input_audio_buffer.speech_started``; during a response,
        the interruption). With OpenAI's turn detection off, nothing: no detector runs."""
        connection = self._current()
        connection.server.speech_started()
        connection.poke()

    async def speak(self, text: str | None = None) -> None:
        """The user says something on the current connection: speech starts, then stops,
        with ``text`` as its transcript if given. Returns once the server has sent what
        each of the two causes at once (not the response it starts).

        Cancelled: the speech may have started and not stopped.
        """
        connection = self._current()
        if text is not None:
            connection.server.user_said(text)
        connection.server.speech_started()
        await _flushed(connection)
        connection.server.speech_stopped()
        await _flushed(connection)

    def user_said(self, text: str) -> None:
        """The transcript of the user's next utterance on the current connection (else
        ``"(speech)"``), sent where the session asked for transcripts."""
        self._current().server.user_said(text)

    async def drop(self) -> None:
        """Close the current connection abruptly (no close frame: the socket is reset), as
        a network failure would. Returns once the connection is gone.

        Cancelled: the connection is dropped all the same, maybe not gone yet.
        """
        connection = self._current()
        connection.dropped = True
        connection.scope.cancel()
        with trio.fail_after(CLOSE_TIMEOUT):
            await connection.gone.wait()

    def _current(self) -> _Connection:
        if not self._open:
            raise RuntimeError("no connection is open")
        return self._open[-1]

    # -- serving -----------------------------------------------------------------------------

    async def _closing(self) -> None:
        """Its open connections get a close (1001) and a moment to finish it."""
        with trio.move_on_after(CLOSE_TIMEOUT) as closing:
            closing.shield = True
            for connection in list(self._open):
                if connection.server.closing is None:
                    connection.server.closing = (1001, "the fake is shutting down")
                connection.poke()
            for connection in list(self._open):
                await connection.gone.wait()

    async def _connection(self, stream: trio.SocketStream) -> None:
        connection: _Connection | None = None
        try:
            async with trio.open_nursery() as nursery:  # trio-websocket's reader task
                with trio.move_on_after(HANDSHAKE_TIMEOUT):
                    request = await wrap_server_stream(nursery, stream, max_message_size=MAX_FRAME)
                    server = await self._upgrade(request)
                    if server is not None:
                        ws = await request.accept()
                        connection = _Connection(
                            ws=ws, server=server, stream=stream, scope=nursery.cancel_scope
                        )
                if connection is not None:
                    await self._serve(connection, nursery)
                nursery.cancel_scope.cancel()
        except Exception as exc:  # what a client sends can break trio-websocket's reader
            log.debug("fake realtime connection dropped: %r", exc)
        finally:
            if connection is not None:
                if connection in self._open:
                    self._open.remove(connection)
                connection.gone.set()
                connection.drained.set()
            if connection is not None and connection.dropped:
                abort(stream)
            else:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                    await stream.aclose()

    async def _upgrade(self, request: WebSocketRequest) -> ServerCore | None:
        """Check the upgrade request: the server for it, or None once refused."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        self.headers.append(headers)
        path, _, query = request.path.partition("?")
        params = dict(parse_qsl(query))
        paths = (_realtime_openai.PATH,) if self.api == "openai" else _realtime_gemini.PATHS
        if path not in paths:
            await _reject(request, 404, "not_found", f"no realtime endpoint at {path}")
            return None
        leaked = sorted(
            name
            for name, value in params.items()
            if name.lower() in _SECRET_PARAMS or (self.key is not None and value == self.key)
        )
        if leaked:
            self.violations.append(f"a key in the URL ({', '.join(leaked)})")
            await _reject(request, 401, "invalid_api_key", "API keys go in a header, not the URL")
            return None
        if self.key is not None:
            if self.api == "openai":
                good = headers.get("authorization") == f"Bearer {self.key}"
            else:
                good = headers.get("x-goog-api-key") == self.key
            if not good:
                await _reject(request, 401, "invalid_api_key", "Incorrect API key provided.")
                return None
        server: ServerCore
        if self.api == "openai":
            model = params.get("model", "gpt-realtime")
            server = _realtime_openai.OpenAIServer(self.script, self.config, self.violations, model)
        else:
            server = _realtime_gemini.GeminiServer(self.script, self.config, self.violations)
        return server

    async def _serve(self, connection: _Connection, nursery: trio.Nursery) -> None:
        self.connections += 1
        self._open.append(connection)
        self._servers.append(connection.server)
        connection.server.opened()
        nursery.start_soon(self._send, connection)
        await self._receive(connection)

    async def _receive(self, connection: _Connection) -> None:
        """Take the client's messages until it leaves; Gemini's ``setup`` must come within
        :data:`HANDSHAKE_TIMEOUT`."""
        ws, server = connection.ws, connection.server
        deadline = trio.current_time() + HANDSHAKE_TIMEOUT
        try:
            while True:
                frame: str | bytes | None = None
                with trio.move_on_at(deadline if server.awaiting_setup else float("inf")):
                    frame = await ws.get_message()
                if frame is None:
                    server.violation(f"no setup within {HANDSHAKE_TIMEOUT:g} s")
                    server.closing = (1008, "no setup in time")
                    connection.poke()
                    await trio.sleep_forever()  # until the sender has closed
                    return
                try:
                    message = json.loads(frame)
                except ValueError:
                    self.received.append(frame)
                    if server.closing is None:
                        server.malformed("a frame that is not JSON")
                else:
                    self.received.append(message)
                    if server.closing is None:  # the server stopped listening
                        server.receive(message)
                connection.poke()
        except ConnectionClosed as closed:
            if closed.reason is not None and closed.reason.code == 1009:
                server.violation("a frame over 16 MiB")
            if server.closing is not None:  # the sender is closing: let it hear the answer
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await connection.closed.wait()

    async def _send(self, connection: _Connection) -> None:
        """Pump the server: its messages out, its pauses slept, until it closes."""
        ws, server = connection.ws, connection.server
        try:
            while True:
                if not server.outbox:
                    connection.drained.set()
                out = server.pull(trio.current_time())
                if isinstance(out, dict):
                    text = json.dumps(out)
                    with trio.move_on_after(SEND_TIMEOUT) as sending:
                        await ws.send_message(text.encode() if server.binary else text)
                    if sending.cancelled_caught:
                        server.violation(f"the client read nothing for {SEND_TIMEOUT:g} s")
                        connection.dropped = True
                        connection.scope.cancel()
                        return
                    continue
                if server.closing is not None:
                    code, reason = server.closing
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await ws.aclose(code, reason)
                    connection.closed.set()
                    connection.scope.cancel()
                    return
                connection.wake = trio.Event()
                with trio.move_on_at(float("inf") if out is None else out):
                    await connection.wake.wait()
        except ConnectionClosed:
            return


async def _reject(request: WebSocketRequest, status: int, code: str, message: str) -> None:
    body = json.dumps(
        {"error": {"type": "invalid_request_error", "code": code, "message": message}}
    )
    try:
        await request.reject(
            status, extra_headers=[(b"content-type", b"application/json")], body=body.encode()
        )
    except (ConnectionClosed, trio.BrokenResourceError):
        pass


async def _flushed(connection: _Connection) -> None:
    """Wait until the connection's server has sent what it had to say at once."""
    connection.drained = trio.Event()
    connection.poke()
    with trio.fail_after(CLOSE_TIMEOUT):
        await connection.drained.wait()
