"""``assert_stream_valid``: the app-facing lifecycle check, through the CallView machine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vrt._core.events import Closed, Phase, ToolStream, TurnEnded
from vrt._core.tables import CALL_VIEW, Machine, StrictMachine
from vrt._errors import InvalidTransition

_EVENT_OF_PHASE = {
    Phase.ARGUMENTS_DELTA: "delta",
    Phase.ARGUMENTS_COMPLETE: "complete",
    Phase.PROGRESS: "progress",
    Phase.SETTLED: "settle",
    Phase.CANCELLED: "cancel",
    Phase.FAILED: "fail",
}

_RULES = {
    ("started", "progress"): "progress before arguments-complete",
    ("streaming", "progress"): "progress before arguments-complete",
    ("started", "settle"): "settled before arguments-complete",
    ("streaming", "settle"): "settled before arguments-complete",
    ("issued", "delta"): "arguments-delta after arguments-complete",
    ("issued", "complete"): "a second arguments-complete",
    ("issued", "fail"): "failed after arguments-complete (the arguments were complete)",
}


def assert_stream_valid(events: Iterable[Any], *, complete: bool = True) -> None:
    """Raise AssertionError, naming the call and the rule, if ``events`` break a lifecycle.

    Checked for every call (``ToolStream`` events; others are used only as markers):
    the first phase is ``start`` and there is only one; ``arguments-delta`` only before
    ``arguments-complete``; ``progress`` and ``settled`` only after it; exactly one terminal
    (``settled``, ``cancelled``, ``failed``) and nothing after it; per-phase fields present
    (``delta``, ``ok``, ``code`` when not ok); ``turn_id``, ``name``, ``kind`` and ``epoch``
    constant. With ``complete=True`` (the default: a whole log), every call must also have
    its terminal by its turn's ``TurnEnded`` and by the end of the log, unless a
    :class:`~vrt.Closed` event ended the session first; nothing may follow ``Closed``.
    """
    views: dict[str, tuple[ToolStream, Machine | StrictMachine]] = {}
    closed = False
    for index, event in enumerate(events):
        if closed:
            raise AssertionError(f"event #{index} ({type(event).__name__}) after Closed")
        if isinstance(event, Closed):
            closed = True
        elif isinstance(event, TurnEnded) and complete:
            for call_id, (first, view) in views.items():
                if first.turn_id == event.turn_id and not view.final:
                    raise AssertionError(
                        f"call {call_id}: turn {event.turn_id} ended while the call was "
                        f"{view.state} (no terminal phase)"
                    )
        elif isinstance(event, ToolStream):
            _check_event(index, event, views)
    if complete and not closed:
        for call_id, (_, view) in views.items():
            if not view.final:
                raise AssertionError(
                    f"call {call_id}: no terminal phase (settled, cancelled or failed); "
                    f"the log ends with the call {view.state}"
                )


def _check_event(
    index: int, event: ToolStream, views: dict[str, tuple[ToolStream, Machine | StrictMachine]]
) -> None:
    where = f"call {event.call_id} (event #{index}, phase {event.phase})"
    phase = Phase(event.phase)
    if phase is Phase.START:
        if event.call_id in views:
            raise AssertionError(f"{where}: a second start")
        views[event.call_id] = (event, CALL_VIEW.new())
        return
    if event.call_id not in views:
        raise AssertionError(f"{where}: the first phase of a call must be start")
    first, view = views[event.call_id]
    for field in ("turn_id", "name", "kind", "epoch"):
        if getattr(event, field) != getattr(first, field):
            raise AssertionError(
                f"{where}: {field} changed from {getattr(first, field)!r} "
                f"to {getattr(event, field)!r}"
            )
    before = view.state
    try:
        view.send(_EVENT_OF_PHASE[phase])
    except InvalidTransition:
        if view.final:
            rule = f"{phase} after the terminal phase {before}"
        else:
            rule = _RULES.get((before, _EVENT_OF_PHASE[phase]), f"{phase} while {before}")
        raise AssertionError(f"{where}: {rule}") from None
    if phase is Phase.ARGUMENTS_DELTA and not isinstance(event.delta, str):
        raise AssertionError(f"{where}: arguments-delta carries no delta")
    if phase is Phase.SETTLED:
        if event.ok is None:
            raise AssertionError(f"{where}: settled carries no ok")
        if not event.ok and event.code is None:
            raise AssertionError(f"{where}: settled with ok=false carries no code")
