"""Hypothesis strategies for the engine: generated scripts, tools the arguments drive, timings.

Public through :mod:`vrt.testing`. The idea: every generated call's arguments say what its
tool will do (``{"do": "ok" | "none" | "raise" | "slow" | "refuse", ...}``), so the result
any call must end with is known in advance (:func:`expected_result`), and a test checks every
settled call against it, whatever the interleaving. A call may always end INTERRUPTED
instead (an interrupt got there first) and a truncated one FAILED; nothing else.

- :func:`scripts` (built from :func:`script_steps`, :func:`tool_calls` and
  :func:`tool_arguments`): lists of model steps of ``vrt.say``, ``vrt.call`` (streamed or
  not, in 1-4 chunks, sometimes truncated, to the tools below, with valid, invalid or
  malformed arguments) and ``vrt.pause``.
- :func:`interrupt_times`: seconds on the virtual clock, biased to the instants where
  things happen (pause, hook, tool and timeout boundaries), where races live.
- :func:`scripted_agent` builds the agent that hosts the tools: ``lookup`` (server, low
  risk), ``charge`` (server, high risk, 1 s timeout) and, with ``app_tools=True``, the
  client's ``edit`` (:func:`scripted_app_tools`, 2 s ``client_tool_timeout``); ``nope`` is
  hosted by nobody. Its ``before_tool_call`` hook obeys the arguments' ``"hook"``
  (``"reject"``, ``"raise"``, ``"rewrite"``) and, with ``confirm=True``, asks the user (via
  :func:`vrt.require_confirmation`) before every ``charge`` call and every app call whose
  arguments say ``"ask": true`` (:func:`asks_confirmation`).
- :class:`TurnScripts`: a model playing one generated script per user input, so a
  stateful test can generate each turn's script when it starts the turn.

Hypothesis is a test dependency: it is imported when a strategy is built, not before, so
the rest of this module (and :mod:`vrt.testing`) works without it.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

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
from vrt.models._scripted import ScriptedCall, ScriptedModel, ScriptItem, call, pause, say

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

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
    "interrupt_times",
    "script_steps",
    "scripted_agent",
    "scripted_app_tools",
    "scripts",
    "tool_arguments",
    "tool_calls",
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

_BAD_ARGUMENTS: tuple[Any, ...] = (
    {"do": "explode"},  # not in the enum
    {"t": 0.25},  # "do" missing
    {"do": "ok", "extra": 1},  # additionalProperties
    {"do": "ok", "p": -1},
    '{"do": ',  # malformed JSON text
    "[1, 2]",  # JSON, but not an object
    '"ok"',
    '{"do": NaN}',  # not JSON (a Python extension)
    "",
)


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


# -- strategies ----------------------------------------------------------------------------------


def tool_arguments() -> SearchStrategy[Any]:
    """Arguments for a generated call: mostly valid objects of :data:`PARAMETERS`, some
    invalid ones, some malformed JSON text (raw strings are sent as the arguments' text)."""
    from hypothesis import strategies as st

    plain = st.fixed_dictionaries(
        {
            "do": st.sampled_from(
                ("ok", "ok", "ok", "none", "raise", "slow", "slow", "slow", "refuse")
            )
        },
        optional={
            "t": st.sampled_from(_DURATIONS),
            "p": st.integers(0, 3),
            "ask": st.booleans(),
        },
    )
    hooked = st.builds(lambda args, hook: {**args, "hook": hook}, plain, st.sampled_from(_HOOKS))
    return st.one_of(plain, plain, plain, plain, hooked, st.sampled_from(_BAD_ARGUMENTS))


def tool_calls(names: Sequence[str] = TOOL_NAMES) -> SearchStrategy[ScriptedCall]:
    """A ``vrt.call`` to one of ``names`` (``lookup`` the most, ``nope`` the least):
    streamed in 1-4 chunks or not, truncated one time in five (the model stops before
    completing the arguments)."""
    from hypothesis import strategies as st

    weights = {"lookup": 3, "charge": 2, "edit": 2}  # nope (hosted by nobody): 1
    return st.builds(
        call,
        st.sampled_from([name for name in names for _ in range(weights.get(name, 1))]),
        tool_arguments(),
        chunks=st.integers(1, 4),
        stream=st.booleans(),
        truncate=st.sampled_from((False, False, False, False, True)),
    )


def script_steps(
    names: Sequence[str] = TOOL_NAMES, *, min_items: int = 0, max_items: int = 4
) -> SearchStrategy[list[ScriptItem]]:
    """One model step: ``min_items`` to ``max_items`` items, half of them calls
    (:func:`tool_calls`), the rest ``vrt.say`` and ``vrt.pause``. A step without calls
    ends the turn."""
    from hypothesis import strategies as st

    item: SearchStrategy[ScriptItem] = st.one_of(
        tool_calls(names),
        tool_calls(names),
        st.builds(say, st.text(max_size=6)),
        st.builds(pause, st.sampled_from((0, 0.1, 0.25, 0.5, 1.0))),
    )
    return st.lists(item, min_size=min_items, max_size=max_items)


def scripts(
    names: Sequence[str] = TOOL_NAMES,
    *,
    min_steps: int = 1,
    max_steps: int = 3,
    min_items: int = 1,
    max_items: int = 4,
) -> SearchStrategy[list[list[ScriptItem]]]:
    """A script: ``min_steps`` to ``max_steps`` model steps (:func:`script_steps`), for
    :class:`vrt.ScriptedModel` or :meth:`TurnScripts.add`."""
    from hypothesis import strategies as st

    step = script_steps(names, min_items=min_items, max_items=max_items)
    return st.lists(step, min_size=min_steps, max_size=max_steps)


_INSTANTS = (0.0, HOOK_DELAY, 0.25, 0.5, TOOL_TIMEOUT, 1.5, CLIENT_TOOL_TIMEOUT, SLOW)


def interrupt_times(max_seconds: float = 4.0) -> SearchStrategy[float]:
    """When to interrupt, in seconds on the (virtual) clock from now: half the time exactly
    at an instant where something happens (the hook decides, a run or pause ends, a timeout
    fires), where interrupts race the engine; otherwise anywhere up to ``max_seconds``."""
    from hypothesis import strategies as st

    instants = tuple(t for t in _INSTANTS if t <= max_seconds)
    return st.one_of(
        st.sampled_from(instants),
        st.floats(0, max_seconds, allow_nan=False, allow_infinity=False),
    )
