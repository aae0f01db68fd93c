"""The app tools a client hosts, run one at a time as the server calls them.

Which app call runs next, and whether an answer still goes out, is the client's protocol
core's (:class:`~vrt._wire.client.ClientProtocol`: the epoch gate, the serial queue); this
module runs one call's tool under its own cancel scope and ``AbortSignal``-like
:class:`~vrt.Signal`, and turns what the tool does into its one result.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import trio

from vrt._core.results import ResultCode, ToolResult
from vrt._engine.context import Signal, ToolContext
from vrt._engine.tools import AppTool
from vrt._errors import InvalidArguments, VrtError
from vrt._wire.client import AppCallTicket

log = logging.getLogger("vrt.client")


class AppTools:
    """The app tools of one client, by name, and the call that runs now."""

    __slots__ = ("_running", "tools")

    def __init__(self, tools: Sequence[AppTool]) -> None:
        for tool in tools:
            if not isinstance(tool, AppTool):
                raise TypeError(f"tools must be vrt.AppTool, not {tool!r}")
        self.tools = {tool.name: tool for tool in tools}
        self._running: tuple[str, trio.CancelScope, Signal] | None = None

    def abort(self, call_id: str, reason: str) -> None:
        """Stop ``call_id``'s tool if it runs now: its signal says why, its scope is
        cancelled (its result is never sent)."""
        running = self._running
        if running is not None and running[0] == call_id:
            running[2].abort(reason)
            running[1].cancel()

    async def run(self, ticket: AppCallTicket) -> ToolResult:
        """Run the tool of ``ticket``: its output (JSON only), INVALID for arguments its
        ``validate`` refused, FAILED if it raised (its type and text, no traceback) or is
        not hosted here; INTERRUPTED (never sent) if it was aborted."""
        tool = self.tools.get(ticket.name)
        if tool is None:
            return ToolResult.failure(
                ResultCode.FAILED, f"the app does not host a tool named {ticket.name!r}"
            )
        signal = Signal()
        scope = trio.CancelScope()
        self._running = (ticket.call_id, scope, signal)
        ctx = ToolContext(
            call_id=ticket.call_id,
            turn_id=ticket.turn_id,
            epoch=ticket.epoch,
            name=ticket.name,
            signal=signal,
            progress=_no_progress,
        )
        try:
            with scope:
                output = await tool.run(ticket.arguments, ctx)
                try:
                    json.dumps(output, allow_nan=False)
                except (TypeError, ValueError) as exc:
                    return ToolResult.failure(
                        ResultCode.FAILED, f"output is not JSON-serialisable: {exc}"
                    )
                return ToolResult.success(output)
            return ToolResult.failure(ResultCode.INTERRUPTED, "aborted")  # never sent
        except InvalidArguments as exc:
            return ToolResult.failure(ResultCode.INVALID, str(exc))
        except Exception as exc:
            log.exception("app tool %r raised (call %s)", ticket.name, ticket.call_id)
            text = str(exc)
            return ToolResult.failure(
                ResultCode.FAILED, f"{type(exc).__name__}: {text}" if text else type(exc).__name__
            )
        finally:
            self._running = None


def _no_progress(progress: Any) -> None:
    raise VrtError("ctx.emit is for server tools: the wire carries no progress for app tools")
