"""The one strict base every vrt machine derives from.

python-statemachine's defaults suit forgiving UIs, not a protocol engine: an event with no
transition is silently ignored, and an exception in a callback becomes an ``error.execution``
event. Here both must surface, so an illegal event raises ``TransitionNotAllowed`` and an
exception propagates to the caller. Machines carry no callbacks, guards or I/O: they are the
transition relation and nothing else, which is what lets :mod:`vrt._core.tables` compile them.
"""

from typing import Any

from statemachine import StateChart


class VrtChart(StateChart[Any]):
    """Strict base: unknown or disallowed events raise, errors are never swallowed."""

    allow_event_without_transition = False
    catch_errors_as_events = False
