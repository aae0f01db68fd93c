"""The model side of vrt: what a model is asked, and the events it streams back.

A model is anything with ``stream(request) -> AsyncIterator[ModelEvent]``. One call of
``stream`` is one model step. Within a step the model may say text and make calls; a call
is ``CallStart``, any number of ``CallDelta`` fragments of its JSON arguments, then
``CallEnd``. ``CallEnd(arguments=...)`` may carry the whole arguments at once (a model that
does not stream them); otherwise the arguments are the concatenated deltas. A step whose
stream ends with a call not ended means the model stopped before completing its arguments:
that call fails.
"""

from vrt._core.results import CallRecord
from vrt.models._protocol import (
    AgentText,
    CallDelta,
    CallEnd,
    CallStart,
    HistoryItem,
    Model,
    ModelEvent,
    ModelRequest,
    Text,
    ToolSpec,
    TurnInterrupted,
    UserInput,
)

__all__ = [
    "AgentText",
    "CallDelta",
    "CallEnd",
    "CallRecord",
    "CallStart",
    "HistoryItem",
    "Model",
    "ModelEvent",
    "ModelRequest",
    "Text",
    "ToolSpec",
    "TurnInterrupted",
    "UserInput",
]
