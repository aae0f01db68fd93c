"""Traces and metrics through OpenTelemetry, read back with the SDK's in-memory exporter and
reader: the span tree of real turns (a server call, an app call, an interrupted call, a failed
model step) over vrt.serve, with no content unless it is asked for; the metrics of the same;
and ``GET /metrics`` of ``vrt serve --metrics`` in Prometheus' text format.

The SDK's providers are global and can be set once a process: this module sets them when it
is imported, with a sampler that records only while a test here asks (every other test runs
with spans dropped at the start, as without the SDK)."""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import trio
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, StatusCode
from opentelemetry.util.types import Attributes

import vrt
import vrt.asgi
import vrt.models
from tests.conftest import Log, until
from tests.test_browser import serving
from vrt.testing import FakeProvider


class Switch(Sampler):
    """Record while ``on``; drop every span otherwise."""

    on = False

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        # A sampler hands the span its attributes (those given at the start, as the SDK's own
        # samplers do).
        decision = Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP
        return SamplingResult(decision, attributes)

    def get_description(self) -> str:
        return "Switch"


SWITCH = Switch()
EXPORTER = InMemorySpanExporter()
_tracing = TracerProvider(sampler=SWITCH)
_tracing.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_tracing)
READER = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))

OBJ = {"type": "object"}
SECRETS = ("USER-SAYS-42", "ARG-CITY-7", "ARG-TEXT-9", "OUT-TEMP-3", "OUT-EDIT-5", "PROGRESS-1")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    SWITCH.on = True
    try:
        yield EXPORTER
    finally:
        SWITCH.on = False
        EXPORTER.clear()


def points(name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
    """The data points of metric ``name`` now, by their attributes (sorted)."""
    data = READER.get_metrics_data()
    found: dict[tuple[tuple[str, Any], ...], Any] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        key = tuple(sorted((point.attributes or {}).items()))
                        found[key] = point
    return found


def calls_by_code() -> dict[tuple[str, str, str], int]:
    return {
        (dict(key)["gen_ai.tool.name"], dict(key)["vrt.tool.kind"], dict(key)["vrt.result.code"]): (
            point.value
        )
        for key, point in points("vrt.tool.calls").items()
    }


@vrt.server_tool(risk="low", parameters=OBJ)
async def weather(args: Any, ctx: vrt.ToolContext) -> Any:
    ctx.emit({"note": "PROGRESS-1"})
    return {"temp": "OUT-TEMP-3"}


UNWOUND: list[int] = []


@vrt.server_tool(risk="low", parameters=OBJ)
async def slow(args: Any, ctx: vrt.ToolContext) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):  # a slow cleanup: the spans must not wait for it
            await trio.sleep(0.3)
        UNWOUND.append(time.time_ns())


@vrt.app_tool(parameters=OBJ)
async def edit(args: Any, ctx: Any) -> Any:
    return {"edited": "OUT-EDIT-5"}


STEPS: list[Any] = [
    # turn 1: a server call and an app call, then the answer
    [vrt.call("weather", {"city": "ARG-CITY-7"}), vrt.call("edit", {"text": "ARG-TEXT-9"})],
    [vrt.say("It is warm.")],
    # turn 2: a call that never ends (interrupted)
    [vrt.call("slow", {"city": "ARG-CITY-7"})],
    # turn 3: the model step fails
    FakeProvider.http_error(400, message="bad request"),
]


async def three_turns(serve: Any, **options: Any) -> list[vrt.TurnEnded]:
    """The three turns of STEPS through vrt.serve and OpenAIChat; their ends."""
    UNWOUND.clear()
    async with FakeProvider(STEPS, usage=(120, 17)) as provider:
        model = vrt.models.OpenAIChat(
            "gpt-test", base_url=provider.base_url, api_key="sk-KEY-SECRET"
        )
        async with model:
            return await _three_turns(serve, model, options)


async def _three_turns(serve: Any, model: Any, options: Any) -> list[vrt.TurnEnded]:
    agent = vrt.define_agent(
        model=model, tools=[weather, slow], client_tools="accept", name="travel"
    )
    server = await serve(agent, **options)
    ends = []
    async with vrt.connect(server.url, tools=[edit]) as client, client.subscribe() as ch:
        events = Log(ch)
        for text in ("USER-SAYS-42 first", "USER-SAYS-42 second", "USER-SAYS-42 third"):
            await client.send_text(text)
            if text.endswith("second"):
                await until(events, lambda e: isinstance(e, vrt.ToolStream) and e.name == "slow")
                await trio.sleep(0.05)
                client.interrupt()
            ends.append(await until(events, lambda e: isinstance(e, vrt.TurnEnded)))
    return ends


def tree(finished: Sequence[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    return by_name


def text_of(span: ReadableSpan) -> str:
    """Everything a span carries that could hold content, as one string."""
    parts = [span.name, json.dumps(dict(span.attributes or {}), default=str)]
    parts += [e.name + json.dumps(dict(e.attributes or {}), default=str) for e in span.events]
    parts.append(span.status.description or "")
    return "\n".join(parts)


async def test_the_span_tree_of_turns_without_content(
    vrt_serve: Any, spans: InMemorySpanExporter
) -> None:
    before = calls_by_code()
    ends = await three_turns(vrt_serve)
    assert [e.reason for e in ends] == ["finished", "interrupted", "failed"]
    got = tree(spans.get_finished_spans())
    turns = got["invoke_agent travel"]
    assert len(turns) == 3
    assert sorted(got) == [
        "chat gpt-test",
        "execute_tool edit",
        "execute_tool slow",
        "execute_tool weather",
        "invoke_agent travel",
    ]
    first, second, third = sorted(turns, key=lambda s: s.start_time or 0)
    for turn, status in zip(
        (first, second, third), ("finished", "interrupted", "failed"), strict=True
    ):
        attributes = dict(turn.attributes or {})
        assert attributes["gen_ai.operation.name"] == "invoke_agent"
        assert attributes["gen_ai.agent.name"] == "travel"
        assert attributes["gen_ai.request.model"] == "gpt-test"
        assert attributes["vrt.turn.status"] == status
        assert turn.parent is None
        assert str(attributes["gen_ai.conversation.id"]).startswith("s_")
    assert first.status.status_code == StatusCode.UNSET
    assert third.status.status_code == StatusCode.ERROR

    # every chat and execute_tool span is a child of its turn's span
    chats = sorted(got["chat gpt-test"], key=lambda s: s.start_time or 0)
    assert len(chats) == 4  # turn 1: two steps; turn 2: one; turn 3: the failed one
    owners = [first, first, second, third]
    for chat, owner in zip(chats, owners, strict=True):
        assert chat.parent is not None and owner.context is not None
        assert chat.parent.span_id == owner.context.span_id
        assert chat.context is not None and chat.context.trace_id == owner.context.trace_id
        assert chat.kind == SpanKind.CLIENT
        attributes = dict(chat.attributes or {})
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "gpt-test"
        assert attributes["gen_ai.provider.name"] == "openai"
    for chat in chats[:3]:
        assert chat.status.status_code == StatusCode.UNSET
        usage = dict(chat.attributes or {})
        assert (usage["gen_ai.usage.input_tokens"], usage["gen_ai.usage.output_tokens"]) == (
            120,
            17,
        )
    failed = chats[3]
    assert failed.status.status_code == StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "ModelError"
    assert "gen_ai.usage.input_tokens" not in dict(failed.attributes or {})

    calls: dict[str, ReadableSpan] = {}
    for name in ("weather", "edit", "slow"):
        (calls[name],) = got[f"execute_tool {name}"]
    for name, owner in (("weather", first), ("edit", first), ("slow", second)):
        call = calls[name]
        assert call.parent is not None and owner.context is not None
        assert call.parent.span_id == owner.context.span_id
        attributes = dict(call.attributes or {})
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["gen_ai.tool.name"] == name
        assert str(attributes["gen_ai.tool.call.id"]).startswith("call_")
        assert attributes["vrt.tool.kind"] == ("app" if name == "edit" else "server")
    weather_events = [e.name for e in calls["weather"].events]
    assert weather_events == ["arguments-complete", "progress", "settled"]
    assert [e.name for e in calls["edit"].events] == ["arguments-complete", "settled"]
    assert dict(calls["weather"].attributes or {})["vrt.result.code"] == "OK"
    assert calls["weather"].status.status_code == StatusCode.UNSET
    cut = calls["slow"]
    assert [e.name for e in cut.events] == ["arguments-complete", "cancelled"]
    assert dict(cut.attributes or {})["error.type"] == "INTERRUPTED"
    assert cut.status.status_code == StatusCode.ERROR
    assert cut.status.description == "INTERRUPTED"

    # the interrupted turn's spans ended at the interrupt, not after the 0.3 s cleanup
    assert second.end_time is not None and cut.end_time is not None
    assert chats[2].end_time is not None
    assert UNWOUND  # the cleanup did run to its end
    assert cut.end_time <= second.end_time
    assert second.end_time - cut.end_time < 50_000_000  # ns
    assert (chats[2].end_time or 0) <= second.end_time  # the step had ended before
    assert UNWOUND[0] - second.end_time > 250_000_000  # the cleanup took 0.3 s more

    # no content anywhere: no user text, argument, output, progress value, nor the key
    for span in spans.get_finished_spans():
        carried = text_of(span)
        for secret in (*SECRETS, "sk-KEY-SECRET", "bad request"):
            assert secret not in carried, (span.name, secret)

    after = calls_by_code()
    for key in (
        ("weather", "server", "OK"),
        ("edit", "app", "OK"),
        ("slow", "server", "INTERRUPTED"),
    ):
        assert after.get(key, 0) - before.get(key, 0) == 1, key


async def test_content_capture_puts_content_in_spans(
    vrt_serve: Any, spans: InMemorySpanExporter
) -> None:
    await three_turns(vrt_serve, capture_content=True)
    got = tree(spans.get_finished_spans())
    everything = "\n".join(text_of(span) for span in spans.get_finished_spans())
    for secret in SECRETS:
        assert secret in everything, secret
    assert "sk-KEY-SECRET" not in everything  # a key never
    (weather_span,) = got["execute_tool weather"]
    attributes = dict(weather_span.attributes or {})
    assert json.loads(str(attributes["gen_ai.tool.call.arguments"])) == {"city": "ARG-CITY-7"}
    assert json.loads(str(attributes["gen_ai.tool.call.result"])) == {"temp": "OUT-TEMP-3"}
    first = min(got["invoke_agent travel"], key=lambda s: s.start_time or 0)
    messages = json.loads(str(dict(first.attributes or {})["gen_ai.input.messages"]))
    assert messages[0]["parts"][0]["content"] == "USER-SAYS-42 first"


async def test_the_environment_variable_turns_capture_on(
    monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    model = vrt.ScriptedModel([[vrt.call("weather", {"city": "ARG-CITY-7"})], [vrt.say("ok")]])
    agent = vrt.define_agent(model=model, tools=[weather])
    for value, captured in (("true", True), ("false", False), ("TRUE", True)):
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", value)
        spans.clear()
        async with vrt.open_session(agent) as session:
            await (await session.start_turn("USER-SAYS-42")).wait()
        everything = "\n".join(text_of(span) for span in spans.get_finished_spans())
        assert ("ARG-CITY-7" in everything) is captured, value
        assert ("USER-SAYS-42" in everything) is captured, value
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    spans.clear()
    async with vrt.open_session(agent, capture_content=False) as session:  # the argument wins
        await (await session.start_turn("USER-SAYS-42")).wait()
    assert "ARG-CITY-7" not in "\n".join(text_of(s) for s in spans.get_finished_spans())


async def test_a_closed_session_ends_its_open_spans(spans: InMemorySpanExporter) -> None:
    model = vrt.ScriptedModel([[vrt.call("slow", {})]])
    agent = vrt.define_agent(model=model, tools=[slow])
    async with vrt.open_session(agent) as session, session.subscribe() as events:
        await session.start_turn("go")
        async for event in events:
            if isinstance(event, vrt.ToolStream) and event.phase == vrt.Phase.ARGUMENTS_COMPLETE:
                break
    got = tree(spans.get_finished_spans())
    (turn,) = got["invoke_agent agent"]
    (call,) = got["execute_tool slow"]
    for span in (turn, call):
        assert dict(span.attributes or {})["error.type"] == "session_closed"
        assert span.status.status_code == StatusCode.ERROR


async def test_the_server_metrics(vrt_serve: Any) -> None:
    def total(name: str, **match: str) -> float:
        return sum(
            point.value
            for key, point in points(name).items()
            if all(dict(key).get(k) == v for k, v in match.items())
        )

    def count(name: str, **match: str) -> int:
        return sum(
            point.count
            for key, point in points(name).items()
            if all(dict(key).get(k) == v for k, v in match.items())
        )

    before = {
        "in": total("vrt.frames", **{"vrt.direction": "in"}),
        "out": total("vrt.frames", **{"vrt.direction": "out"}),
        "bytes_in": total("vrt.frame.size", **{"vrt.direction": "in"}),
        "open": total("vrt.sessions.open"),
        "interrupted": count("vrt.turn.duration", **{"vrt.turn.status": "interrupted"}),
        "failed": count("vrt.turn.duration", **{"vrt.turn.status": "failed"}),
        "first": count("vrt.model.time_to_first_event"),
    }
    await three_turns(vrt_serve)
    await trio.sleep(0.1)  # the server's side of the close
    assert total("vrt.frames", **{"vrt.direction": "in"}) - before["in"] >= 5
    assert total("vrt.frames", **{"vrt.direction": "out"}) - before["out"] >= 10
    assert total("vrt.frame.size", **{"vrt.direction": "in"}) - before["bytes_in"] > 200
    assert total("vrt.sessions.open") == before["open"]  # opened, then closed
    assert (
        count("vrt.turn.duration", **{"vrt.turn.status": "interrupted"})
        == before["interrupted"] + 1
    )
    assert count("vrt.turn.duration", **{"vrt.turn.status": "failed"}) == before["failed"] + 1
    assert count("vrt.model.time_to_first_event") == before["first"] + 3  # not the HTTP 400
    # over a rate of 20 frames a second: the 21st interrupt waits, counted once
    rated = before_rate = total("vrt.refusals", **{"vrt.refusal.reason": "rate"})
    agent = vrt.define_agent(model=vrt.ScriptedModel([]))
    server = await vrt_serve(agent, max_messages_per_second=20)
    async with vrt.connect(server.url) as client:
        with trio.fail_after(5):
            while rated == before_rate:
                client.interrupt()
                await trio.sleep(0.001)
                rated = total("vrt.refusals", **{"vrt.refusal.reason": "rate"})
    assert rated == before_rate + 1


@pytest.mark.network
def test_vrt_serve_metrics_in_prometheus_format() -> None:
    """``vrt serve --metrics``: ``GET /metrics`` shows the calls by code in Prometheus'
    text format after a session ran a turn (a real client, a real process)."""
    command = ("serve", "tests.serve_agent:agent", "--metrics", "--port", "0")
    with serving("", command) as url:

        async def one_turn() -> None:
            async with vrt.connect(url) as client, client.subscribe() as channel:
                await client.send_text("ping")
                await until(Log(channel), lambda e: isinstance(e, vrt.TurnEnded))

        trio.run(one_turn)
        page_url = "http" + url[2:] + "metrics"
        with urllib.request.urlopen(page_url, timeout=5) as answer:
            kind = answer.headers["content-type"]
            page = answer.read().decode()
    assert kind.startswith("text/plain; version=")
    assert "# TYPE vrt_tool_calls_total counter" in page
    lines = [line for line in page.splitlines() if line.startswith("vrt_tool_calls_total{")]
    assert any('vrt_result_code="OK"' in line for line in lines), lines
    assert "vrt_sessions_open" in page and "vrt_frames_total" in page


def test_metrics_without_prometheus_client_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vrt._net import metrics as page

    monkeypatch.setattr(page, "available", lambda: False)

    async def main() -> None:
        agent = vrt.define_agent(model=vrt.ScriptedModel([]))
        with pytest.raises(ValueError, match=r"trio-vrt\[metrics\]"):
            await vrt.serve(agent, "127.0.0.1", 0, metrics=True)

    trio.run(main)


async def test_spans_of_a_tool_and_of_a_model_nest_under_vrt_s(
    spans: InMemorySpanExporter,
) -> None:
    """A tool's own spans (an instrumented HTTP client's...) are children of its
    ``execute_tool`` span; a model's, of its ``chat`` span."""
    tracer = trace.get_tracer("an.app")

    @vrt.server_tool(risk="low", parameters=OBJ)
    async def fetch(args: Any, ctx: vrt.ToolContext) -> None:
        with tracer.start_as_current_span("GET /api"):
            await trio.lowlevel.checkpoint()

    scripted = vrt.ScriptedModel([[vrt.call("fetch", {})], [vrt.say("ok")]])

    class Traced:
        def stream(self, request: Any) -> Any:
            with tracer.start_as_current_span("POST /v1/chat"):
                pass
            return scripted.stream(request)

    agent = vrt.define_agent(model=Traced(), tools=[fetch])
    async with vrt.open_session(agent) as session:
        await (await session.start_turn("go")).wait()
    got = tree(spans.get_finished_spans())
    (call,) = got["execute_tool fetch"]
    (inner,) = got["GET /api"]
    assert inner.parent is not None and call.context is not None
    assert inner.parent.span_id == call.context.span_id
    chats = got["chat Traced"]
    posts = got["POST /v1/chat"]
    assert len(chats) == len(posts) == 2
    assert {p.parent.span_id for p in posts if p.parent} == {
        c.context.span_id for c in chats if c.context
    }


async def test_both_fronts_count_alike() -> None:
    """vrt.serve and vrt.asgi under hypercorn: a refused upgrade counts as ``upgrade`` in
    ``vrt.refusals`` (upgrade.decide counts it, for both), a session's frames count both
    ways, and ``vrt.sessions.open`` is back where it was once the session is over."""
    from tests.test_asgi import hypercorn, make_agent, show, upgrade

    def total(name: str, **match: str) -> float:
        return sum(
            point.value
            for key, point in points(name).items()
            if all(dict(key).get(k) == v for k, v in match.items())
        )

    async def bearer(request: vrt.HandshakeRequest) -> str | None:
        return None if request.header("authorization") is None else "someone"

    async def refused_then_a_turn(port: int) -> None:
        assert (await upgrade(port, "/"))[0] == 401
        url = f"ws://127.0.0.1:{port}/"
        async with (
            vrt.connect(url, tools=[show], headers=[("authorization", "Bearer x")]) as client,
            client.subscribe() as events,
        ):
            await client.send_text("go")
            async for event in events:
                if isinstance(event, vrt.TurnEnded):
                    break
        await trio.sleep(0.1)  # the server's side of the close

    for front in ("vrt.serve", "vrt.asgi"):
        before = [
            total("vrt.refusals", **{"vrt.refusal.reason": "upgrade"}),
            total("vrt.frames", **{"vrt.direction": "in"}),
            total("vrt.frames", **{"vrt.direction": "out"}),
            total("vrt.sessions.open"),
        ]
        if front == "vrt.serve":
            async with trio.open_nursery() as nursery:
                serve = functools.partial(vrt.serve, make_agent(), "127.0.0.1", 0)
                server = await nursery.start(functools.partial(serve, authenticate=bearer))
                await refused_then_a_turn(server.port)
                nursery.cancel_scope.cancel()
        else:
            async with hypercorn(vrt.asgi.app(make_agent(), authenticate=bearer)) as port:
                await refused_then_a_turn(port)
        after = [
            total("vrt.refusals", **{"vrt.refusal.reason": "upgrade"}),
            total("vrt.frames", **{"vrt.direction": "in"}),
            total("vrt.frames", **{"vrt.direction": "out"}),
            total("vrt.sessions.open"),
        ]
        assert after[0] == before[0] + 1, front
        assert after[1] - before[1] >= 3 and after[2] - before[2] >= 3, front  # (batches)
        assert after[3] == before[3], front


async def test_a_resume_is_counted(vrt_serve: Any) -> None:
    """``vrt.resumes``: a session resumed on a new connection after a cut counts one."""
    from vrt.testing import LoopbackProxy

    def resumes() -> float:
        return sum(point.value for point in points("vrt.resumes").values())

    before = resumes()
    server = await vrt_serve(vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("hi")]])))
    async with trio.open_nursery() as nursery:
        proxy = LoopbackProxy(server.port)
        port = await nursery.start(proxy.run)
        async with vrt.connect(f"ws://127.0.0.1:{port}/") as client, client.subscribe() as ch:
            assert proxy.cut() == 1
            await until(Log(ch), lambda e: isinstance(e, vrt.Resumed))
        nursery.cancel_scope.cancel()
    assert resumes() == before + 1
