"""OpenTelemetry: a span per turn, per model step and per call, and the engine's metrics.

Through ``opentelemetry-api`` only: every span and instrument here is a no-op until the
application installs and configures the SDK (a ``TracerProvider``, a ``MeterProvider``);
vrt never imports the SDK. Names and attributes follow the OpenTelemetry GenAI semantic
conventions: ``invoke_agent {agent}`` per turn, ``chat {model}`` per model step (a child of
the turn's), ``execute_tool {tool}`` per call (a child of the turn's; its phases are span
events). A call's span ends with its result (``error.type`` is the result code when it is
not OK); an interrupt ends the turn's, the step's and every open call's span at once, not
when the tasks have unwound.

Content (the user's text, arguments, outputs, failure messages, progress values) is put in
spans only with content capture on: ``capture_content=True`` on ``vrt.serve`` /
``open_session``, or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from contextvars import Token
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from vrt._core.results import Kind, ToolResult

if TYPE_CHECKING:
    from vrt._engine.agent import Agent

__all__ = [
    "CAPTURE_VARIABLE",
    "CallSpan",
    "TurnSpans",
    "capture_from_environment",
    "frame",
    "refused",
]

CAPTURE_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI conventions' opt-in for content in spans (``true`` turns it on)."""

_SCOPE = "vrt"
_tracer = trace.get_tracer(_SCOPE)
_meter = metrics.get_meter(_SCOPE)

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""The histograms' buckets (the SDK's default ones are for milliseconds)."""

# -- metrics (every name is prefixed vrt.; Prometheus shows vrt_..._total and so on) --------------

CALLS = _meter.create_counter(
    "vrt.tool.calls", unit="{call}", description="Calls by tool name, kind and result code"
)
CALL_DURATION = _meter.create_histogram(
    "vrt.tool.duration",
    unit="s",
    description="From the model's start of a call to its result, by name, kind and code",
    explicit_bucket_boundaries_advisory=SECONDS,
)
FIRST_EVENT = _meter.create_histogram(
    "vrt.model.time_to_first_event",
    unit="s",
    description="From a model step's request to its first streamed event, by model",
    explicit_bucket_boundaries_advisory=SECONDS,
)
TURN_DURATION = _meter.create_histogram(
    "vrt.turn.duration",
    unit="s",
    description="Turns by status (finished, interrupted, failed)",
    explicit_bucket_boundaries_advisory=SECONDS,
)
SESSIONS_OPEN = _meter.create_up_down_counter(
    "vrt.sessions.open", unit="{session}", description="Sessions a server holds now"
)
RESUMES = _meter.create_counter(
    "vrt.resumes", unit="{resume}", description="Sessions resumed on a new connection"
)
REFUSALS = _meter.create_counter(
    "vrt.refusals",
    unit="{refusal}",
    description="What a server refused or cut off, by reason (rate, overflow, pending_cap, "
    "sessions_cap, upgrade, resume)",
)


INBOUND = [0, 0]
"""Frames and bytes received, since the process started."""
OUTBOUND = [0, 0]
"""Frames and bytes sent, since the process started."""


def frame(direction: list[int], data: str | bytes) -> None:
    """Count one WebSocket frame (``direction``: :data:`INBOUND` or :data:`OUTBOUND`).

    Plain integers, read when metrics are collected (an observable counter): a frame costs
    an addition, not two instrument calls (a dozen frames a turn)."""
    direction[0] += 1
    direction[1] += len(data) if isinstance(data, bytes) or data.isascii() else len(data.encode())


def _observe(index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return (
            Observation(INBOUND[index], {"vrt.direction": "in"}),
            Observation(OUTBOUND[index], {"vrt.direction": "out"}),
        )

    return observe


FRAMES = _meter.create_observable_counter(
    "vrt.frames",
    callbacks=[_observe(0)],
    unit="{frame}",
    description="WebSocket frames by direction (in, out)",
)
FRAME_BYTES = _meter.create_observable_counter(
    "vrt.frame.size",
    callbacks=[_observe(1)],
    unit="By",
    description="Bytes of WebSocket frames by direction (in, out)",
)


def refused(reason: str) -> None:
    """Count one refusal for ``reason``."""
    REFUSALS.add(1, {"vrt.refusal.reason": reason})


def capture_from_environment() -> bool:
    """Whether ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` turns capture on."""
    return os.environ.get(CAPTURE_VARIABLE, "").strip().lower() == "true"


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(value)


def _model_name(model: Any) -> str:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else type(model).__name__


class TurnSpans:
    """The spans of one turn: the turn's own, the running model step's, and the calls'
    (each :class:`CallSpan`). Not recording (no SDK, or sampled out) costs a few checks."""

    __slots__ = (
        "_context",
        "_model",
        "_provider",
        "_step",
        "_step_started",
        "capture",
        "ended",
        "recording",
        "span",
        "started",
    )

    def __init__(
        self,
        agent: Agent,
        session_id: str,
        turn_id: str,
        epoch: int,
        text: str,
        *,
        capture: bool,
    ) -> None:
        self.capture = capture
        self.started = time.monotonic()
        self.ended = False
        name = agent.name
        self._model = model = _model_name(agent.model)
        provider = getattr(agent.model, "provider", None)
        self._provider = provider if isinstance(provider, str) and provider else None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": name,
            "gen_ai.conversation.id": session_id,
            "gen_ai.request.model": model,
            "vrt.turn.id": turn_id,
            "vrt.epoch": epoch,
        }
        if capture:
            message = {"role": "user", "parts": [{"type": "text", "content": text}]}
            attributes["gen_ai.input.messages"] = _json([message])
        # The attributes at the start, not set after: the SDK takes them in one pass.
        span = _tracer.start_span(f"invoke_agent {name}", attributes=attributes)
        self.span = span
        self.recording = span.is_recording()
        self._context = trace.set_span_in_context(span) if self.recording else None
        self._step: Span | None = None
        self._step_started = 0.0

    # -- model steps ------------------------------------------------------------------------------

    def step_started(self, step: int) -> None:
        """A model step's request goes out now."""
        self._step_started = time.monotonic()
        if not self.recording:
            return
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": self._model,
            "vrt.step": step,
        }
        if self._provider is not None:
            attributes["gen_ai.provider.name"] = self._provider
        self._step = _tracer.start_span(
            f"chat {self._model}", self._context, SpanKind.CLIENT, attributes
        )

    def current(self) -> Token[Context] | None:
        """Make the step's span current in the turn's task while the model streams (an
        instrumented HTTP client's spans are its children); the token for :meth:`restore`."""
        if self._step is None:
            return None
        return otel_context.attach(trace.set_span_in_context(self._step))

    @staticmethod
    def restore(token: Token[Context] | None) -> None:
        """Undo :meth:`current`."""
        if token is not None:
            otel_context.detach(token)

    def first_event(self) -> None:
        """The step's first event arrived (the turn calls it once a step)."""
        elapsed = time.monotonic() - self._step_started
        FIRST_EVENT.record(elapsed, {"gen_ai.request.model": self._model})

    def usage(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """The provider reported the step's token usage (the latest report wins)."""
        span = self._step
        if span is None:
            return
        counts = {
            key: value
            for key, value in (
                ("gen_ai.usage.input_tokens", input_tokens),
                ("gen_ai.usage.output_tokens", output_tokens),
            )
            if value is not None
        }
        span.set_attributes(counts)

    def step_ended(self, error: BaseException | None = None) -> None:
        """The step's stream ended (``error``: it failed)."""
        span, self._step = self._step, None
        if span is None:
            return
        if error is not None:
            kind = type(error).__name__
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, str(error) if self.capture else kind))
        span.end()

    # -- calls ------------------------------------------------------------------------------------

    def call(self, call_id: str, name: str, kind: Kind) -> CallSpan:
        """A call began (its ``start`` phase)."""
        return CallSpan(self, call_id, name, kind)

    # -- the turn's end ---------------------------------------------------------------------------

    def end(self, status: str, message: str | None = None) -> None:
        """The turn ended with ``status`` (an interrupt: at the interrupt). Once."""
        if self.ended:
            return
        self.ended = True
        self.step_ended()
        TURN_DURATION.record(time.monotonic() - self.started, {"vrt.turn.status": status})
        span = self.span
        if not self.recording:
            return
        span.set_attribute("vrt.turn.status", status)
        if status == "failed":
            span.set_attribute("error.type", "failed")
            description = message if self.capture and message else "the turn failed"
            span.set_status(Status(StatusCode.ERROR, description))
        span.end()

    def cut(self) -> None:
        """The session closed with the turn open: its spans end, marked so, with no
        metric (the turn has no status)."""
        if self.ended:
            return
        self.ended = True
        step, self._step = self._step, None
        _closed(step)
        _closed(self.span if self.recording else None)


class CallSpan:
    """One call's ``execute_tool`` span, and its metrics once it has its result."""

    __slots__ = ("_kind", "_name", "_spans", "span", "started")

    def __init__(self, spans: TurnSpans, call_id: str, name: str, kind: Kind) -> None:
        self._spans = spans
        self._name = name
        self._kind = kind
        self.started = time.monotonic()
        self.span: Span | None = None
        if spans.recording:
            attributes = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function" if kind == "server" else "extension",
                "vrt.tool.kind": kind,
            }
            self.span = _tracer.start_span(
                f"execute_tool {name}", spans._context, SpanKind.INTERNAL, attributes
            )

    def enter(self) -> None:
        """Make the call's span current in the calling task (the call's own: its context
        ends with it), so that spans the tool makes are its children."""
        if self.span is not None:
            otel_context.attach(trace.set_span_in_context(self.span))

    def progress(self, value: Any) -> None:
        """A ``progress`` phase, as a span event (its value only with capture)."""
        span = self.span
        if span is None:
            return
        if self._spans.capture:
            span.add_event("progress", {"vrt.value": _json(value)})
        else:
            span.add_event("progress")

    def arguments(self, arguments: Any) -> None:
        """The arguments are complete."""
        span = self.span
        if span is None:
            return
        if self._spans.capture:
            span.set_attribute("gen_ai.tool.call.arguments", _json(arguments))
        span.add_event("arguments-complete")

    def end(self, phase: str, result: ToolResult) -> None:
        """The call has its one result (``phase``: settled, cancelled or failed)."""
        code = "OK" if result.ok else str(result.code)
        attributes = {
            "gen_ai.tool.name": self._name,
            "vrt.tool.kind": self._kind,
            "vrt.result.code": code,
        }
        CALLS.add(1, attributes)
        CALL_DURATION.record(time.monotonic() - self.started, attributes)
        span = self.span
        if span is None:
            return
        self.span = None
        span.add_event(phase)
        capture = self._spans.capture
        if result.ok:
            if capture:
                span.set_attributes(
                    {"vrt.result.code": code, "gen_ai.tool.call.result": _json(result.output)}
                )
            else:
                span.set_attribute("vrt.result.code", code)
        else:
            span.set_attributes({"vrt.result.code": code, "error.type": code})
            description = result.message if capture and result.message else code
            span.set_status(Status(StatusCode.ERROR, description))
        span.end()

    def cut(self) -> None:
        """The session closed before the call had a result: the span ends, no metric."""
        span, self.span = self.span, None
        _closed(span)


def _closed(span: Span | None) -> None:
    """End ``span`` (if any) as cut short by the session's close."""
    if span is not None:
        span.set_attribute("error.type", "session_closed")
        span.set_status(Status(StatusCode.ERROR, "the session closed"))
        span.end()
