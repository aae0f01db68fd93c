"""The server's safety options and their defaults (see ``vrt.serve`` and the README's
"Running the server safely")."""

from __future__ import annotations

from typing import Any

import attrs

from vrt._wire import messages as m
from vrt._wire.endpoint import REPLAY_LIMIT
from vrt._wire.server import MAX_MESSAGE_SIZE

HIGH_WATER = 4000
"""Unacked messages at which the model is held (under the replay buffer's 10,000)."""
RESUME_WINDOW = 30.0
MAX_SESSIONS = 1000
MAX_OPEN_CALLS = 64
MAX_QUEUED_APP_CALLS = 32
MAX_MESSAGES_PER_SECOND = 100.0
HANDSHAKE_TIMEOUT = 10.0


@attrs.frozen(kw_only=True)
class Options:
    """What one server was started with: one record shared by its hub, actors and links."""

    capabilities: tuple[str, ...] = m.CAPABILITIES
    max_message_size: int = MAX_MESSAGE_SIZE
    resume_window: float = RESUME_WINDOW
    max_sessions: int = MAX_SESSIONS
    max_open_calls: int = MAX_OPEN_CALLS
    max_queued_app_calls: int = MAX_QUEUED_APP_CALLS
    max_messages_per_second: float = MAX_MESSAGES_PER_SECOND
    replay_limit: int = REPLAY_LIMIT
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    authenticate: Any = None
    """``async (vrt.HandshakeRequest) -> principal`` (see ``vrt.serve``), or None."""
    allowed_origins: frozenset[str] | None = None

    @property
    def high_water(self) -> int:
        """Unacked messages at which the model is held: well under the replay bound."""
        return max(1, min(HIGH_WATER, self.replay_limit * 2 // 5))


def positive(name: str, value: float) -> Any:
    """``value`` if it is above 0; ValueError naming ``name`` if not."""
    if not value > 0:
        raise ValueError(f"{name} must be positive, not {value!r}")
    return value


def non_negative(name: str, value: float) -> float:
    """``value`` if it is 0 or more; ValueError naming ``name`` if not."""
    if not value >= 0:
        raise ValueError(f"{name} must not be negative, not {value!r}")
    return value
