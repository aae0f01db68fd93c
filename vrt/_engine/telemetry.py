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
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
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
FRAMES = _meter.create_counter(
    "vrt.frames", unit="{frame}", description="WebSocket frames by direction (in, out)"
)
FRAME_BYTES = _meter.create_counter(
    "vrt.frame.size", unit="By", description="Bytes of WebSocket frames by direction (in, out)"
)
REFUSALS = _meter.create_counter(
    "vrt.refusals",
    unit="{refusal}",
    description="What a server refused or cut off, by reason (rate, overflow, pending_cap, "
    "sessions_cap, upgrade, resume)",
)


INBOUND = {"vrt.direction": "in"}
OUTBOUND = {"vrt.direction": "out"}


def frame(direction: dict[str, str], data: str | bytes) -> None:
    """Count one WebSocket frame (``direction``: :data:`INBOUND` or :data:`OUTBOUND`)."""
    FRAMES.add(1, direction)
    size = len(data) if isinstance(data, bytes) or data.isascii() else len(data.encode())
    FRAME_BYTES.add(size, direction)


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
        "_agent",
        "_context",
        "_first",
        "_model",
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
        self._agent = agent
        self.capture = capture
        self.started = time.monotonic()
        self.ended = False
        name = agent.name
        span = _tracer.start_span(f"invoke_agent {name}", kind=SpanKind.INTERNAL)
        self.span = span
        self.recording = span.is_recording()
        self._context = trace.set_span_in_context(span) if self.recording else None
        self._step: Span | None = None
        self._step_started = 0.0
        self._first = False
        self._model = _model_name(agent.model)
        if self.recording:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": name,
                    "gen_ai.conversation.id": session_id,
                    "gen_ai.request.model": self._model,
                    "vrt.turn.id": turn_id,
                    "vrt.epoch": epoch,
                }
            )
            if capture:
                message = {"role": "user", "parts": [{"type": "text", "content": text}]}
                span.set_attribute("gen_ai.input.messages", _json([message]))

    # -- model steps ------------------------------------------------------------------------------

    def step_started(self, step: int) -> None:
        """A model step's request goes out now."""
        self._step_started = time.monotonic()
        self._first = False
        if not self.recording:
            return
        span = _tracer.start_span(
            f"chat {self._model}", context=self._context, kind=SpanKind.CLIENT
        )
        span.set_attributes(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": self._model,
                "vrt.step": step,
            }
        )
        provider = getattr(self._agent.model, "provider", None)
        if isinstance(provider, str) and provider:
            span.set_attribute("gen_ai.provider.name", provider)
        self._step = span

    def first_event(self) -> None:
        """The step's first event arrived (counted once a step)."""
        if self._first:
            return
        self._first = True
        elapsed = time.monotonic() - self._step_started
        FIRST_EVENT.record(elapsed, {"gen_ai.request.model": self._model})

    def usage(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """The provider reported the step's token usage (the latest report wins)."""
        span = self._step
        if span is None:
            return
        if input_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        if output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", output_tokens)

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
        for span in (step, self.span if self.recording else None):
            if span is not None:
                span.set_attribute("error.type", "session_closed")
                span.set_status(Status(StatusCode.ERROR, "the session closed"))
                span.end()


class CallSpan:
    """One call's ``execute_tool`` span, and its metrics once it has its result."""

    __slots__ = ("_attributes", "_spans", "span", "started")

    def __init__(self, spans: TurnSpans, call_id: str, name: str, kind: Kind) -> None:
        self._spans = spans
        self.started = time.monotonic()
        self._attributes = {
            "gen_ai.tool.name": name,
            "vrt.tool.kind": kind,
        }
        self.span: Span | None = None
        if spans.recording:
            span = _tracer.start_span(
                f"execute_tool {name}", context=spans._context, kind=SpanKind.INTERNAL
            )
            span.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.call.id": call_id,
                    "gen_ai.tool.type": "function" if kind == "server" else "extension",
                    "vrt.tool.kind": kind,
                }
            )
            self.span = span

    def phase(self, phase: str, value: Any = None, *, content: bool = False) -> None:
        """A phase of the call's stream, as a span event (``value`` only with capture)."""
        span = self.span
        if span is None:
            return
        if content and self._spans.capture:
            span.add_event(phase, {"vrt.value": _json(value)})
        else:
            span.add_event(phase)

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
        attributes = {**self._attributes, "vrt.result.code": code}
        CALLS.add(1, attributes)
        CALL_DURATION.record(time.monotonic() - self.started, attributes)
        span = self.span
        if span is None:
            return
        self.span = None
        span.add_event(phase)
        span.set_attribute("vrt.result.code", code)
        if result.ok:
            if self._spans.capture:
                span.set_attribute("gen_ai.tool.call.result", _json(result.output))
        else:
            span.set_attribute("error.type", code)
            description = result.message if self._spans.capture and result.message else code
            span.set_status(Status(StatusCode.ERROR, description))
        span.end()

    def cut(self) -> None:
        """The session closed before the call had a result: the span ends, no metric."""
        span, self.span = self.span, None
        if span is not None:
            span.set_attribute("error.type", "session_closed")
            span.set_status(Status(StatusCode.ERROR, "the session closed"))
            span.end()
