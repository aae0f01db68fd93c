"""The server's safety options and their defaults (see ``vrt.serve`` and "Serve safely" in
the documentation)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import attrs

from vrt._net import metrics as metrics_page
from vrt._wire import messages as m
from vrt._wire.endpoint import REPLAY_LIMIT, REPLAY_LIMIT_BYTES
from vrt._wire.server import MAX_MESSAGE_SIZE

HIGH_WATER = 4000
"""Unacked messages at which the model is held (under the replay buffer's 10,000)."""
RESUME_WINDOW = 30.0
MAX_SESSIONS = 1000
MAX_OPEN_CALLS = 64
MAX_QUEUED_APP_CALLS = 32
MAX_MESSAGES_PER_SECOND = 100.0
HANDSHAKE_TIMEOUT = 10.0
MAX_PENDING_CONNECTIONS = 256
MAX_PENDING_PER_PEER = 64
MAX_SESSIONS_PER_PEER = 20
FIRST_TURN_TIMEOUT = 300.0
MAX_HISTORY_BYTES = 1024 * 1024
DRAIN_TIMEOUT = 30.0
MIN_MESSAGE_SIZE = 1024
"""The smallest ``max_message_size``: every frame the server makes itself must fit."""


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
    replay_limit_bytes: int = REPLAY_LIMIT_BYTES
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    max_pending_connections: int = MAX_PENDING_CONNECTIONS
    max_pending_per_peer: int = MAX_PENDING_PER_PEER
    max_sessions_per_peer: int = MAX_SESSIONS_PER_PEER
    first_turn_timeout: float = FIRST_TURN_TIMEOUT
    max_history_bytes: int = MAX_HISTORY_BYTES
    authenticate: Any = None
    """``async (vrt.HandshakeRequest) -> principal`` (see ``vrt.serve``), or None."""
    allowed_origins: frozenset[str] | None = None
    web_demo: bool = False
    """Serve the demo page at ``/`` too (``vrt demo --web``, ``vrt serve --web``)."""
    metrics: bool = False
    """Serve ``GET /metrics`` (Prometheus' text format: :mod:`vrt._net.metrics`)."""
    capture_content: bool | None = None
    """Content in trace spans (None: as ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``)."""

    @property
    def high_water(self) -> int:
        """Unacked messages at which the model is held: well under the replay bound."""
        return max(1, min(HIGH_WATER, self.replay_limit * 2 // 5))

    @property
    def high_water_bytes(self) -> int:
        """Unacked (or unwritten) bytes at which the model is held: 40 % of the bound."""
        return max(1, self.replay_limit_bytes * 2 // 5)


def count(name: str, value: object) -> int:
    """``value`` if it is a whole number of at least 1; ValueError naming ``name`` if not."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
    return value


def positive_number(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` if it is a positive number (or 0, with ``zero``); ValueError if not."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not (value >= 0 if zero else value > 0):  # type: ignore[operator]
        rule = "must not be negative" if zero else "must be positive"
        raise ValueError(f"{name} {rule}, not {value!r}")
    return float(value)  # type: ignore[arg-type]


def make_options(
    *,
    capabilities: Collection[str] = m.CAPABILITIES,
    max_message_size: int = MAX_MESSAGE_SIZE,
    resume_window: float = RESUME_WINDOW,
    max_sessions: int = MAX_SESSIONS,
    max_open_calls: int = MAX_OPEN_CALLS,
    max_queued_app_calls: int = MAX_QUEUED_APP_CALLS,
    max_messages_per_second: float = MAX_MESSAGES_PER_SECOND,
    replay_limit: int = REPLAY_LIMIT,
    replay_limit_bytes: int = REPLAY_LIMIT_BYTES,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    max_pending_connections: int = MAX_PENDING_CONNECTIONS,
    max_pending_per_peer: int = MAX_PENDING_PER_PEER,
    max_sessions_per_peer: int = MAX_SESSIONS_PER_PEER,
    first_turn_timeout: float = FIRST_TURN_TIMEOUT,
    max_history_bytes: int = MAX_HISTORY_BYTES,
    authenticate: Any = None,
    allowed_origins: Collection[str] | None = None,
    web_demo: bool = False,
    metrics: bool = False,
    capture_content: bool | None = None,
) -> Options:
    """The :class:`Options` of a server, each option checked: ValueError naming the first
    bad one. ``vrt.serve`` and ``vrt.asgi.app`` both build theirs here, so they take the
    same values and refuse the same ones."""
    if not (isinstance(max_message_size, int) and max_message_size >= MIN_MESSAGE_SIZE):
        raise ValueError(
            f"max_message_size must be an integer of at least {MIN_MESSAGE_SIZE}, "
            f"not {max_message_size!r}"
        )
    options = Options(
        capabilities=tuple(capabilities),
        max_message_size=max_message_size,
        resume_window=positive_number("resume_window", resume_window, zero=True),
        max_sessions=count("max_sessions", max_sessions),
        max_open_calls=count("max_open_calls", max_open_calls),
        max_queued_app_calls=count("max_queued_app_calls", max_queued_app_calls),
        max_messages_per_second=positive_number("max_messages_per_second", max_messages_per_second),
        replay_limit=count("replay_limit", replay_limit),
        replay_limit_bytes=count("replay_limit_bytes", replay_limit_bytes),
        handshake_timeout=positive_number("handshake_timeout", handshake_timeout),
        max_pending_connections=count("max_pending_connections", max_pending_connections),
        max_pending_per_peer=count("max_pending_per_peer", max_pending_per_peer),
        max_sessions_per_peer=count("max_sessions_per_peer", max_sessions_per_peer),
        first_turn_timeout=positive_number("first_turn_timeout", first_turn_timeout),
        max_history_bytes=count("max_history_bytes", max_history_bytes),
        authenticate=authenticate,
        allowed_origins=None if allowed_origins is None else frozenset(allowed_origins),
        web_demo=web_demo,
        metrics=bool(metrics),
        capture_content=capture_content,
    )
    if options.metrics and not metrics_page.available():
        raise ValueError(f"metrics=True serves GET /metrics: {metrics_page.INSTALL_HINT}")
    if options.replay_limit_bytes < 2 * max_message_size:
        raise ValueError(
            f"replay_limit_bytes ({replay_limit_bytes}) must be at least twice "
            f"max_message_size ({max_message_size}): one frame must fit with room to spare"
        )
    return options
