"""The model adapters over real HTTP on loopback, against FakeProvider speaking each API and
dialect: whole turns, barge-in, retries, errors, timeouts, and secrets kept."""

from __future__ import annotations

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


@pytest.mark.parametrize(("status", "tries"), [(500, 3), (429, 3), (400, 1), (401, 1)])
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


@pytest.mark.parametrize("api", ["openai-chat", "openai-responses", "anthropic"])
async def test_an_error_event_mid_stream_fails_the_turn_and_its_open_calls(api: str) -> None:
    """The turn fails and no next step runs; a call still streaming its arguments fails,
    one already complete finishes as usual (Chat ends calls only at the finish reason)."""
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
    expected = vrt.ResultCode.FAILED if api == "openai-chat" else None
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
