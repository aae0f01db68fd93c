"""Relaying a resume to the process that runs the session (``handover-v1``).

Behind a load balancer without affinity, a client's resume may reach a process other than
the one running its session. That process (the *front*) opens a WebSocket to the owner's
relay address (from the store), sends it the client's upgrade (path and headers, so its
``authenticate`` sees what the client sent, plus ``x-vrt-relay``) and the resume
``hello``, then carries frames both ways, untouched, until either side closes; the owner
sees an ordinary resume, and the turn in flight goes on. A close code crosses too: the
owner's 1012 (it handed the session over at its next turn boundary) reaches the client,
which resumes, and lands wherever the load balancer sends it.

One exception: an owner that hands the session over before its first frame (the session
was idle: nothing to relay) closes with 1012 before its ``welcome``; the front then adopts
the session itself, on the client's connection, which never notices (:class:`Parked`).

The owner honours ``x-vrt-relay`` only with its proof (:mod:`.trust`), and takes relays on
a port of its own, which serves nothing else; with TLS (the owner has a certificate) the
relay is ``wss://``, and the certificate must be the one the owner's lease names.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, wrap_client_stream

from vrt._cluster.trust import Endpoint
from vrt._net.tls import pin_of, pinning_context
from vrt._net.upgrade import RELAY_HEADER, HandshakeRequest

log = logging.getLogger("vrt.server")
HANDOVER_CLOSE = 1012
"""WebSocket close code "service restart": resume now, elsewhere (``handover-v1``)."""
CONNECT_TIMEOUT = 3.0
"""Seconds to reach the owner and read its first frame."""
_HOP_BY_HOP = frozenset(
    {
        "host",
        "upgrade",
        "connection",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "content-length",
        "transfer-encoding",
        RELAY_HEADER,
    }
)


class Unreachable(Exception):
    """The owner did not take the relayed connection (it is gone, or its lease outlived
    it): the front waits for the lease to end, then adopts."""


@attrs.frozen
class Parked:
    """The owner handed the session over before its first frame: adopt it here."""


@attrs.frozen
class Relayed:
    """The relay ran to its end (either side closed)."""


async def relay(
    client: Any,
    owner_at: Endpoint,
    request: HandshakeRequest | None,
    hello: str,
    proof: str,
    *,
    max_message_size: int,
) -> Parked | Relayed:
    """Carry the client's connection ``client`` to the owner at ``owner_at`` with the
    resume ``hello`` (its JSON text), the upgrade proved by ``proof`` (the
    ``x-vrt-relay`` value, :meth:`Trust.prove <vrt._cluster.trust.Trust.prove>`, made for
    the path of ``request``). :class:`Unreachable` if the owner cannot be reached, or its
    certificate is not the one its lease names; :class:`Parked` if it handed the session
    over instead of welcoming it.

    Cancelled, the relay ends: both connections are left for their owners to close.
    """
    address = f"{owner_at.host}:{owner_at.port}"
    headers = [(RELAY_HEADER.encode(), proof.encode("ascii"))]
    path = "/"
    if request is not None:
        path = request.path or "/"
        headers += [
            (key.encode("latin-1"), value.encode("latin-1"))
            for key, value in request.headers
            if key not in _HOP_BY_HOP
        ]
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            tcp = await trio.open_tcp_stream(owner_at.host, owner_at.port)
    except (OSError, trio.TooSlowError) as exc:
        raise Unreachable(f"the owner at {address} cannot be reached: {exc!r}") from None
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] = tcp
    if owner_at.pin is not None:
        stream = trio.SSLStream(tcp, pinning_context(), server_hostname=None)
    # The stream is ours to close: trio-websocket's client leaves it open when the other
    # side ends the connection first. Unreachable is raised once out of the nursery (in
    # it, Trio would wrap it in an ExceptionGroup, which the caller would not catch).
    failed: str | None = None
    async with stream, trio.open_nursery() as nursery:
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                if isinstance(stream, trio.SSLStream):
                    await stream.do_handshake()
                    if pin_of(stream) != owner_at.pin:
                        failed = "presents another certificate than its lease names"
                if failed is None:
                    owner = await wrap_client_stream(
                        nursery,
                        stream,
                        owner_at.host,
                        path,
                        extra_headers=headers,
                        max_message_size=max_message_size,
                    )
                    await owner.send_message(hello)
                    first = await owner.get_message()
        except ConnectionClosed as exc:
            nursery.cancel_scope.cancel()
            code = exc.reason.code if exc.reason is not None else None
            if code == HANDOVER_CLOSE:
                return Parked()
            failed = f"closed the relay ({code})"
        except (
            OSError,
            trio.TooSlowError,
            trio.BrokenResourceError,
            HandshakeError,
            ConnectionRejected,
        ) as exc:
            failed = f"did not take the relay: {exc!r}"
        if failed is not None:
            nursery.cancel_scope.cancel()
        else:
            try:
                await client.send_message(first)
            except ConnectionClosed:
                await _close(owner, 1000)
            else:
                await _pipe(client, owner)
            nursery.cancel_scope.cancel()
    if failed is not None:
        raise Unreachable(f"the owner at {address} {failed}")
    return Relayed()


async def _pipe(client: Any, owner: Any) -> None:
    """Frames both ways until either side closes; its close code goes to the other."""
    async with trio.open_nursery() as nursery:

        async def carry(source: Any, sink: Any) -> None:
            while True:
                try:
                    frame = await source.get_message()
                except ConnectionClosed as exc:
                    code = exc.reason.code if exc.reason is not None else 1000
                    await _close(sink, code)
                    nursery.cancel_scope.cancel()
                    return
                try:
                    await sink.send_message(frame)
                except ConnectionClosed:
                    await _close(source, 1000)
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(carry, client, owner)
        nursery.start_soon(carry, owner, client)


async def _close(ws: Any, code: int) -> None:
    """Close ``ws`` with ``code`` (codes a peer may not send, such as 1006, become 1000)."""
    if code in (1005, 1006, 1015) or not 1000 <= code <= 4999:
        code = 1000
    with trio.move_on_after(1.0) as scope, contextlib.suppress(ConnectionClosed):
        scope.shield = True
        await ws.aclose(code=code)
