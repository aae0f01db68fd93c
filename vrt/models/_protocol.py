"""The model protocol: what a model is asked, and the events it streams back (see
:mod:`vrt.models`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import attrs

from vrt._core.results import CallRecord

# -- what the model streams ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Text:
    """A fragment of what the agent says."""

    text: str


@attrs.frozen(kw_only=True)
class CallStart:
    """The model began a call; ``call_id`` must be unique within the session."""

    call_id: str
    name: str


@attrs.frozen(kw_only=True)
class CallDelta:
    """The next fragment of a call's arguments, as JSON text."""

    call_id: str
    delta: str


@attrs.frozen(kw_only=True)
class CallEnd:
    """The call's arguments are complete.

    ``arguments`` is either None (the arguments are the concatenated deltas), a JSON text,
    or an already parsed object (a model that does not stream arguments).
    """

    call_id: str
    arguments: Any = None


@attrs.frozen(kw_only=True)
class Usage:
    """The provider's token counts for this step (so far: a later report replaces an
    earlier one). Optional: a model need not say it. The engine puts it on the step's
    trace span (``gen_ai.usage.*``) and nowhere else."""

    input_tokens: int | None = None
    output_tokens: int | None = None


def tokens(usage: Any, given: str, made: str) -> Usage | None:
    """A provider's ``usage`` object as :class:`Usage` (its counts under the keys ``given``
    and ``made``), or None when it has neither as a whole number."""
    if not isinstance(usage, dict):
        return None
    counts = [usage.get(key) for key in (given, made)]
    counts = [
        n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None for n in counts
    ]
    if counts == [None, None]:
        return None
    return Usage(input_tokens=counts[0], output_tokens=counts[1])


ModelEvent = Text | CallStart | CallDelta | CallEnd | Usage


# -- what the model is asked ---------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ToolSpec:
    """A tool exactly as the model is offered it: name, description, JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@attrs.frozen(kw_only=True)
class UserInput:
    """What the user said, which started a turn."""

    turn_id: str
    text: str


@attrs.frozen(kw_only=True)
class AgentText:
    """What the agent said during one model step (the step's text, joined)."""

    turn_id: str
    text: str


@attrs.frozen(kw_only=True)
class TurnInterrupted:
    """The user interrupted this turn: they may not have heard or seen all of it.

    Everything the history holds for the turn before this mark was produced, not
    necessarily delivered; calls cut short carry INTERRUPTED results.
    """

    turn_id: str
    note: str = (
        "The user interrupted this turn; they may not have heard or seen all of the "
        "response, and calls that had not finished were cancelled."
    )


HistoryItem = UserInput | AgentText | CallRecord | TurnInterrupted


@attrs.frozen(kw_only=True)
class ModelRequest:
    """One model step's request: instructions, the tools offered, and the history so far.

    ``session_id`` and ``turn_id`` identify the conversation, e.g. for a model that keeps
    state per session; ``step`` counts the turn's steps from 1.
    """

    instructions: str
    tools: tuple[ToolSpec, ...]
    history: Sequence[HistoryItem]
    """Oldest first; an immutable snapshot (the session's history only grows)."""
    session_id: str
    turn_id: str
    step: int


class Model(Protocol):
    """Anything that can run one model step."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream one step's events; cancelled with the turn when the user interrupts."""
        ...
