"""Tools from MCP servers, as ordinary server tools (``pip install 'trio-vrt[mcp]'``).

```python
async with vrt.mcp.connect_stdio("python", ["-m", "mcp_server_time"]) as time_server:
    agent = vrt.define_agent(model=..., tools=[weather, *time_server.tools])
```

Each MCP tool becomes a :class:`vrt.ServerTool`, so every rule of a server tool holds:
the ``before_tool_call`` hook, validation against the server's ``inputSchema``, exactly
one result, the timeout, the epoch. The mapping:

- **risk** from the tool's annotations: ``readOnlyHint`` true is ``"low"``; not read-only
  with ``destructiveHint`` false is ``"medium"``; otherwise ``"high"`` (MCP's defaults say
  an unannotated tool may be destructive). ``risk=`` overrides it: one risk for all, a
  dict by MCP tool name, or a function of the MCP tool.
- ``notifications/progress`` is a ``progress`` phase: ``{"progress", "total", "message"}``
  (those the server sent).
- an **interrupt** cancels the call: the SDK sends ``notifications/cancelled`` for the
  request, and the call is INTERRUPTED at once, without waiting for the server.
- ``isError`` is FAILED, with the result's text (at most 2,000 characters).
- the **output** is ``structuredContent`` when the server gave one, else the content
  blocks as JSON.
- a server that **dies** mid-call fails its open calls (FAILED, saying so); later calls
  fail with a clear error; a stdio server is started again for the next call.
- ``notifications/tools/list_changed`` refreshes the list; an agent takes it at its next
  model step, never mid-step. ``prefix="time_"`` prefixes every name; a name clash
  (with another tool of the agent) is refused at definition like any tool conflict.
- **elicitation** (a server asking the user mid-call): handed to ``on_elicit`` (an async
  function of an :class:`Elicitation`, answering ``{"action": "accept", "content":
  {...}}``, ``"decline"`` or ``"cancel"``), declined when there is none; it never waits
  longer than the calls in flight (an interrupt ends it: ``cancel``), nor than the
  tools' ``timeout`` (or 300 s).

Built on the official ``mcp`` SDK (anyio: it runs under Trio), imported only here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from vrt.mcp._mapping import RiskOverride
from vrt.mcp._server import Elicit, Elicitation, McpError, McpServer, leaf

__all__ = ["Elicitation", "McpError", "McpServer", "connect_http", "connect_stdio"]


def _sdk() -> Any:
    try:
        import mcp
    except ImportError:  # pragma: no cover - the extra is not installed
        raise McpError("the MCP SDK is not installed: pip install 'trio-vrt[mcp]'") from None
    return mcp


@asynccontextmanager
async def connect_stdio(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    prefix: str = "",
    risk: RiskOverride = None,
    timeout: float | None = None,  # noqa: ASYNC109 - each tool's timeout, DESIGN.md's name
    on_elicit: Elicit | None = None,
) -> AsyncIterator[McpServer]:
    """Start the MCP server ``command args`` as a subprocess and talk to it over its
    stdin and stdout; yields it, its tools listed (:attr:`McpServer.tools`).

    ``env`` is added to a minimal environment (the SDK's: ``PATH``, ``HOME``, ...).
    ``timeout`` (seconds) is every tool's (a call over it is TIMEOUT, and cancelled at the
    server). Raises :class:`McpError` if the server does not start or answer within 30 s.
    Leaving the block stops the server (its stdin closed, then terminated, each bounded);
    cancelled, the same. A server that dies is started again for the next call.
    """
    mcp = _sdk()
    from mcp.client.stdio import StdioServerParameters

    parameters = StdioServerParameters(
        command=command, args=list(args), env=dict(env) if env is not None else None, cwd=cwd
    )

    def client(**callbacks: Any) -> Any:
        return mcp.Client(parameters, **callbacks)

    label = " ".join([command, *args])
    async with _serving(
        McpServer(
            label,
            client,
            prefix=prefix,
            risk=risk,
            timeout=timeout,
            on_elicit=on_elicit,
            restart=True,
        )
    ) as server:
        yield server


@asynccontextmanager
async def connect_http(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    prefix: str = "",
    risk: RiskOverride = None,
    timeout: float | None = None,  # noqa: ASYNC109 - each tool's timeout, DESIGN.md's name
    on_elicit: Elicit | None = None,
) -> AsyncIterator[McpServer]:
    """Connect to the MCP server at ``url`` over streamable HTTP (``headers`` go with every
    request: an ``authorization``, say); yields it, its tools listed. Raises
    :class:`McpError` if it cannot be reached within 30 s. A server that goes away fails
    the calls it had open, and later ones (it is not reconnected: its HTTP session is
    gone with it). Leaving the block ends the HTTP session."""
    mcp = _sdk()
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"an MCP URL is http:// or https://, not {url!r}")

    def client(**callbacks: Any) -> Any:
        return mcp.Client(_http_transport(url, dict(headers or {})), **callbacks)

    async with _serving(
        McpServer(url, client, prefix=prefix, risk=risk, timeout=timeout, on_elicit=on_elicit)
    ) as server:
        yield server


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


@asynccontextmanager
async def _serving(server: McpServer) -> AsyncIterator[McpServer]:
    started = False
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            started = True
            try:
                yield server
            finally:
                server.close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        error = leaf(group)
        if not started and isinstance(error, McpError):
            raise error from None  # the server did not start: McpError, not a group
        raise
