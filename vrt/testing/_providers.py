"""``FakeProvider``: a loopback HTTP server that plays scripts in a real provider's format.

An agent is tested through the real adapter over real HTTP: the server speaks Chat
Completions (with the quirks of OpenAI, vLLM, Ollama or llama.cpp), the Responses API or
Anthropic Messages, streaming Server-Sent Events over chunked HTTP/1.1 (h11), and replays
``vrt.say`` / ``vrt.call`` / ``vrt.pause`` steps, one step per request. It records each
request's JSON body and headers, counts the streams the client closed early (and when it
noticed each, on Trio's clock), and can answer an HTTP error or break a stream on cue.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import h11
import trio

from vrt.models._scripted import Pause, Say, ScriptedCall, ScriptItem
from vrt.testing._loopback import LoopbackServer

APIS = ("openai-chat", "openai-responses", "anthropic")
DIALECTS = ("openai", "vllm", "ollama", "llamacpp")
_PATHS = {
    "openai-chat": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
    "anthropic": "/v1/messages",
}
_MAX_BODY = 16 * 1024 * 1024


@attrs.frozen(kw_only=True)
class HTTPFailure:
    """A step the provider answers with an HTTP error (see :meth:`FakeProvider.http_error`)."""

    status: int
    message: str = "the fake provider failed on purpose"
    retry_after: float | None = None


@attrs.frozen(kw_only=True)
class StreamFailure:
    """An item that makes the stream send the API's error event and end there, or (with
    ``hang_up``) drop the connection mid-stream."""

    message: str = "the model is overloaded"
    hang_up: bool = False


class _HungUp(Exception):
    """The script dropped the connection."""


Step = Sequence[ScriptItem | StreamFailure] | HTTPFailure


class FakeProvider(LoopbackServer):
    """Replay ``steps`` as ``api`` does (Chat Completions in the ``dialect`` of OpenAI,
    vLLM, Ollama or llama.cpp), one step per request, then empty steps.

    ``async with FakeProvider(steps) as provider:`` serves on 127.0.0.1 (a free port) and
    gives :attr:`base_url` (what the adapter's ``base_url`` takes), :attr:`requests` (the
    JSON bodies received), :attr:`headers`, :attr:`disconnects` (streams the client closed
    before their end) and :attr:`disconnected_at` (``trio.current_time()`` when each was
    noticed). A step may be :meth:`http_error` (an HTTP error answer), and an item
    :meth:`stream_error` (the error event, mid-stream). ``delay`` paces every event.

    The dialects (Chat Completions only): ``openai`` as the API documents it; ``vllm``
    numbers calls 1, 3, 5... and sends the last argument fragment with the finish reason;
    ``ollama`` sends each call whole in one chunk, every one at index 0 with a new id, its
    arguments as an object, and says ``finish_reason: "stop"`` after calls; ``llamacpp``
    sends no call ids and repeats an empty name in every delta.

    ``usage=(input, output)``: every Chat Completions stream ends with a usage chunk, as
    OpenAI's does with ``stream_options.include_usage``.
    """

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        api: str = "openai-chat",
        dialect: str = "openai",
        delay: float = 0.0,
        usage: tuple[int, int] | None = None,
    ) -> None:
        if api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, not {dialect!r}")
        if dialect != "openai" and api != "openai-chat":
            raise ValueError("a dialect other than 'openai' is for api='openai-chat' only")
        self.steps = [step if isinstance(step, HTTPFailure) else list(step) for step in steps]
        self.api = api
        self.dialect = dialect
        self.delay = delay
        self.usage = usage
        super().__init__()
        self.requests: list[Any] = []
        """The JSON body of every request received, in order."""
        self.headers: list[dict[str, str]] = []
        """Every request's headers (names lower-case)."""
        self.disconnects = 0
        """Streams the client closed before the provider ended them."""
        self.disconnected_at: list[float] = []
        self._served = 0
        self._calls = 0

    # -- markers -----------------------------------------------------------------------------------

    @staticmethod
    def http_error(
        status: int,
        *,
        message: str = "the fake provider failed on purpose",
        retry_after: float | None = None,
    ) -> HTTPFailure:
        """A step answered with HTTP ``status`` (and ``retry-after`` if given)."""
        return HTTPFailure(status=status, message=message, retry_after=retry_after)

    @staticmethod
    def stream_error(message: str = "the model is overloaded") -> StreamFailure:
        """An item: the API's error event, then the stream ends."""
        return StreamFailure(message=message)

    @staticmethod
    def hang_up() -> StreamFailure:
        """An item: the connection is dropped there, mid-stream (no end of the body)."""
        return StreamFailure(hang_up=True)

    # -- serving -----------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """What the adapter's ``base_url`` takes (``/v1`` for the OpenAI APIs)."""
        root = f"http://127.0.0.1:{self.port}"
        return root if self.api == "anthropic" else f"{root}/v1"

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._request(conn, stream)
                if request is None:
                    return
                await self._answer(conn, stream, *request)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, _HungUp):
            return
        finally:
            await stream.aclose()

    async def _request(
        self, conn: h11.Connection, stream: trio.SocketStream
    ) -> tuple[h11.Request, bytes] | None:
        request: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > _MAX_BODY:
                    return None
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, body
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> None:
        path = request.target.decode("latin-1").split("?")[0]
        if request.method != b"POST" or path != _PATHS[self.api]:
            await _send_json(conn, stream, 404, {"error": {"message": f"no route {path}"}})
            return
        try:
            self.requests.append(json.loads(body))
        except ValueError:
            await _send_json(conn, stream, 400, {"error": {"message": "the body is not JSON"}})
            return
        self.headers.append(
            {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        )
        step = self.steps[self._served] if self._served < len(self.steps) else []
        self._served += 1
        if isinstance(step, HTTPFailure):
            extra = [] if step.retry_after is None else [("retry-after", f"{step.retry_after:g}")]
            error = {"error": {"message": step.message, "type": "fake_error"}}
            await _send_json(conn, stream, step.status, error, extra)
            return
        head = h11.Response(
            status_code=200,
            headers=[("content-type", "text/event-stream"), ("cache-control", "no-cache")],
        )
        await stream.send_all(conn.send(head) or b"")
        await self._stream(conn, stream, self._events(step))

    async def _stream(
        self, conn: h11.Connection, stream: trio.SocketStream, events: Iterator[bytes | float]
    ) -> None:
        """Send ``events`` (SSE bytes, or seconds to pause), watching for the client's
        close the whole time: a close during a pause is noticed at once."""
        closed = trio.Event()

        async def watch() -> None:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                closed.set()
            else:
                conn.receive_data(data)  # the next request, early: h11 keeps it

        disconnected = hung_up = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            try:
                with trio.CancelScope() as sending:
                    nursery.start_soon(_cancel_when, closed, sending)
                    for item in events:
                        if item is _HANG_UP:
                            hung_up = True
                            break
                        if isinstance(item, float):
                            await trio.sleep(item)
                            continue
                        if self.delay:
                            await trio.sleep(self.delay)
                        await stream.send_all(conn.send(h11.Data(data=item)) or b"")
                    else:
                        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                disconnected = sending.cancelled_caught
            except trio.BrokenResourceError:
                disconnected = True
            finally:
                nursery.cancel_scope.cancel()
        # Raised out here: inside the nursery it would come wrapped in a group.
        if disconnected:
            self.disconnects += 1
            self.disconnected_at.append(trio.current_time())
            raise trio.BrokenResourceError("the client closed the stream")
        if hung_up:
            raise _HungUp

    # -- the wire formats ------------------------------------------------------------------------

    def _events(self, step: Sequence[ScriptItem | StreamFailure]) -> Iterator[bytes | float]:
        for index, item in enumerate(step):
            if isinstance(item, StreamFailure) and item.hang_up:
                # What the items before it send, without the format's closing events
                # (a finish chunk and [DONE], message_delta and message_stop, or
                # response.completed), then the connection drops.
                before = list(self._format(step[:index]))
                closing = 1 if self.api == "openai-responses" else 2
                return iter([*before[:-closing], _HANG_UP])
        return self._format(step)

    def _format(self, step: Sequence[ScriptItem | StreamFailure]) -> Iterator[bytes | float]:
        if self.api == "openai-chat":
            return self._chat(step)
        if self.api == "anthropic":
            return self._anthropic(step)
        return self._responses(step)

    def _next_id(self) -> int:
        self._calls += 1
        return self._calls

    def _chat(self, step: Sequence[ScriptItem | StreamFailure]) -> Iterator[bytes | float]:
        dialect = self.dialect

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0}
            return _data({**base, "model": "fake", "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        calls = 0
        held: dict[str, Any] | None = None  # vllm: the last fragment, sent with the finish
        for item in step:
            if isinstance(item, Say):
                for part in _halves(item.text):
                    yield chunk({"content": part})
            elif isinstance(item, Pause):
                yield float(item.seconds)
            elif isinstance(item, StreamFailure):
                yield _data({"error": {"message": item.message, "type": "server_error"}})
                return
            elif isinstance(item, ScriptedCall):
                number = self._next_id()
                index = {"vllm": 2 * calls + 1, "ollama": 0}.get(dialect, calls)
                calls += 1
                text = _text(item)
                parts = _parts(text, item)
                if dialect == "ollama":
                    if item.truncate:  # Ollama parses calls out of the text: a cut one is none
                        yield chunk({}, "length")
                        yield b"data: [DONE]\n\n"
                        return
                    arguments: Any = item.arguments if isinstance(item.arguments, dict) else text
                    whole = {"index": 0, "id": f"call_{number}", "type": "function"}
                    whole["function"] = {"name": item.name, "arguments": arguments}
                    yield chunk({"tool_calls": [whole]})
                    continue
                first: dict[str, Any] = {"index": index, "type": "function"}
                if dialect != "llamacpp":
                    first["id"] = f"call_{number}"
                first["function"] = {"name": item.name, "arguments": ""}
                yield chunk({"tool_calls": [first]})
                for i, part in enumerate(parts):
                    function: dict[str, Any] = {"arguments": part}
                    if dialect == "llamacpp":
                        function["name"] = ""  # repeated, empty: must not be concatenated
                    piece = {"index": index, "function": function}
                    if dialect == "vllm" and i == len(parts) - 1 and not item.truncate:
                        held = piece
                    else:
                        yield chunk({"tool_calls": [piece]})
                if item.truncate:
                    yield chunk({}, "length")
                    yield b"data: [DONE]\n\n"
                    return
                if held is not None and item is not step[-1]:
                    yield chunk({"tool_calls": [held]})
                    held = None
        finish = "stop" if dialect == "ollama" or calls == 0 else "tool_calls"
        yield chunk({"tool_calls": [held]} if held is not None else {}, finish)
        if self.usage is not None:  # what stream_options.include_usage adds: a last chunk
            given, made = self.usage
            counts = {"prompt_tokens": given, "completion_tokens": made}
            yield _data({"id": "chatcmpl-fake", "choices": [], "usage": counts})
        yield b"data: [DONE]\n\n"

    def _anthropic(self, step: Sequence[ScriptItem | StreamFailure]) -> Iterator[bytes | float]:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

        message = {"id": "msg_fake", "type": "message", "role": "assistant", "content": []}
        yield event("message_start", {"message": {**message, "model": "fake"}})
        yield event("ping", {})
        index = 0
        used_tools = False
        for item in step:
            if isinstance(item, Say):
                yield event(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
                for part in _halves(item.text):
                    delta = {"type": "text_delta", "text": part}
                    yield event("content_block_delta", {"index": index, "delta": delta})
                yield event("content_block_stop", {"index": index})
                index += 1
            elif isinstance(item, Pause):
                yield float(item.seconds)
                yield event("ping", {})
            elif isinstance(item, StreamFailure):
                error = {"type": "overloaded_error", "message": item.message}
                yield event("error", {"error": error})
                return
            elif isinstance(item, ScriptedCall):
                used_tools = True
                block = {"type": "tool_use", "id": f"toolu_{self._next_id()}", "name": item.name}
                yield event(
                    "content_block_start", {"index": index, "content_block": {**block, "input": {}}}
                )
                for part in _parts(_text(item), item):
                    delta = {"type": "input_json_delta", "partial_json": part}
                    yield event("content_block_delta", {"index": index, "delta": delta})
                yield event("content_block_stop", {"index": index})  # cut off or whole
                if item.truncate:
                    yield event("message_delta", {"delta": {"stop_reason": "max_tokens"}})
                    yield event("message_stop", {})
                    return
                index += 1
        stop = "tool_use" if used_tools else "end_turn"
        yield event(
            "message_delta", {"delta": {"stop_reason": stop}, "usage": {"output_tokens": 1}}
        )
        yield event("message_stop", {})

    def _responses(self, step: Sequence[ScriptItem | StreamFailure]) -> Iterator[bytes | float]:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

        yield event("response.created", {"response": {"id": "resp_fake", "status": "in_progress"}})
        for index, item in enumerate(step):
            if isinstance(item, Say):
                message = {
                    "type": "message",
                    "id": f"msg_{index}",
                    "role": "assistant",
                    "content": [],
                }
                yield event("response.output_item.added", {"output_index": index, "item": message})
                for part in _halves(item.text):
                    where = {"item_id": f"msg_{index}", "output_index": index, "content_index": 0}
                    yield event("response.output_text.delta", {**where, "delta": part})
                yield event("response.output_item.done", {"output_index": index, "item": message})
            elif isinstance(item, Pause):
                yield float(item.seconds)
            elif isinstance(item, StreamFailure):
                yield event("error", {"code": "server_error", "message": item.message})
                return
            elif isinstance(item, ScriptedCall):
                number = self._next_id()
                text = _text(item)
                call = {
                    "type": "function_call",
                    "id": f"fc_{number}",
                    "call_id": f"call_{number}",
                    "name": item.name,
                    "arguments": "",
                    "status": "in_progress",
                }
                yield event("response.output_item.added", {"output_index": index, "item": call})
                for part in _parts(text, item):
                    where = {"item_id": f"fc_{number}", "output_index": index}
                    yield event("response.function_call_arguments.delta", {**where, "delta": part})
                if item.truncate:
                    partial = {**call, "arguments": "".join(_parts(text, item))}
                    cut = {"output_index": index, "item": {**partial, "status": "incomplete"}}
                    yield event("response.output_item.done", cut)
                    details = {"reason": "max_output_tokens"}
                    response = {"status": "incomplete", "incomplete_details": details}
                    yield event("response.incomplete", {"response": response})
                    return
                where = {"item_id": f"fc_{number}", "output_index": index}
                yield event("response.function_call_arguments.done", {**where, "arguments": text})
                done = {**call, "arguments": text, "status": "completed"}
                yield event("response.output_item.done", {"output_index": index, "item": done})
        yield event("response.completed", {"response": {"id": "resp_fake", "status": "completed"}})


_HANG_UP = b""


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _send_json(
    conn: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    body: Any,
    headers: Sequence[tuple[str, str]] = (),
) -> None:
    data = json.dumps(body).encode()
    response = h11.Response(
        status_code=status,
        headers=[
            ("content-type", "application/json"),
            ("content-length", str(len(data))),
            *headers,
        ],
    )
    await stream.send_all((conn.send(response) or b"") + (conn.send(h11.Data(data=data)) or b""))
    await stream.send_all(conn.send(h11.EndOfMessage()) or b"")


def _data(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _text(item: ScriptedCall) -> str:
    return item.arguments if isinstance(item.arguments, str) else json.dumps(item.arguments)


def _parts(text: str, item: ScriptedCall) -> list[str]:
    """The argument fragments a call streams (one when not streamed; half when cut off)."""
    if not item.stream:
        parts = [text]
    else:
        size = max(1, -(-len(text) // max(1, item.chunks)))
        parts = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    if item.truncate:
        parts = parts[: max(1, len(parts) // 2)]
        parts[-1] = parts[-1][: max(1, len(parts[-1]) // 2)]
    return [part for part in parts if part]


def _halves(text: str) -> list[str]:
    """A text in two pieces (a model streams text in pieces), or one if it is short."""
    middle = len(text) // 2
    return [text] if middle < 2 else [text[:middle], text[middle:]]
