"""The model adapters over real HTTP on loopback, against FakeProvider speaking each API and
dialect: whole turns, barge-in, retries, errors, timeouts, and secrets kept."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

import pytest
import trio

import vrt
from tests.conftest import drain
from tests.test_models_render import assert_valid
from vrt.testing import FakeProvider

pytestmark = pytest.mark.network

KEY = "sk-test-0123456789abcdef"
CASES = [
    ("openai-chat", "openai"),
    ("openai-chat", "vllm"),
    ("openai-chat", "ollama"),
    ("openai-chat", "llamacpp"),
    ("openai-responses", "openai"),
    ("anthropic", "openai"),
]
ADAPTERS: dict[str, Any] = {
    "openai-chat": vrt.models.OpenAIChat,
    "openai-responses": vrt.models.OpenAIResponses,
    "anthropic": vrt.models.AnthropicMessages,
}

weather_runs: list[Any] = []


@vrt.server_tool(
    risk="low",
    description="Weather now",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
async def weather(args: Any, ctx: vrt.ToolContext) -> Any:
    weather_runs.append(trio.current_time())
    return {"temp_c": 21, "city": args["city"]}


def adapter(provider: FakeProvider, **options: Any) -> Any:
    return ADAPTERS[provider.api](
        "fake-model", base_url=provider.base_url, api_key=KEY, timeout=2.0, **options
    )


async def play(
    provider: FakeProvider, text: str = "weather in Paris?", **options: Any
) -> tuple[vrt.TurnResult, list[Any], Any]:
    async with adapter(provider, **options) as model:
        agent = vrt.define_agent(model=model, tools=[weather], instructions="Be brief.")
        async with vrt.open_session(agent) as session, session.subscribe() as events:
            result = await (await session.start_turn(text)).wait()
            log = drain(events)
    return result, log, model


@pytest.mark.parametrize(("api", "dialect"), CASES)
async def test_a_whole_turn_through_each_api_and_dialect(api: str, dialect: str) -> None:
    """A streamed server call (arguments-delta phases), its result in the next request in
    the API's own format, and the model's text as TextDelta."""
    steps = [
        [vrt.say("Let me check."), vrt.call("weather", {"city": "Paris"}, chunks=3)],
        [vrt.say("It is 21 degrees.")],
    ]
    async with FakeProvider(steps, api=api, dialect=dialect) as provider:
        result, log, _ = await play(provider)
    assert result.status == "finished"
    (call,) = result.calls
    assert call.name == "weather" and call.arguments == {"city": "Paris"} and call.result.ok
    phases = [e.phase for e in log if isinstance(e, vrt.ToolStream)]
    if dialect != "ollama":  # Ollama sends a call whole: no deltas
        assert phases.count(vrt.Phase.ARGUMENTS_DELTA) >= 2, phases
    assert phases[-1] == vrt.Phase.SETTLED
    text = "".join(e.text for e in log if isinstance(e, vrt.TextDelta))
    assert text == "Let me check.It is 21 degrees."
    first, second = provider.requests
    assert first["stream"] is True and first["model"] == "fake-model" and first["tools"]
    assert_valid(api, second)
    result_text = json.dumps(second)
    assert '\\"temp_c\\": 21' in result_text  # the tool's result, as JSON text
    vrt.testing.assert_stream_valid(log)


@pytest.mark.parametrize(("api", "dialect"), CASES)
async def test_an_interrupt_closes_the_providers_stream_at_once(api: str, dialect: str) -> None:
    """Barge-in while the provider streams: the HTTP stream is closed within 100 ms (the
    provider stops generating), a call of the interrupted step never starts, and the
    next request's history is valid and says the turn was interrupted."""
    weather_runs.clear()
    steps = [
        [
            vrt.say("Let me"),
            vrt.call("weather", {"city": "Oslo"}, chunks=4),
            vrt.pause(5),
            vrt.say("never"),
        ],
        [vrt.say("Sorry.")],
    ]
    async with FakeProvider(steps, api=api, dialect=dialect) as provider:
        async with adapter(provider) as model:
            agent = vrt.define_agent(model=model, tools=[weather])
            async with vrt.open_session(agent) as session, session.subscribe() as events:
                turn = await session.start_turn("weather in Oslo?")
                async for event in events:
                    if isinstance(event, vrt.TextDelta):
                        break  # the provider is streaming
                await trio.sleep(0.05)
                interrupted_at = trio.current_time()
                turn.interrupt()
                result = await turn.wait()
                with trio.fail_after(2):
                    while not provider.disconnected_at:  # noqa: ASYNC110 - the server's tally
                        await trio.sleep(0.005)
                second = await (await session.start_turn("stop, thanks")).wait()
        assert result.status == "interrupted" and second.status == "finished"
        assert provider.disconnects == 1
        assert provider.disconnected_at[0] - interrupted_at < 0.1, provider.disconnected_at
        # no call of the interrupted step starts after the interrupt (a Chat call ends only
        # at the finish reason, so it never ran; Anthropic's and Responses' ended first)
        assert all(at < interrupted_at for at in weather_runs), (weather_runs, interrupted_at)
        if api == "openai-chat":
            assert weather_runs == []
        body = provider.requests[-1]
        assert_valid(api, body)
        assert "interrupted" in json.dumps(body)


async def test_retries_before_the_first_event_honour_retry_after() -> None:
    steps = [
        FakeProvider.http_error(429, retry_after=0.2),
        FakeProvider.http_error(503),
        [vrt.say("ok")],
    ]
    async with FakeProvider(steps) as provider:
        start = trio.current_time()
        result, _, _ = await play(provider)
        elapsed = trio.current_time() - start
    assert result.status == "finished" and len(provider.requests) == 3
    assert elapsed >= 0.2 + 0.5  # retry-after, then the backoff's 0.5 s (doubled from 0.5)


@pytest.mark.parametrize(
    ("status", "tries"), [(500, 3), (529, 3), (429, 3), (408, 3), (400, 1), (401, 1)]
)
async def test_an_http_error_fails_the_turn(
    status: int, tries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vrt.models import _adapters

    monkeypatch.setattr(_adapters, "BACKOFF", 0.01)
    steps = [FakeProvider.http_error(status, message=f"no: {KEY}")] * 3
    async with FakeProvider(steps) as provider:
        result, log, _ = await play(provider)
    assert result.status == "failed" and len(provider.requests) == tries
    assert result.message is not None and f"HTTP {status}" in result.message
    assert KEY not in result.message and "***" in result.message  # the key is redacted
    assert [e.reason for e in log if isinstance(e, vrt.TurnEnded)] == ["failed"]


@pytest.mark.parametrize(("api", "dialect"), CASES)
async def test_a_call_cut_off_at_the_token_limit_fails_and_never_runs(
    api: str, dialect: str
) -> None:
    """Each API's own way to say a call was cut off (Chat's finish_reason ``length``;
    Anthropic's ``max_tokens`` after the block was stopped; Responses' item done
    ``incomplete``): the call fails, the tool never runs, the turn still finishes. Ollama
    sends calls whole, parsed out of the model's text: a cut one never comes at all."""
    weather_runs.clear()
    steps = [[vrt.call("weather", {"city": "Paris"}, chunks=4, truncate=True)], [vrt.say("ok")]]
    async with FakeProvider(steps, api=api, dialect=dialect) as provider:
        result, log, _ = await play(provider)
    assert result.status == "finished" and weather_runs == []
    if dialect == "ollama":
        assert result.calls == ()
        return
    (call,) = result.calls
    assert call.result.code == vrt.ResultCode.FAILED, call.result
    assert "stopped before completing" in (call.result.message or "")
    vrt.testing.assert_stream_valid(log)


@pytest.mark.parametrize("api", ["openai-chat", "openai-responses", "anthropic"])
async def test_an_error_event_mid_stream_fails_the_turn_and_its_open_calls(api: str) -> None:
    """The turn fails and no next step runs; a call not yet sure to be whole fails, one
    already complete finishes as usual. Chat ends calls only at the finish reason, and
    Anthropic holds the last tool block's end until the stop reason (a block cut off at
    max_tokens is stopped like a whole one): in those two the call fails."""
    steps = [
        [
            vrt.say("Let me"),
            vrt.call("weather", {"city": "Rome"}, chunks=2),
            FakeProvider.stream_error("the model is overloaded"),
        ],
        [vrt.say("never")],
    ]
    async with FakeProvider(steps, api=api) as provider:
        result, log, _ = await play(provider)
    assert result.status == "failed" and result.message and "overloaded" in result.message
    (call,) = result.calls
    expected = None if api == "openai-responses" else vrt.ResultCode.FAILED
    assert call.result.code == expected, call.result
    assert len(provider.requests) == 1  # no retry after the first event, no next step
    vrt.testing.assert_stream_valid(log)


@pytest.mark.parametrize("api", ["openai-chat", "openai-responses", "anthropic"])
async def test_a_connection_lost_mid_stream_fails_the_turn(api: str) -> None:
    steps = [[vrt.say("Let me"), FakeProvider.hang_up()]]
    async with FakeProvider(steps, api=api) as provider:
        result, _, _ = await play(provider)
    assert result.status == "failed" and result.message and "lost" in result.message


async def test_a_provider_silent_for_longer_than_the_timeout() -> None:
    steps = [[vrt.say("Let me"), vrt.pause(5)]]
    async with FakeProvider(steps) as provider:
        async with adapter(provider, extra_body={"temperature": 0}) as model:
            model.timeout = 0.3
            agent = vrt.define_agent(model=model)
            async with vrt.open_session(agent) as session:
                start = trio.current_time()
                result = await (await session.start_turn("hi")).wait()
    assert result.status == "failed" and result.message and "no data" in result.message
    assert trio.current_time() - start < 3
    assert provider.requests[0]["temperature"] == 0  # extra_body merged


async def test_cannot_connect_is_retried_then_a_model_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vrt.models import _adapters

    monkeypatch.setattr(_adapters, "BACKOFF", 0.01)
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    model = vrt.models.OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1")
    async with model:
        agent = vrt.define_agent(model=model)
        async with vrt.open_session(agent) as session:
            result = await (await session.start_turn("hi")).wait()
    assert result.status == "failed" and result.message and "cannot connect" in result.message


async def test_a_connection_dropped_before_an_answer_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy or a load balancer closing the connection before the response: the same
    tries as a connect error, then a ModelError saying so."""
    from vrt.models import _adapters

    monkeypatch.setattr(_adapters, "BACKOFF", 0.01)
    dropped: list[int] = []

    async def drop(stream: trio.SocketStream) -> None:
        with trio.move_on_after(2):
            await stream.receive_some(65536)  # the request's first bytes, then hang up
        dropped.append(1)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, drop, 0, host="127.0.0.1")
        (listener,) = await nursery.start(serve)
        port = listener.socket.getsockname()[1]
        model = vrt.models.OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="")
        async with model:
            agent = vrt.define_agent(model=model)
            async with vrt.open_session(agent) as session:
                result = await (await session.start_turn("hi")).wait()
        nursery.cancel_scope.cancel()
    assert result.status == "failed" and result.message
    assert "closed the connection before answering" in result.message
    assert len(dropped) == 3


async def test_no_key_no_header_or_body_reaches_a_log_a_repr_or_an_event(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vrt.models import _adapters

    monkeypatch.setattr(_adapters, "BACKOFF", 0.01)
    secret = "the user's private words"
    steps = [
        FakeProvider.http_error(500),
        [vrt.say("ok"), FakeProvider.stream_error(f"echo {KEY}")],
    ]
    with caplog.at_level(logging.DEBUG):
        async with FakeProvider(steps) as provider:
            result, log, model = await play(provider, text=secret)
    seen = " ".join(
        [r.getMessage() for r in caplog.records]
        + [repr(model), repr(result), *(repr(e) for e in log if not isinstance(e, vrt.TurnStarted))]
    )
    assert KEY not in seen and "Bearer" not in seen
    assert secret not in " ".join(r.getMessage() for r in caplog.records)
    assert provider.headers[0]["authorization"] == f"Bearer {KEY}"


async def test_a_local_server_gets_no_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with FakeProvider([[vrt.say("hi")]]) as provider:
        async with vrt.models.OpenAIChat("m", base_url=provider.base_url) as model:
            agent = vrt.define_agent(model=model)
            async with vrt.open_session(agent) as session:
                await (await session.start_turn("hi")).wait()
    assert "authorization" not in provider.headers[0]
    assert provider.headers[0]["accept-encoding"] == "identity"  # the stream is read raw


async def test_anthropic_sends_its_key_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    async with FakeProvider([[vrt.say("hi")]], api="anthropic") as provider:
        async with vrt.models.AnthropicMessages("claude", base_url=provider.base_url) as model:
            agent = vrt.define_agent(model=model)
            async with vrt.open_session(agent) as session:
                await (await session.start_turn("hi")).wait()
    assert provider.headers[0]["x-api-key"] == KEY
    assert provider.headers[0]["anthropic-version"] == "2023-06-01"
    assert provider.requests[0]["max_tokens"] == 1024


def test_bad_adapter_options_are_refused() -> None:
    with pytest.raises(ValueError, match="model"):
        vrt.models.OpenAIChat("")
    with pytest.raises(ValueError, match="base_url"):
        vrt.models.OpenAIChat("m", base_url="ftp://x")
    with pytest.raises(ValueError, match="timeout"):
        vrt.models.OpenAIResponses("m", timeout=0)
    with pytest.raises(ValueError, match="max_tokens"):
        vrt.models.AnthropicMessages("m", max_tokens=0)
    with pytest.raises(ValueError, match="api_key"):
        vrt.models.OpenAIChat("m", api_key="sk-1\nX-Injected: 1")


async def test_a_keys_surrounding_whitespace_is_dropped() -> None:
    """A key pasted with its newline (from a file or an env var) still works."""
    async with FakeProvider([[vrt.say("hi")]]) as provider:
        async with vrt.models.OpenAIChat(
            "m", base_url=provider.base_url, api_key=f" {KEY}\n"
        ) as model:
            agent = vrt.define_agent(model=model)
            async with vrt.open_session(agent) as session:
                await (await session.start_turn("hi")).wait()
    assert provider.headers[0]["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("where", ["http", "stream"])
async def test_a_key_is_redacted_before_a_long_message_is_cut(where: str) -> None:
    """Cut first, redact after, and the cut would leave the key's first characters."""
    from vrt.models._adapters import MESSAGE_LIMIT

    prefix = len("the provider reported an error: ") if where == "stream" else 0
    echo = "x" * (MESSAGE_LIMIT - 12 - prefix) + " " + KEY + " and more"
    steps = (
        [FakeProvider.http_error(400, message=echo)]
        if where == "http"
        else [[vrt.say("ok"), FakeProvider.stream_error(echo)]]
    )
    async with FakeProvider(steps) as provider:
        result, _, _ = await play(provider)
    assert result.status == "failed" and result.message
    assert KEY[:6] not in result.message, result.message
