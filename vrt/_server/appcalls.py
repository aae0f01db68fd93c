"""App calls over the wire: the engine's app host for one session on the server.

The engine hands an app call to :meth:`AppCalls.send_app` once it may run; its ``tool.call``
goes out at once, and the call's task waits on what it gets back (:class:`Waiting`) for the
``tool.result`` that :meth:`AppCalls.result` takes from the client. Which result is the
awaited one, and what a late, stale, duplicate or unknown one is answered, is the protocol
core's book-keeping (:meth:`~vrt._wire.server.ServerProtocol.take_result`); here only the
waiting tasks are woken.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from vrt._core.results import ResultCode, ToolResult
from vrt._engine.call import Call
from vrt._wire import messages as m
from vrt._wire.endpoint import FrameTooLarge
from vrt._wire.server import ServerProtocol


class AppCalls:
    """The app host of one session (:class:`vrt._engine.call.AppHost`): app calls sent to
    the client, waiting for their ``tool.result``."""

    __slots__ = ("_flush", "proto", "waiting")

    def __init__(self, proto: ServerProtocol, flush: Callable[[], None]) -> None:
        self.proto = proto
        self._flush = flush
        self.waiting: dict[str, Waiting] = {}
        """App calls sent, waiting for the client's result (until their terminal phase)."""

    @property
    def eager(self) -> bool:
        """With ``batch-v1``: an app call's ``tool.call`` is queued with its
        ``arguments-complete``, so they leave in one frame. Without it the order of the
        frames stays what it always was."""
        return self.proto.batching

    def send_app(self, call: Call) -> Waiting | ToolResult:
        """Send an app call's ``tool.call`` now; what waits for its ``tool.result``."""
        try:
            self.proto.send_call(
                call.call_id, call.turn.turn_id, call.turn.epoch, call.name, call.arguments
            )
        except FrameTooLarge:  # a Rewrite hook's arguments: the engine bounds the model's
            message = "the call's arguments are over what the client takes (max_message_size)"
            return ToolResult.failure(ResultCode.FAILED, message)
        waiting = self.waiting[call.call_id] = Waiting(call)
        self._flush()
        return waiting

    def result(self, message: m.ToolResultMessage, epoch: int) -> None:
        """A ``tool.result`` from the client, the session in ``epoch``: the awaited result
        settles its call; any other is answered with its error by the protocol core."""
        if not self.proto.take_result(message, epoch):
            return
        waiting = self.waiting.pop(message.call_id)
        wire = message.result
        result = waiting.result = (
            ToolResult.success(wire.output)
            if wire.ok
            else ToolResult.failure(ResultCode(wire.code or "FAILED"), wire.message)
        )
        waiting.done.set()
        # Settled here, in the reader's task: ``settled`` leaves with this frame's other
        # answers, not a scheduler pass later from the call's task (which just ends).
        waiting.call.answered(result)

    def ended(self, call_id: str) -> None:
        """An app call's terminal phase went out: ended without the app's result
        (interrupt or timeout), the app is sent ``tool.abort`` after it, so the tool
        learns why it stops."""
        if self.waiting.pop(call_id, None) is not None:
            self.proto.end_call(call_id)


class Waiting:
    """An app call waiting for the client's ``tool.result`` (the engine's ``AppWait``)."""

    __slots__ = ("call", "done", "result")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.done = trio.Event()
        self.result: ToolResult | None = None

    async def wait(self) -> ToolResult:
        """The client's result (see :meth:`AppCalls.result`)."""
        await self.done.wait()
        assert self.result is not None
        return self.result
