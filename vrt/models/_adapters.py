"""The model adapters: a provider's HTTP streaming API as a :class:`vrt.Model`.

Each adapter only pumps: it posts the body its sans-IO module builds, feeds the response
through :class:`~vrt.models._sse.SSEDecoder` and the provider's mapper, and yields what
comes out. What it owns is the HTTP: one ``httpx2`` client per adapter (or the one you
inject), the retries before a step's first event, the timeouts, and closing the response
at once when the step is cancelled (an interrupt), so the provider stops generating.

Why httpx2: it is the maintained fork of httpx (httpx has had no release since December
2024), the one the OpenAI and Anthropic SDKs moved to, and it runs under Trio (anyio's
Trio backend). Not the vendor SDKs: they bring pydantic and an event layer of their own
between the socket and the engine, and cancellation must stay exact.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import httpx2
import trio

from vrt._core.bounded import RecentSet
from vrt._errors import ModelError
from vrt.models._anthropic import AnthropicMapper, anthropic_body
from vrt.models._chat import ChatMapper, MakeId, chat_body
from vrt.models._protocol import ModelEvent, ModelRequest
from vrt.models._responses import ResponsesMapper, responses_body
from vrt.models._sse import SSEDecoder, SSEEvent

log = logging.getLogger("vrt.models")

RETRIES = 2
"""Tries after the first, before a step's first event: on 408, 409, 429 and 5xx answers,
and when the connection fails or drops before an answer."""
BACKOFF = 0.5
"""The first retry's delay, doubling; a ``retry-after`` is honoured up to RETRY_AFTER_MAX."""
RETRY_AFTER_MAX = 10.0
MESSAGE_LIMIT = 240
"""Characters of a provider's error message kept (after the key is redacted)."""
ERROR_BODY_LIMIT = 64 * 1024
"""Bytes of an error response read for its message (the rest is not)."""
_RETRYABLE = frozenset({408, 409, 429})  # and every 5xx
_DROPPED = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.RemoteProtocolError,
    httpx2.ReadError,
    httpx2.WriteError,
)
"""The connection failed or dropped before an answer (a proxy or a load balancer closing
an idle kept-alive connection): tried again, like the provider SDKs do."""
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class CallIds:
    """A provider's call ids as vrt call ids: the same when unique in the session (and
    sane: at most 64 letters, digits and ``_.:-``), else made unique; one when it sent none.
    """

    def __init__(self) -> None:
        self._seen: dict[str, RecentSet[str]] = {}

    def maker(self, request: ModelRequest) -> MakeId:
        """The id maker of one step of ``request``'s session."""
        seen = self._seen.setdefault(request.session_id, RecentSet(10_000))
        count = 0

        def make(provider_id: str | None) -> str:
            nonlocal count
            count += 1
            base = (
                provider_id
                if provider_id is not None and _SAFE_ID.match(provider_id)
                else f"call_{request.turn_id}_{request.step}_{count}"
            )
            candidate, n = base, 1
            while candidate in seen:
                n += 1
                candidate = f"{base}_{n}"
            seen.add(candidate)
            return candidate

        return make

    def forget(self, session_id: str) -> None:
        """The session ended: its ids are free."""
        self._seen.pop(session_id, None)


class _Adapter:
    """An HTTP streaming model: the shared half of the three adapters."""

    _path = ""
    _key_variable = ""
    provider = ""
    """Who serves the API, as traces name it (``gen_ai.provider.name``)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str | None,
        client: httpx2.AsyncClient | None,
        extra_body: dict[str, Any] | None,
        timeout: float,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a model name, not {model!r}")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
        if not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if extra_body is not None and not isinstance(extra_body, dict):
            raise ValueError("extra_body must be a dict (merged into every request body)")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.extra_body = dict(extra_body or {})
        key = api_key if api_key is not None else os.environ.get(self._key_variable)
        key = key.strip() if isinstance(key, str) else key
        if key is not None and (not isinstance(key, str) or not key.isprintable()):
            raise ValueError("api_key must be a string of printable characters")
        self._api_key = key or None
        self._client = client
        self._own: httpx2.AsyncClient | None = None
        self._own_run: object = None
        self._ids = CallIds()

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    # -- what each provider says ------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _mapper(self, make_id: MakeId) -> Callable[[SSEEvent | None], list[ModelEvent]]:
        """``feed(event) -> events``; an event with data ``[DONE]``, or the end of the
        stream (a ``None`` event), ends it."""
        raise NotImplementedError

    # -- the model --------------------------------------------------------------------------------

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        """One model step over HTTP. Raises :class:`~vrt.ModelError` on a provider error
        (an HTTP status, an error event, a timeout, a lost connection). Cancelling it (an
        interrupt) closes the HTTP response at once."""
        try:
            async with contextlib.aclosing(self._events(request)) as events:
                async for event in events:
                    yield event
        except ModelError as exc:  # a provider may echo what it was sent: never the key
            message = _short(self._redact(exc.message))  # redacted before it is cut
            if message == exc.message:
                raise
            raise ModelError(message, status=exc.status) from None

    async def _events(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        body = {**self._body(request), **self.extra_body}
        feed = self._mapper(self._ids.maker(request))
        async with self._response(body) as response:
            decoder = SSEDecoder()
            try:
                # Every generator closed where it is left, never by the garbage collector:
                # an interrupt or an error stops the read at once.
                async with contextlib.aclosing(response.aiter_raw()) as chunks:
                    async for chunk in chunks:
                        for event in decoder.feed(chunk):
                            for out in feed(event):
                                yield out
                decoder.close()
            except httpx2.TimeoutException:
                raise ModelError(f"no data from the provider for {self.timeout:g} s") from None
            except httpx2.HTTPError as exc:
                raise ModelError(
                    f"the connection to the provider was lost ({_kind(exc)})"
                ) from None
            for out in feed(None):
                yield out

    def forget(self, session_id: str) -> None:
        """The engine says a session ended: forget its call ids."""
        self._ids.forget(session_id)

    async def aclose(self) -> None:
        """Close the adapter's own HTTP client (an injected one is yours to close)."""
        if self._own is not None:
            own, self._own = self._own, None
            await own.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- HTTP -------------------------------------------------------------------------------------

    def _http(self) -> httpx2.AsyncClient:
        if self._client is not None:
            return self._client
        run = trio.lowlevel.current_trio_token()
        if self._own is None or self._own_run is not run:
            # One client per trio.run: its connections belong to the run that made them.
            self._own = httpx2.AsyncClient(timeout=httpx2.Timeout(self.timeout))
            self._own_run = run
        return self._own

    @asynccontextmanager
    async def _response(self, body: dict[str, Any]) -> AsyncIterator[httpx2.Response]:
        """The response to ``body``, once its status is a success; 429, 5xx and connect
        errors are tried again (this is before the step's first event: nothing was
        yielded). Closed on the way out, at once, even when cancelled."""
        client = self._http()
        url = self.base_url + self._path
        content = json.dumps(body).encode()
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "accept-encoding": "identity",  # the stream is read raw, byte by byte
        }
        headers.update(self._headers())
        delay = BACKOFF
        for attempt in range(RETRIES + 1):
            last = attempt == RETRIES
            try:
                request = client.build_request("POST", url, content=content, headers=headers)
                response = await client.send(request, stream=True)
            except _DROPPED as exc:
                if last and isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout):
                    raise ModelError(f"cannot connect to the provider ({_kind(exc)})") from None
                if last:
                    raise ModelError(
                        f"the provider closed the connection before answering ({_kind(exc)})"
                    ) from None
                log.info("model %s: no answer (%s); trying again", self.model, _kind(exc))
                await trio.sleep(delay)
                delay *= 2
                continue
            except httpx2.TimeoutException:
                raise ModelError(f"no answer from the provider for {self.timeout:g} s") from None
            except httpx2.HTTPError as exc:
                raise ModelError(f"the request to the provider failed ({_kind(exc)})") from None
            status = response.status_code
            if status < 400 and _is_stream(response):
                break
            try:
                text = await _read_bounded(response)
            finally:
                await _close(response)
            if (status in _RETRYABLE or status >= 500) and not last:
                wait = _retry_after(response, delay)
                log.info("model %s: HTTP %d; trying again in %.2g s", self.model, status, wait)
                await trio.sleep(wait)
                delay *= 2
                continue
            message = _error_text(status, self._redact(text.decode("utf-8", "replace")))
            raise ModelError(message, status=status)
        try:
            yield response
        finally:
            await _close(response)

    def _redact(self, text: str) -> str:
        key = self._api_key
        return text.replace(key, "***") if key else text


class _OpenAI(_Adapter):
    """What the two OpenAI APIs share: the base URL, the key, the header."""

    _key_variable = "OPENAI_API_KEY"
    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        client: httpx2.AsyncClient | None = None,
        extra_body: dict[str, Any] | None = None,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            client=client,
            extra_body=extra_body,
            timeout=timeout,
        )

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}


class OpenAIChat(_OpenAI):
    """OpenAI Chat Completions streaming, and every server that speaks it: vLLM, Ollama's
    ``/v1``, llama.cpp's server, LM Studio (see :mod:`vrt.models._chat` for the quirks it
    takes). ``api_key`` None: ``$OPENAI_API_KEY`` if set, else no Authorization header (a
    local server). ``extra_body`` merges into the top of every request body; ``timeout``
    is the seconds allowed to connect and between two reads of the stream. ``client``: an
    ``httpx2.AsyncClient`` of yours (proxies, TLS, limits), used with its own timeouts and
    yours to close; ``timeout`` applies to the adapter's own client only."""

    _path = "/chat/completions"

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        return chat_body(request, self.model)

    def _mapper(self, make_id: MakeId) -> Callable[[SSEEvent | None], list[ModelEvent]]:
        mapper = ChatMapper(make_id)

        def feed(event: SSEEvent | None) -> list[ModelEvent]:
            if event is None:
                return [] if mapper.finished else mapper.done()
            if event.data.strip() == "[DONE]":
                return mapper.done()
            if event.event == "error":  # llama.cpp's error: line, or an event so named
                return mapper.chunk(_error_event(event.data))
            return mapper.chunk(_json(event.data))

        return feed


class OpenAIResponses(_OpenAI):
    """The OpenAI Responses API, stateless (``store: false``, the whole input every step),
    posting to ``{base_url}/responses``; ``api_key`` None: ``$OPENAI_API_KEY``; the other
    options as :class:`OpenAIChat`'s."""

    _path = "/responses"

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        return responses_body(request, self.model)

    def _mapper(self, make_id: MakeId) -> Callable[[SSEEvent | None], list[ModelEvent]]:
        mapper = ResponsesMapper(make_id)

        def feed(event: SSEEvent | None) -> list[ModelEvent]:
            if event is None or event.data.strip() == "[DONE]":
                return mapper.end()
            return mapper.event(_json(event.data))

        return feed


class AnthropicMessages(_Adapter):
    """Anthropic Messages streaming, posting to ``{base_url}/v1/messages``; ``api_key``
    None: ``$ANTHROPIC_API_KEY``. ``max_tokens`` is required by the API."""

    _path = "/v1/messages"
    _key_variable = "ANTHROPIC_API_KEY"
    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str | None = None,
        max_tokens: int = 1024,
        client: httpx2.AsyncClient | None = None,
        extra_body: dict[str, Any] | None = None,
        timeout: float = 60.0,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a whole number of at least 1, not {max_tokens!r}")
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            client=client,
            extra_body=extra_body,
            timeout=timeout,
        )
        self.max_tokens = max_tokens

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": "2023-06-01"}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        return anthropic_body(request, self.model, self.max_tokens)

    def _mapper(self, make_id: MakeId) -> Callable[[SSEEvent | None], list[ModelEvent]]:
        mapper = AnthropicMapper(make_id)

        def feed(event: SSEEvent | None) -> list[ModelEvent]:
            if event is None:
                return mapper.end()
            return mapper.event(event.event, _json(event.data))

        return feed


# -- helpers -------------------------------------------------------------------------------------


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's json takes them


_DECODER = json.JSONDecoder(
    parse_constant=_not_json
)  # made once: json.loads(**kw) makes one a call


def _json(data: str) -> Any:
    try:
        return _DECODER.decode(data)
    except ValueError:
        raise ModelError("the provider's stream sent data that is not JSON") from None


def _error_event(data: str) -> dict[str, Any]:
    """An ``error`` event's data as a chunk carrying the error, JSON or not."""
    try:
        error = json.loads(data)
    except ValueError:
        error = data.strip() or "error"
    if isinstance(error, dict) and "error" in error:
        return error
    return {"error": error or "error"}


def _kind(exc: Exception) -> str:
    return type(exc).__name__


def _is_stream(response: httpx2.Response) -> bool:
    kind = response.headers.get("content-type", "")
    return "text/event-stream" in kind or not kind


async def _read_bounded(response: httpx2.Response) -> bytes:
    data = b""
    try:
        async with contextlib.aclosing(response.aiter_raw()) as chunks:
            async for chunk in chunks:
                data += chunk
                if len(data) >= ERROR_BODY_LIMIT:
                    break
    except httpx2.HTTPError:
        pass
    return data[:ERROR_BODY_LIMIT]


async def _close(response: httpx2.Response) -> None:
    """Close ``response`` now, shielded and bounded: on an interrupt the provider must see
    the connection end, whatever else is being cancelled."""
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        await response.aclose()


def _retry_after(response: httpx2.Response, default: float) -> float:
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return default
    return min(RETRY_AFTER_MAX, seconds) if math.isfinite(seconds) and seconds >= 0 else default


def _error_text(status: int, text: str) -> str:
    """A provider's error answer (redacted), short: its JSON ``error.message`` if it has
    one, else a line of plain text; never an HTML page or a body dump."""
    message = ""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            message = str(error.get("message") or error.get("type") or "")
        elif isinstance(error, str):
            message = error
    elif text and not text.lstrip().startswith("<"):
        message = text.strip().splitlines()[0] if text.strip() else ""
    return _short(message) or f"the provider answered HTTP {status}"


def _short(text: str) -> str:
    """One line of at most MESSAGE_LIMIT characters."""
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"
