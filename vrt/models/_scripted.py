"""A model that plays a script: for demos, tests and benchmarks."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import attrs
import trio

from vrt.models import CallDelta, CallEnd, CallStart, ModelEvent, ModelRequest, Text


@attrs.frozen(kw_only=True)
class Say:
    """Scripted text (build with :func:`say`)."""

    text: str


@attrs.frozen(kw_only=True)
class ScriptedCall:
    """A scripted call (build with :func:`call`)."""

    name: str
    arguments: Any
    chunks: int = 1
    stream: bool = True
    truncate: bool = False
    call_id: str | None = None


@attrs.frozen(kw_only=True)
class Pause:
    """A scripted pause (build with :func:`pause`)."""

    seconds: float


ScriptItem = Say | ScriptedCall | Pause


def say(text: str) -> Say:
    """The model says ``text``."""
    return Say(text=text)


def call(
    name: str,
    arguments: Any = None,
    *,
    chunks: int = 1,
    stream: bool = True,
    truncate: bool = False,
    call_id: str | None = None,
) -> ScriptedCall:
    """The model calls ``name``.

    ``arguments`` is a JSON-able object (``None`` means ``{}``), or a str taken as the raw
    JSON text (so a script can send malformed arguments). With ``stream=True`` the text
    arrives in ``chunks`` ``arguments-delta`` fragments; with ``stream=False`` the model goes
    straight from ``start`` to ``arguments-complete``. ``truncate=True`` stops the model
    after the first half of the fragments, before completing the arguments.
    """
    if chunks < 1:
        raise ValueError("chunks must be >= 1")
    return ScriptedCall(
        name=name,
        arguments={} if arguments is None else arguments,
        chunks=chunks,
        stream=stream,
        truncate=truncate,
        call_id=call_id,
    )


def pause(seconds: float) -> Pause:
    """The model pauses for ``seconds`` (a checkpoint even at 0)."""
    return Pause(seconds=seconds)


def _split(text: str, chunks: int) -> list[str]:
    chunks = max(1, min(chunks, len(text)))
    size, extra = divmod(len(text), chunks)
    parts, start = [], 0
    for i in range(chunks):
        end = start + size + (1 if i < extra else 0)
        parts.append(text[start:end])
        start = end
    return parts


def _parts(item: ScriptedCall) -> list[str]:
    """The ``arguments-delta`` fragments of a streamed call (half of them if truncated)."""
    text = item.arguments if isinstance(item.arguments, str) else json.dumps(item.arguments)
    parts = _split(text, item.chunks)
    return parts[: len(parts) // 2] if item.truncate else parts


def script_steps(steps: Sequence[Sequence[ScriptItem]]) -> list[list[ScriptItem]]:
    """``steps`` as lists, each item checked: TypeError for one that is not a
    :func:`say`, :func:`call` or :func:`pause`."""
    out = [list(step) for step in steps]
    for step in out:
        for item in step:
            if not isinstance(item, Say | ScriptedCall | Pause):
                raise TypeError(f"a script step holds say/call/pause items, not {item!r}")
    return out


class ScriptedModel:
    """Plays ``steps``: each model step consumes the next scripted step.

    A step is a list of :func:`say`, :func:`call` and :func:`pause`. Once the script is
    exhausted every step is empty (no text, no calls), which ends the turn. Each session
    plays the script from its start, with its own call ids (``call_1``, ``call_2``, ...).
    """

    def __init__(self, steps: Sequence[Sequence[ScriptItem]]) -> None:
        self.steps = script_steps(steps)
        self._cursors: dict[str, list[int]] = {}  # session id -> [next step, call count]
        # Each streamed call's fragments, cut the first time it plays (every session plays
        # the same script): by the item's id, with the item to tell a reused id.
        self._parts: dict[int, tuple[ScriptedCall, list[str]]] = {}

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        """Stream the next scripted step for the request's session."""
        cursor = self._cursors.setdefault(request.session_id, [0, 0])
        index = cursor[0]
        cursor[0] += 1
        if index >= len(self.steps):
            return
        for item in self.steps[index]:
            if isinstance(item, Say):
                yield Text(text=item.text)
            elif isinstance(item, Pause):
                await trio.sleep(item.seconds)
            else:
                cursor[1] += 1
                call_id = item.call_id or f"call_{cursor[1]}"
                yield CallStart(call_id=call_id, name=item.name)
                if not item.stream:
                    yield CallEnd(call_id=call_id, arguments=item.arguments)
                    continue
                cut = self._parts.get(id(item))
                if cut is None or cut[0] is not item:
                    cut = self._parts[id(item)] = (item, _parts(item))
                for part in cut[1]:
                    yield CallDelta(call_id=call_id, delta=part)
                if item.truncate:
                    return
                yield CallEnd(call_id=call_id)

    def forget(self, session_id: str) -> None:
        """Drop the cursor kept for a session that has ended."""
        self._cursors.pop(session_id, None)

    def session_state(self, session_id: str) -> list[int] | None:
        """Where the session is in the script (saved with the session, so a session that
        moves to another server process goes on where it was)."""
        cursor = self._cursors.get(session_id)
        return None if cursor is None else list(cursor)

    def restore_session(self, session_id: str, state: object) -> None:
        """Go on from :meth:`session_state` of another process."""
        if (
            isinstance(state, list)
            and len(state) == 2
            and all(type(n) is int and n >= 0 for n in state)
        ):
            self._cursors[session_id] = list(state)
