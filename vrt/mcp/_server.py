"""One MCP server's connection, and its tools as ``vrt.ServerTool``\\ s.

:class:`McpServer` owns the official SDK's client in a task of its own nursery (the
``async with vrt.mcp.connect_*`` block's): it lists the server's tools at the start and
again on ``notifications/tools/list_changed`` (the agent takes the new list at its next
model step, never mid-step: :attr:`McpServer.version`), and runs each call. A call is
the SDK's ``tools/call`` in the call's own task: a progress notification is a
``progress`` phase (``ctx.emit``); an interrupt cancels that task, the SDK sends
``notifications/cancelled`` for the request and the engine settles the call INTERRUPTED
at once, without waiting for the server; ``isError`` is FAILED with the result's text.

A server that dies (its process exits, its HTTP endpoint goes) fails the calls it had
open (FAILED, saying so); later calls fail with a clear error, and a stdio server is
started again for the next call (at most once every :data:`RESTART_PAUSE` seconds).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from vrt._engine.context import ToolContext
from vrt._engine.tools import ServerTool, check_tool
from vrt._errors import DefinitionError, ToolFailed, VrtError
from vrt.mcp._mapping import (
    RiskOverride,
    description_of,
    failure_of,
    output_of,
    parameters_of,
    progress_of,
    risk_of,
    vrt_name,
)

log = logging.getLogger("vrt.mcp")

RESTART_PAUSE = 1.0
"""Seconds between two starts of a stdio server that died."""
CONNECT_TIMEOUT = 30.0
"""Seconds to start (or reach) a server and list its tools."""
LISTEN_TIMEOUT = 5.0
"""Seconds for a 2026-07-28 server to acknowledge the tool list subscription."""
ELICIT_TIMEOUT = 300.0
"""Seconds an elicitation may wait for the user when the tools have no timeout."""
LIST_PAGES = 100
"""Pages of ``tools/list`` read at most (a server whose cursor never ends is cut off)."""

Elicit = Callable[[Any], Awaitable[Any]]
"""``on_elicit``: an async function of the request (:class:`Elicitation`) returning
``{"action": "accept", "content": {...}}``, ``"decline"`` or ``"cancel"``."""


class McpError(VrtError):
    """The MCP server cannot be reached, or broke the protocol."""


class Elicitation:
    """What an MCP server asks the user mid-call (``elicitation/create``), as ``on_elicit``
    receives it: the server's ``message``, the JSON Schema of the answer it wants
    (``schema``, for a form; None for a URL request), and its ``url`` if it asks the user
    to open one."""

    __slots__ = ("message", "mode", "schema", "server", "url")

    def __init__(self, server: str, params: Any) -> None:
        self.server = server
        self.message: str = str(getattr(params, "message", ""))
        self.mode: str = str(getattr(params, "mode", None) or "form")
        self.schema: dict[str, Any] | None = getattr(params, "requested_schema", None)
        self.url: str | None = getattr(params, "url", None)

    def __repr__(self) -> str:
        return f"Elicitation(server={self.server!r}, message={self.message!r})"


class McpServer:
    """A connected MCP server: :attr:`tools`, kept current (see the module's docstring).

    Made by :func:`vrt.mcp.connect_stdio` / :func:`vrt.mcp.connect_http`; usable while
    their ``async with`` block runs.
    """

    def __init__(
        self,
        label: str,
        client: Callable[..., Any],
        *,
        prefix: str = "",
        risk: RiskOverride = None,
        timeout: float | None = None,
        on_elicit: Elicit | None = None,
        restart: bool = False,
    ) -> None:
        self.label = label
        """The server as logs and errors name it (its command, or its URL)."""
        self._open = client
        self.prefix = prefix
        self.risk = risk
        self.timeout = timeout
        self.on_elicit = on_elicit
        self.restart = restart
        self.version = 0
        """Bumped whenever :attr:`tools` changes (the agent looks at each model step)."""
        self._tools: tuple[ServerTool, ...] = ()
        self._client: Any = None
        self._up = trio.Event()
        """Set while a connection is up (a new one once it goes)."""
        self._gone = trio.Event()
        self._calls = 0
        """Calls in flight (an elicitation lives no longer than they do)."""
        self._asking: set[trio.CancelScope] = set()
        self._closing = False
        self._nursery: trio.Nursery | None = None
        self.restarts = 0
        """How many times the server was started again after dying."""

    @property
    def tools(self) -> list[ServerTool]:
        """The server's tools as :class:`vrt.ServerTool` (a new list each time)."""
        return list(self._tools)

    def current(self) -> Sequence[ServerTool]:
        """The tools now (what the agent asks, at each model step)."""
        return self._tools

    # -- the connection --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the connection until cancelled; ``started`` once the tools are listed (a
        server that cannot be reached then raises :class:`McpError`)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            first = True
            while True:
                try:
                    await self._connected_once(task_status if first else None)
                except McpError:
                    if first:
                        raise
                except Exception as exc:  # the SDK's own, as the server went
                    if first:
                        raise McpError(f"MCP server {self.label}: {_short(exc)}") from None
                    log.warning("MCP server %s: the connection failed: %s", self.label, _short(exc))
                first = False
                self._down()
                if not self.restart or self._closing:
                    await trio.sleep_forever()  # calls fail at once from now on
                await trio.sleep(RESTART_PAUSE)
                self.restarts += 1
                log.info("MCP server %s: starting it again", self.label)

    async def _connected_once(self, task_status: trio.TaskStatus[None] | None) -> None:
        self._gone = trio.Event()
        with trio.fail_after(CONNECT_TIMEOUT) as connecting:
            client = self._open(
                message_handler=self._on_message, elicitation_callback=self._on_elicit
            )
            async with client, trio.open_nursery() as nursery:
                await self._list(client)
                connecting.deadline = math.inf
                self._client = client
                self._up.set()
                if _modern(client):  # 2026-07-28: list changes come by subscription
                    await nursery.start(self._listen, client)
                if task_status is not None:
                    task_status.started()
                await self._gone.wait()
                nursery.cancel_scope.cancel()

    async def _listen(
        self, client: Any, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """``subscriptions/listen`` for the tool list (a 2026-07-28 server), ``started``
        once the server acknowledged it (or refused: then it sends
        ``notifications/tools/list_changed``, or nothing)."""
        try:
            with trio.move_on_after(LISTEN_TIMEOUT) as waiting:
                listening = client.listen(tools_list_changed=True)
                subscription = await listening.__aenter__()
            if waiting.cancelled_caught:
                raise McpError(f"no acknowledgment within {LISTEN_TIMEOUT:g} s")
        except Exception as exc:
            log.info("MCP server %s: no tool list subscription (%s)", self.label, _short(exc))
            task_status.started()
            return
        task_status.started()
        try:
            async for _ in subscription:
                await self._relist()
        except Exception as exc:
            log.info("MCP server %s: its tool list subscription ended: %s", self.label, _short(exc))
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await listening.__aexit__(None, None, None)

    def _down(self) -> None:
        """The connection is gone: calls from now on wait for the next one (stdio), or
        fail (HTTP)."""
        if self._client is not None:
            self._client = None
            self._up = trio.Event()
        self._gone.set()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):  # the transport failed: the server is gone
            log.info("MCP server %s: %s", self.label, _short(message))
            self._down()
            return
        method = getattr(getattr(message, "root", message), "method", None)
        if method == "notifications/tools/list_changed" and self._nursery is not None:
            self._nursery.start_soon(self._relist)
        await trio.lowlevel.checkpoint()

    async def _relist(self) -> None:
        client = self._client
        if client is None:
            return
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                await self._list(client)
        except Exception as exc:
            log.warning(
                "MCP server %s: its new tool list was not read: %s", self.label, _short(exc)
            )

    async def _list(self, client: Any) -> None:
        """Read every page of the server's tools, map them, and publish the new list."""
        listed: list[Any] = []
        cursor = None
        for _ in range(LIST_PAGES):
            page = await (client.list_tools(cursor=cursor) if cursor else client.list_tools())
            listed.extend(page.tools)
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                break
        tools: list[ServerTool] = []
        names: set[str] = set()
        for mcp_tool in listed:
            tool = self._tool(mcp_tool)
            if tool is None:
                continue
            if tool.name in names:
                log.warning(
                    "MCP server %s: two tools are named %r once made vrt names: the second "
                    "is left out",
                    self.label,
                    tool.name,
                )
                continue
            names.add(tool.name)
            tools.append(tool)
        if [_signature(t) for t in tools] != [_signature(t) for t in self._tools]:
            self._tools = tuple(tools)
            self.version += 1

    def _tool(self, mcp_tool: Any) -> ServerTool | None:
        name = vrt_name(mcp_tool.name, self.prefix)
        tool = ServerTool(
            name=name,
            description=description_of(mcp_tool),
            parameters=parameters_of(mcp_tool),
            risk=risk_of(mcp_tool, self.risk),
            run=functools.partial(self._call, mcp_tool.name),
            timeout=self.timeout,
            source=self,
        )
        try:
            check_tool(tool)
        except DefinitionError as exc:
            log.warning("MCP server %s: tool %r left out: %s", self.label, mcp_tool.name, exc)
            return None
        return tool

    # -- calls -----------------------------------------------------------------------------------

    async def _call(self, mcp_name: str, arguments: Any, ctx: ToolContext) -> Any:
        client = self._client
        if client is None:
            if not self.restart or self._closing:
                raise ToolFailed(f"the MCP server {self.label} is gone")
            with trio.move_on_after(RESTART_PAUSE + CONNECT_TIMEOUT):
                await self._up.wait()
            client = self._client
            if client is None:
                raise ToolFailed(f"the MCP server {self.label} could not be started again")

        async def progress(value: float, total: float | None, message: str | None) -> None:
            ctx.emit(progress_of(value, total, message))
            await trio.lowlevel.checkpoint()

        self._calls += 1
        try:
            result = await client.call_tool(mcp_name, arguments, progress_callback=progress)
        except trio.Cancelled:
            raise
        except Exception as exc:
            if _closed(exc):
                self._down()
                raise ToolFailed(
                    f"the MCP server {self.label} closed the connection during the call"
                ) from None
            raise ToolFailed(
                f"the MCP server {self.label} refused the call: {_short(exc)}"
            ) from None
        finally:
            self._calls -= 1
            if not self._calls:  # nobody waits for an answer any more
                for scope in self._asking:
                    scope.cancel()
        if getattr(result, "is_error", False):
            raise ToolFailed(failure_of(result))
        return output_of(result)

    async def _on_elicit(self, context: Any, params: Any) -> Any:
        """A server's question mid-call, to ``on_elicit`` (declined without one). It lasts
        no longer than the calls in flight (an interrupt cancels them, and it: ``cancel``),
        nor than the tools' timeout, or :data:`ELICIT_TIMEOUT`."""
        import mcp_types as types

        if self.on_elicit is None or not self._calls:
            return types.ElicitResult(action="decline")
        answer: Any = "cancel"
        with trio.move_on_after(self.timeout or ELICIT_TIMEOUT) as scope:
            self._asking.add(scope)
            try:
                answer = await self.on_elicit(Elicitation(self.label, params))
            finally:
                self._asking.discard(scope)
        if answer in ("decline", "cancel"):
            return types.ElicitResult(action=answer)
        if isinstance(answer, dict) and answer.get("action") in ("accept", "decline", "cancel"):
            return types.ElicitResult(action=answer["action"], content=answer.get("content"))
        log.warning("MCP server %s: on_elicit answered %r: declined", self.label, answer)
        return types.ElicitResult(action="decline")

    def close(self) -> None:
        """The block ends: no restart from now on."""
        self._closing = True


def _signature(tool: ServerTool) -> tuple[Any, ...]:
    """What the model is offered of a tool, and its risk (its run is a new object each
    time it is listed)."""
    return (tool.name, tool.description, tool.parameters, tool.risk)


def _modern(client: Any) -> bool:
    """Whether the connection speaks 2026-07-28 or later (``subscriptions/listen``)."""
    try:
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS
    except ImportError:  # pragma: no cover
        return False
    return getattr(client, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS


def _closed(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection to the server is gone."""
    import anyio

    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | EOFError):
        return True
    code = getattr(getattr(exc, "error", None), "code", getattr(exc, "code", None))
    try:
        from mcp_types import CONNECTION_CLOSED
    except ImportError:  # pragma: no cover
        return False
    return code == CONNECTION_CLOSED


def leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested groups of one (what a nursery wraps an error in),
    else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _short(exc: BaseException, limit: int = 300) -> str:
    exc = leaf(exc)
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
