"""Who a connection is, as the server counts and logs it: the peer a session is counted for
(``max_sessions_per_peer``), and the addresses a log line may show (never a principal: it
may be a secret)."""

from __future__ import annotations

from typing import Any

import trio

from vrt._net.accept import GuardedStream


def address_of(stream: trio.SocketStream) -> str:
    """The peer's IP address (without the port: one machine is one peer)."""
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:
        return "unknown"


def remote_of(stream: trio.SocketStream, guarded: GuardedStream, client: str) -> str:
    """A connection as the log shows it: the client's address and port (a PROXY header's,
    or the peer's), and the client a trusted proxy names in ``X-Forwarded-For``."""
    if guarded.client is not None:
        shown = repr(guarded)
    else:
        try:
            host, port = stream.socket.getpeername()[:2]
        except OSError:
            return client
        shown = f"{host}:{port}"
        if host != client:
            shown = f"{client} (through {shown})"
    return shown


def peer_of(principal: Any, address: str) -> tuple[str, Any]:
    """Who ``max_sessions_per_peer`` counts a session for: the principal ``authenticate``
    gave, else the remote ``address`` (its IP address: one machine is one peer)."""
    if principal is None:
        return ("address", address)
    try:
        hash(principal)
    except TypeError:
        return ("principal", repr(principal))
    return ("principal", principal)


def shown(peer: Any) -> str:
    """A peer as the log shows it: its address, never a principal (it may be a secret)."""
    if isinstance(peer, tuple) and peer[0] == "address":
        return str(peer[1])
    return "a principal" if isinstance(peer, tuple) else str(peer)
