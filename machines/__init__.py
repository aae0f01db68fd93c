"""The state machines of trio-vrt: pure, synchronous python-statemachine classes.

Each module owns the rules of one thing; nothing outside it decides that thing's state.
The engine never runs these classes directly on its hot path: :mod:`vrt._core.tables` compiles
each one, once, into a ``(state, event) -> target`` table. Diagrams, the model checker and
the strict mode (``VRT_STRICT_MACHINES=1``) read the classes themselves.
"""

from machines.app_call import AppCall
from machines.audio_span import AudioSpan
from machines.base import VrtChart
from machines.call_view import CallView
from machines.connection import Connection
from machines.movement import Movement
from machines.session import Session
from machines.settling import Settling
from machines.tool_call import ToolCall
from machines.turn import Turn
from machines.upstream import Upstream

#: Every machine of the project, in the order of DESIGN.md's table.
ALL: tuple[type[VrtChart], ...] = (
    ToolCall,
    Turn,
    Session,
    Connection,
    AppCall,
    CallView,
    Movement,
    Upstream,
    AudioSpan,
    Settling,
)

__all__ = [
    "ALL",
    "AppCall",
    "AudioSpan",
    "CallView",
    "Connection",
    "Movement",
    "Session",
    "Settling",
    "ToolCall",
    "Turn",
    "Upstream",
    "VrtChart",
]
