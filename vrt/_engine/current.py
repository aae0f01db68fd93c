"""The session the current task works for: set by each turn, inherited by its calls."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vrt._engine.session import Session

#: Set in each turn's task; the call tasks it spawns inherit it (e.g. for confirmation).
current_session: contextvars.ContextVar[Session] = contextvars.ContextVar("vrt_session")
