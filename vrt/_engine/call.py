"""One tool call, server or app: its ToolCall machine, its stream events, its one result.

The machine decides, the task acts: every method sends its event first and does nothing
else if the machine refuses. The synchronous part (start, deltas, complete, interrupt,
abandon) is driven by the turn as the model streams; the asynchronous part (hook,
validation, run) is the call's own task in the turn's nursery, started at
``arguments-complete``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from vrt._core.events import Phase, TextSoFar, ToolPreview, tool_stream
from vrt._core.results import CallRecord, ResultCode, ToolResult
from vrt._core.tables import TOOL_CALL
from vrt._engine.agent import Allow, CallInfo, Reject, Rewrite
from vrt._engine.context import Signal, ToolContext
from vrt._errors import InvalidArguments, InvalidTransition, ToolFailed

if TYPE_CHECKING:
    from vrt._core.results import Kind
    from vrt._engine.agent import RegisteredApp, RegisteredTool
    from vrt._engine.turn import Turn

log = logging.getLogger("vrt")

INTERRUPTED = ToolResult.failure(ResultCode.INTERRUPTED, "the turn was interrupted")


class AppHost(Protocol):
    """Where app calls run: the client of the session (see ``vrt._server.actor``)."""

    @property
    def eager(self) -> bool:
        """Send an app call from the turn's own task, at its ``arguments-complete``, when
        nothing is in its way (no hook, first in line): the transport then writes both in
        one frame (``batch-v1``). False: the call's task does it, a scheduler pass later."""
        ...

    def send_app(self, call: Call) -> AppWait | ToolResult:
        """Send ``tool.call`` now (synchronously); what to wait on for the result, or the
        call's result at once if it could not be sent.

        If the wait ends without a result (cancelled: timeout or interrupt), the host
        tells the client it gave up (``tool.abort``). The host may settle the call itself
        when the result arrives (:meth:`Call.answered`), from its reader's task.
        """
        ...


class AppWait(Protocol):
    """An app call sent to the client, waiting for its result (:meth:`AppHost.send_app`)."""

    async def wait(self) -> ToolResult:
        """The client's result."""
        ...


class Call:
    """The server's authority over one call."""

    __slots__ = (
        "app",
        "arguments",
        "call_id",
        "chars",
        "clear_to_send",
        "fragments",
        "kind",
        "machine",
        "name",
        "result",
        "signal",
        "size",
        "text",
        "tool",
        "trace",
        "turn",
    )

    def __init__(self, turn: Turn, call_id: str, name: str) -> None:
        self.turn = turn
        self.call_id = call_id
        self.name = name
        session = turn.session
        self.tool: RegisteredTool | None = session.registry.get(name)
        self.app: RegisteredApp | None = None
        if self.tool is None:
            self.app = session.app_tools.get(name)
        self.kind: Kind = "app" if self.app is not None else "server"
        # App calls go to the client one at a time, in the model's call order: the session
        # keeps its app calls without a result in a line, and a call is sent only once it is
        # first in the line (``clear_to_send``), i.e. once *every* earlier app call has its
        # result, so ``client_tool_timeout`` only ever counts the call's own time.
        self.clear_to_send: trio.Event | None = None
        line = session.app_line
        limit = session.max_queued_app_calls
        if self.app is not None and (limit is None or len(line) < limit):
            self.clear_to_send = trio.Event()  # None for an app call over the limit
            line.append(self)
            if len(line) == 1:
                self.clear_to_send.set()
        self.machine = TOOL_CALL.new()
        self.fragments: list[str] = []
        self.chars = 0
        """Characters of the fragments so far (what a preview of them is long)."""
        self.size = 0
        """UTF-8 bytes of the fragments so far (counted only under a limit)."""
        self.text: str | None = None  # the arguments' full JSON text, once complete
        self.arguments: Any = None
        self.result: ToolResult | None = None
        self.signal = Signal()
        self.trace = turn.spans.call(call_id, name, self.kind)
        """The call's OpenTelemetry span."""
        self._emit(Phase.START)

    # -- driven by the turn as the model streams --------------------------------------------------

    def delta(self, fragment: str) -> bool:
        """The model wrote the next fragment of the arguments. False if that put them over
        the session's ``max_argument_bytes``: the call failed instead."""
        limit = self.turn.session.max_argument_bytes
        if limit is not None:
            self.size += len(fragment.encode("utf-8", "surrogatepass"))
            if self.size > limit:
                self.abandon(_too_large(limit))
                return False
        self.machine.send("delta")
        self.fragments.append(fragment)
        self.chars += len(fragment)
        self._emit(Phase.ARGUMENTS_DELTA, delta=fragment)
        return True

    def complete(self, arguments: Any) -> bool:
        """The arguments are complete: parse them (or take them as given) and issue the call.

        False if they are over the session's ``max_argument_bytes``: the call failed, and
        it must not run.
        """
        if arguments is None or isinstance(arguments, str):
            text = "".join(self.fragments) if arguments is None else arguments
            try:
                parsed = _DECODER.decode(text)
            except ValueError:
                parsed = text  # kept raw; validation answers INVALID
        else:
            text = json.dumps(arguments)  # raises (a model error) before the machine moves
            parsed = arguments
        limit = self.turn.session.max_argument_bytes
        if limit is not None and arguments is not None:
            if len(text.encode("utf-8", "surrogatepass")) > limit:
                self.abandon(_too_large(limit))
                return False
        self.machine.send("complete")
        self.text, self.arguments = text, parsed
        self.fragments = []
        self.trace.arguments(parsed)
        self._emit(Phase.ARGUMENTS_COMPLETE, arguments=self.arguments)
        return True

    def abandon(self, message: str) -> None:
        """The model stopped before completing the arguments: FAILED, phase ``failed``."""
        self.machine.send("abandon")
        self._end(ToolResult.failure(ResultCode.FAILED, message), Phase.FAILED, message=message)

    def interrupt(self, message: str | None = None) -> None:
        """The turn was interrupted: INTERRUPTED, phase ``cancelled``; aborts the signal."""
        self.machine.send("interrupt")
        self.signal.abort("interrupted")
        result = (
            INTERRUPTED if message is None else ToolResult.failure(ResultCode.INTERRUPTED, message)
        )
        self._end(result, Phase.CANCELLED)

    # -- the call's own task ----------------------------------------------------------------------

    def issue(self, nursery: trio.Nursery) -> None:
        """The arguments are complete: start the call's task in ``nursery`` (the turn's).

        With an eager host (:attr:`AppHost.eager`), no hook and an app call first in line,
        the call's synchronous part runs here, in the turn's task: allowed, checked, and
        ``tool.call`` sent right behind ``arguments-complete``; its task only waits for the
        result. The same transitions in the same order as :meth:`run`'s, without the
        scheduler passes between them.
        """
        app = self.app
        session = self.turn.session
        host = session.app_host
        ready = self.clear_to_send
        if (
            app is None
            or host is None
            or not host.eager
            or ready is None
            or not ready.is_set()
            or session.agent.before_tool_call is not None
        ):
            nursery.start_soon(self.run)
            return
        if not self._send("allow") or not self._checked(app):
            return
        sent = self._send_app(host)
        if sent is not None:
            nursery.start_soon(self._wait_app, sent)

    def answered(self, result: ToolResult) -> None:
        """The app's result, as the host's reader receives it: ``settled`` at once, from
        that task, not a scheduler pass later from the call's own (which then just ends).
        A call that already ended (interrupted, timed out) keeps its result."""
        if not self.machine.final:
            self._settle("finish", result)

    async def run(self) -> None:
        """Hook, validation, run. Cancelled with the turn's scope on interrupt."""
        # A call interrupted while queued (issued, its task not yet started) stops here,
        # before its hook: the scope is already cancelled.
        await trio.lowlevel.checkpoint_if_cancelled()
        self.trace.enter()  # the tool's own spans (an HTTP client's...) are its children
        registered = self.tool
        hook = self.turn.session.agent.before_tool_call
        if hook is not None:  # every call passes the hook first, even one nobody hosts
            info = CallInfo(
                call_id=self.call_id,
                turn_id=self.turn.turn_id,
                epoch=self.turn.epoch,
                name=self.name,
                kind=self.kind,
                risk=registered.tool.risk if registered is not None else None,
                arguments=self.arguments,
            )
            try:
                decision = await hook(info)
            except Exception as exc:
                _failed("the before_tool_call hook", self.call_id, exc)
                self._settle(
                    "decline",
                    ToolResult.failure(
                        ResultCode.FAILED, f"before_tool_call failed: {_describe(exc)}"
                    ),
                )
                return
            if isinstance(decision, Reject):
                self._settle("decline", ToolResult.failure(ResultCode.REJECTED, decision.reason))
                return
            if isinstance(decision, Rewrite):
                problem = _not_json_object(decision.arguments)
                if problem is not None:
                    self._settle(
                        "decline",
                        ToolResult.failure(
                            ResultCode.FAILED, f"before_tool_call rewrote the arguments {problem}"
                        ),
                    )
                    return
                self.arguments = decision.arguments
            elif not (decision is None or isinstance(decision, Allow)):
                self._settle(
                    "decline",
                    ToolResult.failure(
                        ResultCode.FAILED,
                        f"before_tool_call returned {type(decision).__name__}, "
                        "not Allow, Reject, Rewrite or None",
                    ),
                )
                return
        if self.app is not None:
            await self._run_app(self.app)
            return
        if registered is None:
            message = f"no tool named {self.name!r} is available"
            if self.name in self.turn.session.ignored_app_tools:
                message += (
                    ": the client hosts it as an app tool, but the agent does not accept app "
                    "tools (define_agent(client_tools='accept') offers them to the model)"
                )
            self._settle("decline", ToolResult.failure(ResultCode.FAILED, message))
            return
        if not self._send("allow"):
            return
        try:
            value = self._validate(registered)
        except InvalidArguments as exc:
            self._settle("finish", ToolResult.failure(ResultCode.INVALID, str(exc)))
            return
        except Exception as exc:
            _failed("validating the arguments", self.call_id, exc)
            self._settle(
                "finish",
                ToolResult.failure(ResultCode.FAILED, f"validation failed: {_describe(exc)}"),
            )
            return
        self._settle("finish", await self._execute(registered, value))

    def _checked(self, app: RegisteredApp) -> bool:
        """Check an allowed app call's arguments and its place in line; False if that
        settled it (INVALID, or FAILED over ``max_queued_app_calls``)."""
        try:
            if not isinstance(self.arguments, dict):
                raise InvalidArguments("arguments are not a JSON object")
            app.check_schema(self.arguments)
        except InvalidArguments as exc:
            self._settle("finish", ToolResult.failure(ResultCode.INVALID, str(exc)))
            return False
        if self.clear_to_send is None:
            limit = self.turn.session.max_queued_app_calls
            message = f"too many app calls waiting for the app (limit {limit})"
            self._settle("finish", ToolResult.failure(ResultCode.FAILED, message))
            return False
        return True

    async def _run_app(self, app: RegisteredApp) -> None:
        if not self._send("allow") or not self._checked(app):
            return
        assert self.clear_to_send is not None
        await self.clear_to_send.wait()
        # Woken by the previous call's end, which may be Turn.interrupt() ending every call
        # (this one too) just before it cancels the turn's scope: never send a call that
        # already has its result, nor one whose scope is cancelled (session close).
        if self.machine.final:
            return
        await trio.lowlevel.checkpoint_if_cancelled()
        host = self.turn.session.app_host
        if host is None:
            self._settle("finish", ToolResult.failure(ResultCode.FAILED, "no app is connected"))
            return
        sent = self._send_app(host)
        if sent is not None:
            await self._wait_app(sent)

    def _send_app(self, host: AppHost) -> AppWait | None:
        """``tool.call`` to the client now; what waits for its result, or None if it could
        not be sent (the call settled with the host's answer)."""
        sent = host.send_app(self)
        if isinstance(sent, ToolResult):
            self._settle("finish", sent)
            return None
        return sent

    async def _wait_app(self, sent: AppWait) -> None:
        """Wait for a sent app call's result, at most ``client_tool_timeout``."""
        timeout = self.turn.session.agent.client_tool_timeout
        with trio.move_on_after(timeout):
            self.answered(await sent.wait())  # the host may have settled it already
            return
        self._settle(
            "finish",
            ToolResult.failure(
                ResultCode.TIMEOUT,
                f"no result from the app within {timeout:g} s; the call may still have "
                "completed in the app",
            ),
        )

    def _validate(self, registered: RegisteredTool) -> Any:
        if not isinstance(self.arguments, dict):
            raise InvalidArguments("arguments are not a JSON object")
        value = registered.check_schema(self.arguments)
        if registered.validate is not None:
            value = registered.validate(value)
        return value

    async def _execute(self, registered: RegisteredTool, value: Any) -> ToolResult:
        tool = registered.tool
        turn = self.turn
        ctx = ToolContext(
            call_id=self.call_id,
            turn_id=turn.turn_id,
            epoch=turn.epoch,
            name=self.name,
            signal=self.signal,
            progress=self.progress,
            principal=turn.session.principal,
            max_progress_bytes=turn.session.max_progress_bytes,
        )
        try:
            if tool.timeout is None:
                return ToolResult.success(await tool.run(value, ctx))
            # The signal aborts at the deadline itself, not once the run has unwound, so
            # committing() refuses a commit that would start after the deadline.
            deadline = trio.current_time() + tool.timeout
            self.signal.set_deadline(deadline)
            with trio.move_on_at(deadline):
                return ToolResult.success(await tool.run(value, ctx))
            self.signal.abort("timeout")
            return ToolResult.failure(
                ResultCode.TIMEOUT, f"no result within {tool.timeout:g} s; the run was cancelled"
            )
        except ToolFailed as exc:  # a failure the tool reports (an MCP isError)
            log.info("server tool %r failed (call %s): %s", self.name, self.call_id, exc.message)
            return ToolResult.failure(ResultCode.FAILED, exc.message)
        except Exception as exc:
            _failed(f"server tool {self.name!r}", self.call_id, exc)
            return ToolResult.failure(ResultCode.FAILED, _describe(exc))

    def progress(self, progress: Any) -> None:
        """``ctx.emit``: a ``progress`` phase while running; dropped once the call ended."""
        if self._send("progress"):
            self.trace.progress(progress)
            self._emit(Phase.PROGRESS, progress=progress)

    # -- results and events -----------------------------------------------------------------------

    def _send(self, event: str) -> bool:
        """Send ``event``; a late event after a final state is logged and dropped."""
        try:
            self.machine.send(event)
        except InvalidTransition:
            if not self.machine.final:
                raise
            log.debug("call %s is %s: late %r dropped", self.call_id, self.machine.state, event)
            return False
        return True

    def _settle(self, event: str, result: ToolResult) -> None:
        if self._send(event):
            self._end(result, Phase.SETTLED, ok=result.ok, code=result.code, message=result.message)

    def _end(self, result: ToolResult, phase: Phase, **fields: Any) -> None:
        self.result = result
        if self.clear_to_send is not None:
            line = self.turn.session.app_line
            first = line[0] is self
            line.remove(self)
            if first and line:
                assert line[0].clear_to_send is not None
                line[0].clear_to_send.set()  # the next app call may be sent now
        self.trace.end(phase, result)
        self._emit(phase, **fields)
        self.turn.call_ended(self)

    def record(self) -> CallRecord:
        """The call's history record; only valid once the call has its result."""
        assert self.result is not None, f"call {self.call_id} has no result yet"
        return CallRecord(
            call_id=self.call_id,
            name=self.name,
            kind=self.kind,
            arguments=self.arguments if self.text is not None else "".join(self.fragments),
            result=self.result,
        )

    def _emit(self, phase: Phase, **fields: Any) -> None:
        session = self.turn.session
        if not session.watched:
            return
        turn = self.turn
        session.emit(
            tool_stream(
                self.call_id, turn.turn_id, turn.epoch, self.name, self.kind, phase, **fields
            )
        )
        if not session.previews_watched:
            return
        fragments = self.fragments
        text = self.text
        session.emit_preview(
            ToolPreview(
                call_id=self.call_id,
                turn_id=turn.turn_id,
                name=self.name,
                arguments=text
                if text is not None
                else TextSoFar(fragments, len(fragments), self.chars),
                complete=text is not None,
            )
        )


def _too_large(limit: int) -> str:
    return f"the model's arguments are over the limit of {limit} bytes"


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_not_json)
"""Made once: ``json.loads`` with a keyword builds a decoder each call (~1.5 µs)."""


def _failed(what: str, call_id: str, exc: Exception) -> None:
    """Log user code that raised for a call (a tool, the hook, a validator): the call ends
    FAILED with the exception's text, a result like any other, so a warning line, and the
    traceback at DEBUG (a client can steer the model into it: never an ERROR)."""
    log.warning("%s raised for call %s: %s", what, call_id, _describe(exc))
    log.debug("%s raised for call %s", what, call_id, exc_info=exc)


def _describe(exc: BaseException) -> str:
    """An exception as type and text, never a traceback."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _not_json_object(arguments: Any) -> str | None:
    """Why ``arguments`` (a hook's rewrite) cannot be a call's arguments, or None: they
    reach the app, the wire and the model as JSON, so NaN, Infinity or a set would make a
    frame no peer reads."""
    if not isinstance(arguments, dict):
        return f"to a {type(arguments).__name__}, not a JSON object"
    try:
        json.dumps(arguments, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"to something that is not JSON: {_describe(exc)}"
    return None
