"""The agent: a model, its tools, and the policy around calls (the before_tool_call hook)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import attrs

from vrt._core.results import Kind
from vrt._engine.tools import (
    AppTool,
    Risk,
    ServerTool,
    ToolSource,
    Validator,
    check_tool,
    compile_validate,
    schema_validator,
)
from vrt._errors import DefinitionError
from vrt.models import Model, ToolSpec
from vrt.models._realtime import RealtimeModel, is_realtime

log = logging.getLogger("vrt")


@attrs.frozen(kw_only=True)
class CallInfo:
    """What the ``before_tool_call`` hook sees of a call."""

    call_id: str
    turn_id: str
    epoch: int
    name: str
    kind: Kind
    risk: Risk | None
    """The server tool's risk; None for app tools."""
    arguments: Any
    """The parsed arguments, or the raw JSON text when they did not parse."""


@attrs.frozen
class Allow:
    """Let the call run as it is (returning None from the hook means the same)."""


@attrs.frozen
class Reject:
    """Decline the call: its result is REJECTED with ``reason`` as the message."""

    reason: str = "rejected by before_tool_call"


@attrs.frozen
class Rewrite:
    """Run the call with these arguments instead (validation still applies)."""

    arguments: dict[str, Any]


Decision = Allow | Reject | Rewrite | None
BeforeToolCall = Callable[[CallInfo], Awaitable[Decision]]
ClientTools = Literal["ignore", "accept"]


@attrs.frozen(kw_only=True)
class RegisteredTool:
    """A checked server tool with its validators compiled once."""

    tool: ServerTool
    check_schema: Validator
    validate: Validator | None


@attrs.frozen(kw_only=True)
class RegisteredApp:
    """An app tool a connected client hosts, with its schema compiled once."""

    spec: ToolSpec
    check_schema: Validator


@attrs.frozen(kw_only=True)
class Agent:
    """A checked agent definition; build it with :func:`define_agent`."""

    model: Model | RealtimeModel
    tools: tuple[ServerTool, ...]
    client_tools: ClientTools
    before_tool_call: BeforeToolCall | None
    client_tool_timeout: float
    instructions: str
    max_steps: int
    registry: dict[str, RegisteredTool] = attrs.field(repr=False)
    specs: tuple[ToolSpec, ...] = attrs.field(repr=False)
    sources: tuple[ToolSource, ...] = attrs.field(default=(), repr=False)
    """The live sources among the tools (MCP servers), in order of their first tool."""
    name: str = "agent"
    """What traces call the agent (``invoke_agent {name}``, ``gen_ai.agent.name``)."""

    def versions(self) -> tuple[int, ...]:
        """The sources' versions now (a change means new tools for the next step)."""
        return tuple(source.version for source in self.sources)

    def tools_now(self) -> tuple[dict[str, RegisteredTool], tuple[ToolSpec, ...]]:
        """The registry and the specs of the agent's tools as they are now: the fixed
        ones, and each source's current tools in the place of those it had. A source's
        new tool whose name another tool has, or that is not a valid tool, is left out
        (logged): a model step is never offered a clash."""
        registry: dict[str, RegisteredTool] = {}
        specs: list[ToolSpec] = []
        seen: set[int] = set()
        for tool in self.tools:
            source = tool.source
            group = [tool] if source is None else [] if id(source) in seen else source.current()
            if source is not None:
                seen.add(id(source))
            for one in group:
                if one.name in registry:
                    log.warning("tool %r from %s clashes with another: left out", one.name, source)
                    continue
                try:
                    registered = register(one)
                except DefinitionError as exc:
                    log.warning("tool %r from %s left out: %s", one.name, source, exc)
                    continue
                registry[one.name] = registered
                specs.append(ToolSpec(name=one.name, description=one.description,
                                      parameters=one.parameters))  # fmt: skip
        return registry, tuple(specs)


def define_agent(
    *,
    model: Model | RealtimeModel,
    tools: Sequence[ServerTool] = (),
    client_tools: ClientTools = "ignore",
    before_tool_call: BeforeToolCall | None = None,
    client_tool_timeout: float = 30.0,
    instructions: str = "",
    max_steps: int = 8,
    name: str = "agent",
) -> Agent:
    """Check every definition and build an :class:`Agent`.

    Raises :class:`~vrt.DefinitionError` for a server tool without a risk, a ``parameters``
    that is not a valid JSON Schema object, duplicate names, an app tool passed as a server
    tool, or a bad option. ``name`` is what traces call the agent (``invoke_agent
    {name}``).
    """
    if not (callable(getattr(model, "stream", None)) or is_realtime(model)):
        raise DefinitionError(
            "model must have a stream(request) method (see vrt.Model), or be a realtime "
            "model (vrt.models.OpenAIRealtime, GeminiLive)"
        )
    if client_tools not in ("ignore", "accept"):
        raise DefinitionError(f"client_tools must be 'ignore' or 'accept', not {client_tools!r}")
    if not (isinstance(client_tool_timeout, int | float) and client_tool_timeout > 0):
        raise DefinitionError("client_tool_timeout must be a positive number of seconds")
    if not (isinstance(max_steps, int) and max_steps >= 1):
        raise DefinitionError("max_steps must be an integer >= 1")
    if before_tool_call is not None and not callable(before_tool_call):
        raise DefinitionError("before_tool_call must be an async function of vrt.CallInfo")
    if not (isinstance(name, str) and name.strip()):
        raise DefinitionError(f"name must be a non-empty string, not {name!r}")
    registry: dict[str, RegisteredTool] = {}
    for tool in tools:
        if isinstance(tool, AppTool):
            raise DefinitionError(
                f"{tool.name!r} is an app tool: app tools are declared by the client "
                "(vrt.connect(tools=...)), not in define_agent"
            )
        if not isinstance(tool, ServerTool):
            raise DefinitionError(f"tools must be vrt.ServerTool, not {tool!r}")
        if tool.name in registry:
            raise DefinitionError(f"two server tools are named {tool.name!r}")
        registry[tool.name] = register(tool)
    sources: dict[int, ToolSource] = {}
    for tool in tools:
        if tool.source is not None:
            sources.setdefault(id(tool.source), tool.source)
    return Agent(
        model=model,
        tools=tuple(tools),
        client_tools=client_tools,
        before_tool_call=before_tool_call,
        client_tool_timeout=float(client_tool_timeout),
        instructions=instructions,
        max_steps=max_steps,
        registry=registry,
        specs=tuple(
            ToolSpec(name=t.name, description=t.description, parameters=t.parameters) for t in tools
        ),
        sources=tuple(sources.values()),
        name=name,
    )


def register(tool: ServerTool) -> RegisteredTool:
    """``tool`` checked, its validators compiled; :class:`DefinitionError` if it is not a
    valid server tool."""
    check_tool(tool)
    where = f"server tool {tool.name!r}"
    return RegisteredTool(
        tool=tool,
        check_schema=schema_validator(tool.parameters),
        validate=compile_validate(tool.validate, where),
    )
