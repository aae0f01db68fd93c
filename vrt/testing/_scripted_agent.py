"""The agent generated scripts run against: tools that do what each call's arguments say,
so the result every call must end with is known in advance (see :mod:`._strategies`)."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import attrs
import trio

from vrt._core.results import ResultCode, ToolResult
from vrt._engine.agent import (
    Agent,
    BeforeToolCall,
    CallInfo,
    Decision,
    Reject,
    Rewrite,
    define_agent,
)
from vrt._engine.confirm import require_confirmation
from vrt._engine.context import ToolContext
from vrt._engine.tools import AppTool, ServerTool, schema_validator
from vrt._errors import InvalidArguments
from vrt.models import Model, ModelEvent, ModelRequest, UserInput
from vrt.models._scripted import ScriptedCall, ScriptedModel, ScriptItem

__all__ = [
    "CLIENT_TOOL_TIMEOUT",
    "HOOK_DELAY",
    "PARAMETERS",
    "SLOW",
    "TOOL_NAMES",
    "TOOL_TIMEOUT",
    "TurnScripts",
    "asks_confirmation",
    "expected_result",
    "scripted_agent",
    "scripted_app_tools",
    "truncated",
]

SLOW = 3.0
"""Seconds a ``"do": "slow"`` run takes: past every timeout, a window for interrupts."""
TOOL_TIMEOUT = 1.0
"""``charge``'s timeout: a slow ``charge`` ends TIMEOUT."""
CLIENT_TOOL_TIMEOUT = 2.0
"""The agent's ``client_tool_timeout``: a slow app call ends TIMEOUT."""
HOOK_DELAY = 0.1
"""Seconds the ``before_tool_call`` hook takes before it decides (a window for interrupts)."""

TOOL_NAMES = ("lookup", "charge", "edit", "nope")
"""What generated calls call: two server tools, one app tool, one tool nobody hosts."""
_SERVER_NAMES = frozenset({"lookup", "charge"})
_APP_NAMES = frozenset({"edit"})

_DOS = ("ok", "none", "raise", "slow", "refuse")
_HOOKS = ("reject", "raise", "rewrite")
_REWRITTEN = {"do": "ok"}
_DURATIONS = (0, 0.25, 0.5)  # "t" values: all shorter than every timeout

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "do": {"enum": list(_DOS)},
        "t": {"type": "number", "minimum": 0, "maximum": 10},
        "p": {"type": "integer", "minimum": 0, "maximum": 3},
        "hook": {"enum": list(_HOOKS)},
        "ask": {"type": "boolean"},
    },
    "required": ["do"],
    "additionalProperties": False,
}
"""The JSON Schema of every generated tool's arguments.

``do``: what the run does: return ``{"done": call_id}`` (``ok``), return None (``none``),
raise (``raise``), take :data:`SLOW` seconds then return (``slow``), or fail validation
(``refuse``: the server tools' ``validate``, the app tool's ``run``). ``t``: seconds the run
takes (not for ``slow``); ``p``: progress reports of a server run; ``hook``: what the
``before_tool_call`` hook does; ``ask``: an app call asks the user first.
"""

_check_parameters = schema_validator(PARAMETERS)

# -- the tools -----------------------------------------------------------------------------------


async def _behave(args: dict[str, Any], ctx: ToolContext | Any, *, server: bool) -> Any:
    do = args["do"]
    if do == "refuse":  # only an app tool gets here: a server tool's validate refused it
        raise InvalidArguments("refused by the tool")
    seconds = SLOW if do == "slow" else float(args.get("t", 0))
    reports = int(args.get("p", 0)) if server else 0  # ctx.emit is for server tools
    for i in range(reports):
        await trio.sleep(seconds / (reports + 1))
        ctx.emit({"step": i})
    await trio.sleep(seconds / (reports + 1))
    if do == "raise":
        raise RuntimeError("the tool broke")
    if server:
        async with ctx.committing():  # refuses once the call was interrupted or timed out
            await trio.lowlevel.checkpoint()
    return None if do == "none" else {"done": ctx.call_id}


async def _run_server(args: dict[str, Any], ctx: ToolContext) -> Any:
    return await _behave(args, ctx, server=True)


async def _run_app(args: Any, ctx: Any) -> Any:
    if not isinstance(args, dict):
        raise InvalidArguments("arguments are not a JSON object")
    return await _behave(args, ctx, server=False)


def _validate(args: dict[str, Any]) -> dict[str, Any]:
    if args["do"] == "refuse":
        raise ValueError("refused by validate")
    return args


def _server_tools() -> list[ServerTool]:
    return [
        ServerTool(
            name="lookup",
            description="Look something up (the arguments say how it goes).",
            parameters=PARAMETERS,
            risk="low",
            run=_run_server,
            validate=_validate,
        ),
        ServerTool(
            name="charge",
            description="Charge the card (high risk; times out after 1 s).",
            parameters=PARAMETERS,
            risk="high",
            run=_run_server,
            validate=_validate,
            timeout=TOOL_TIMEOUT,
        ),
    ]


def scripted_app_tools() -> list[AppTool]:
    """The client's app tools for :func:`scripted_agent` (``edit``): pass them to
    :func:`vrt.testing.open_pair` or :func:`vrt.connect`."""
    return [
        AppTool(
            name="edit",
            description="Edit the document (the arguments say how it goes).",
            parameters=PARAMETERS,
            run=_run_app,
        )
    ]


def _asks(name: str, kind: str, arguments: Any) -> bool:
    if kind == "app":
        return isinstance(arguments, dict) and arguments.get("ask") is True
    return name == "charge"  # the only high-risk tool


def _hook(confirm: bool) -> BeforeToolCall:
    ask_user = require_confirmation("low", apps=True)

    async def before_tool_call(info: CallInfo) -> Decision:
        await trio.sleep(HOOK_DELAY)
        arguments = info.arguments
        directive = arguments.get("hook") if isinstance(arguments, dict) else None
        if directive == "reject":
            return Reject("the hook said no")
        if directive == "raise":
            raise RuntimeError("the hook broke")
        if directive == "rewrite":
            return Rewrite(dict(_REWRITTEN))
        if confirm and _asks(info.name, info.kind, arguments):
            return await ask_user(info)
        return None

    return before_tool_call


@functools.cache
def _agent(app_tools: bool, confirm: bool, max_steps: int) -> Agent:
    # define_agent checks every schema against the metaschema: once per variant is enough
    return define_agent(
        model=ScriptedModel([]),
        tools=_server_tools(),
        client_tools="accept" if app_tools else "ignore",
        before_tool_call=_hook(confirm),
        client_tool_timeout=CLIENT_TOOL_TIMEOUT,
        max_steps=max_steps,
    )


def scripted_agent(
    model: Model | None = None,
    *,
    app_tools: bool = False,
    confirm: bool = False,
    max_steps: int = 3,
) -> Agent:
    """The agent whose tools the generated scripts call.

    ``model`` defaults to a new :class:`TurnScripts`; ``app_tools=True`` accepts the
    client's app tools (:func:`scripted_app_tools`); ``confirm=True`` makes the hook ask
    the user before the calls :func:`asks_confirmation` names.
    """
    chosen: Model = model if model is not None else TurnScripts()
    return attrs.evolve(_agent(app_tools, confirm, max_steps), model=chosen)


# -- what each call must end with ----------------------------------------------------------------


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _arguments(item: ScriptedCall) -> Any:
    """The arguments as the engine parses them: the object, or the raw text if not JSON."""
    if not isinstance(item.arguments, str):
        return item.arguments
    try:
        return json.loads(item.arguments, parse_constant=_not_json)
    except ValueError:
        return item.arguments


def _kind(name: str, app_tools: bool) -> str:
    return "app" if app_tools and name in _APP_NAMES else "server"


def asks_confirmation(
    item: ScriptedCall, *, app_tools: bool = False, confirm: bool = False
) -> bool:
    """Whether the call waits for the user's answer (a confirmation) before it runs."""
    if not confirm:
        return False
    arguments = _arguments(item)
    if isinstance(arguments, dict) and arguments.get("hook") in _HOOKS:
        return False  # the hook decides first
    return _asks(item.name, _kind(item.name, app_tools), arguments)


def truncated(item: ScriptedCall) -> bool:
    """Whether the model stops before completing the call's arguments (it ends FAILED)."""
    return item.truncate and item.stream


def expected_result(
    item: ScriptedCall,
    *,
    app_tools: bool = False,
    confirm: bool = False,
    approved: bool | None = None,
) -> ToolResult | None:
    """The result a call of :func:`scripted_agent` ends with unless interrupted first.

    ``item`` is the scripted call (with its ``call_id``: an ok output names it);
    ``app_tools`` and ``confirm`` are the agent's options; ``approved`` is the user's answer
    to its confirmation (None: not answered, and then the result is None if the call asks,
    since it cannot end without an answer). Compare ``ok``, ``code`` and ``output``; the
    message is not predicted. A truncated call (:func:`truncated`) ends FAILED.
    """
    if truncated(item):
        return ToolResult.failure(ResultCode.FAILED)
    arguments = _arguments(item)
    name = item.name
    kind = _kind(name, app_tools)
    directive = arguments.get("hook") if isinstance(arguments, dict) else None
    if directive == "reject":
        return ToolResult.failure(ResultCode.REJECTED)
    if directive == "raise":
        return ToolResult.failure(ResultCode.FAILED)
    if directive == "rewrite":
        arguments = dict(_REWRITTEN)
    elif confirm and _asks(name, kind, arguments):
        if approved is None:
            return None
        if not approved:
            return ToolResult.failure(ResultCode.REJECTED)
    if not (name in _SERVER_NAMES or kind == "app"):
        return ToolResult.failure(ResultCode.FAILED)  # nobody hosts it
    try:
        if not isinstance(arguments, dict):
            raise InvalidArguments("arguments are not a JSON object")
        _check_parameters(arguments)
    except InvalidArguments:
        return ToolResult.failure(ResultCode.INVALID)
    do = arguments["do"]
    if do == "refuse":
        return ToolResult.failure(ResultCode.INVALID)
    if do == "raise":
        return ToolResult.failure(ResultCode.FAILED)
    if do == "slow" and (name == "charge" or kind == "app"):
        return ToolResult.failure(ResultCode.TIMEOUT)
    return ToolResult.success(None if do == "none" else {"done": item.call_id})


# -- the model -----------------------------------------------------------------------------------


class TurnScripts:
    """A :class:`vrt.Model` playing one script per user input.

    :meth:`add` registers a script (a list of steps, as for :class:`vrt.ScriptedModel`) and
    returns the text to send as the user's input; the turn started by that input plays it,
    one step per model step (an input it does not know plays nothing). Calls get the ids
    ``u<k>_c<n>`` (script ``k``, ``n``-th call), kept in :attr:`calls`; every request the
    model receives is kept in :attr:`requests`.
    """

    def __init__(self) -> None:
        self.scripts: dict[str, list[list[ScriptItem]]] = {}
        self.calls: dict[str, ScriptedCall] = {}
        """Every scripted call by its call id."""
        self.requests: list[ModelRequest] = []
        """Every request received, in order (their histories are O(1) snapshots)."""

    def add(self, script: Sequence[Sequence[ScriptItem]]) -> str:
        """Register ``script``; return the input text that plays it."""
        key = f"u{len(self.scripts) + 1}"
        steps: list[list[ScriptItem]] = []
        count = 0
        for step in script:
            items: list[ScriptItem] = []
            for item in step:
                if isinstance(item, ScriptedCall):
                    count += 1
                    item = attrs.evolve(item, call_id=f"{key}_c{count}")
                    self.calls[f"{key}_c{count}"] = item
                items.append(item)
            steps.append(items)
        self.scripts[key] = steps
        return key

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        """Play step ``request.step`` of the script of the turn's input."""
        self.requests.append(request)
        key = next(
            (
                item.text
                for item in reversed(request.history)
                if isinstance(item, UserInput) and item.turn_id == request.turn_id
            ),
            None,
        )
        script = self.scripts.get(key or "")
        if script is None or request.step > len(script):
            return
        player = ScriptedModel([script[request.step - 1]]).stream(request)
        async with contextlib.aclosing(player) as events:
            async for event in events:
                yield event
