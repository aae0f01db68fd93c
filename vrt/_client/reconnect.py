"""Reconnecting: each attempt's handshake, and when to try again.

A client that loses its connection tries new ones with backoff until one resumes the
session, the server refuses the resume, or ``resume_timeout`` passes; opening a session
has its own deadline (``connect_timeout``). The loop is the client's
(:meth:`~vrt._client.client.Client._carry`); the policy and the handshake of one attempt
are here.
"""

from __future__ import annotations

import random
from typing import Any

from trio_websocket import ConnectionClosed

from vrt._core.events import Closed
from vrt._errors import RemoteProtocolError
from vrt._wire import messages as m
from vrt._wire.client import ClientProtocol, Welcomed

CLOSE_TIMEOUT = 5.0
"""How long leaving ``vrt.connect`` waits for ``closed``, and then for the connection to end."""
RESUME_TIMEOUT = 30.0
"""How long a client tries to resume a lost session (the server's default window)."""
CONNECT_TIMEOUT = 10.0
"""How long one connection attempt may take: TCP, TLS, the upgrade and the ``welcome``."""
STABLE_AFTER = 5.0
"""A resumed connection that lasts this long ends the resume episode (backoff and
``resume_timeout`` start afresh at the next loss)."""
RETRIED_STATUSES = frozenset({"HTTP_502", "HTTP_503", "HTTP_504"})
"""Upgrades refused with these are tried again (opening and resuming alike): a draining
server's 503, and a proxy's 502 or 504 while the node behind it restarts."""
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0
"""Reconnect delays: doubling from the first to the max, each with random jitter (50-100 %)."""
HANDOVER_CLOSE = 1012
"""The server handed the session over (``handover-v1``): resume at once, elsewhere."""


class Lost(Exception):
    """The connection closed during a handshake."""


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt + 1``: doubling, with jitter."""
    delay: float = min(BACKOFF_MAX, BACKOFF_FIRST * 2.0 ** max(0, attempt - 1))
    return delay * random.uniform(0.5, 1.0)


async def await_welcome(proto: ClientProtocol, ws: Any) -> RemoteProtocolError | None:
    """Send the queued hello on ``ws`` and read until ``welcome``; the refusal if the
    server refused it. Frames after the welcome are left to the reader. :class:`Lost` if
    the connection closed meanwhile."""
    for hello in proto.take_outbox():
        try:
            await ws.send_message(hello)
        except ConnectionClosed:
            raise Lost from None
    refusal: m.Error | None = None
    while True:
        try:
            frame: Any = await ws.get_message()
        except ConnectionClosed as exc:
            if exc.reason is not None and exc.reason.code == 1009:
                raise RemoteProtocolError(
                    "TOO_LARGE", "the server refused the hello as too large (close 1009)"
                ) from None
            raise Lost from None
        for item in proto.receive(frame):
            if isinstance(item, Welcomed):
                return None
            if isinstance(item, m.Error):
                refusal = item
            elif isinstance(item, Closed):
                return RemoteProtocolError(
                    refusal.code if refusal else "CLOSED",
                    refusal.message if refusal else f"closed: {item.reason}",
                )


def too_large(ws: Any) -> bool:
    """Whether ``ws`` was closed for a frame over a side's limit (1009, either side)."""
    return close_code(ws) == 1009


def close_code(ws: Any) -> int | None:
    """The code ``ws`` was closed with, once closed."""
    closed = getattr(ws, "closed", None)
    code = getattr(closed, "code", None) if closed is not None else None
    return code if isinstance(code, int) else None
