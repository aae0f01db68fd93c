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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vrt.models._scripted import ScriptedCall, ScriptItem, call, pause, say
from vrt.testing._scripted_agent import (
    _DURATIONS,
    _HOOKS,
    CLIENT_TOOL_TIMEOUT,
    HOOK_DELAY,
    SLOW,
    TOOL_NAMES,
    TOOL_TIMEOUT,
)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["interrupt_times", "script_steps", "scripts", "tool_arguments", "tool_calls"]

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
