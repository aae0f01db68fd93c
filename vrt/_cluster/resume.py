"""A resume that reaches a node whose session it is not (``handover-v1``).

Any node takes any resume, behind a load balancer without affinity. When the session is not
here, :func:`resume_elsewhere` asks the store where it is (:meth:`Node.locate
<vrt._cluster.node.Node.locate>`) and follows the answer: relay the connection to the live
node that runs it (:func:`~vrt._cluster.relay.relay`), adopt it here (handed over, or its
node dead), or refuse it. The server gives the two things only it can do as callbacks:
take a session it runs now, and host an adopted one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from vrt._cluster.node import Adopt, Here, Node, RelayTo
from vrt._cluster.relay import Parked, Unreachable, relay
from vrt._cluster.trust import Endpoint
from vrt._net.upgrade import HandshakeRequest
from vrt._wire import codec
from vrt._wire import messages as m

log = logging.getLogger("vrt.server")

A = TypeVar("A")


class Relayed:
    """What :func:`resume_elsewhere` returns once it relayed the connection to its end."""


RELAYED = Relayed()
ADOPTION_WAIT = 5.0
"""Seconds a second resume of a session waits for another connection's adoption of it."""
ATTEMPTS = 3
"""Times a resume looks again when the owner it relays to is gone or parking its session."""


async def resume_elsewhere(
    node: Node,
    ws: Any,
    hello: m.Hello,
    principal: Any,
    request: HandshakeRequest | None,
    *,
    client: str,
    here: Callable[[], A | None],
    adopt: Callable[[Adopt], Awaitable[A | None]],
    max_message_size: int,
) -> A | Relayed | None:
    """Carry the resume ``hello`` on ``ws`` to its session, which this node does not run:
    the session adopted here (``adopt``'s, resumed), :data:`RELAYED` once a relay to its
    owner ended, or None (refused: unknown, expired, another token or principal, or its
    client's lastSeq does not fit). ``here`` takes the session if it runs here by now
    (another connection adopted it meanwhile); ``client`` is the client's address, which
    a relay's proof vouches for. :class:`~vrt._cluster.store.StoreError` if the store
    fails."""
    assert hello.resume is not None
    session_id = hello.resume.session_id
    for _ in range(ATTEMPTS):  # a relay that finds the owner gone or parking: look again
        adopting = node.adopting.get(session_id)
        found = None if adopting is not None else await node.locate(hello, principal)
        if adopting is not None or isinstance(found, Here):
            # Another connection of it is adopting it here (an attempt the client gave
            # up on, still at work): once it is done, this newer one takes over.
            adopting = node.adopting.get(session_id)
            if adopting is not None:
                with trio.move_on_after(ADOPTION_WAIT):
                    await adopting.wait()
            return here()
        if found is None:
            log.info("refused a resume (unknown to the store, or token or principal)")
            return None
        if isinstance(found, Adopt):
            done = node.adopting[session_id] = trio.Event()
            try:
                with trio.CancelScope(shield=True):  # claimed: it must be hosted now
                    return await adopt(found)
            finally:
                del node.adopting[session_id]
                done.set()
        assert isinstance(found, RelayTo)
        node.relayed.add(ws)
        try:
            owner_at = _endpoint(found)
            proof = node.trust.prove(
                owner_at,
                owner_name=found.owner,
                front=node.name,
                session_id=session_id,
                client=client,
                path=(request.path if request is not None else "") or "/",
                now=time.time(),
            )
            if proof is None:
                log.warning(
                    "session %s: cannot prove a relay to node %s: it publishes no relay key "
                    "and this node has no cluster secret (give every node the same "
                    "--cluster-secret, or none)",
                    session_id,
                    found.owner,
                )
                raise Unreachable("no key to prove the relay with")
            outcome = await relay(
                ws,
                owner_at,
                request,
                codec.encode(hello),
                proof,
                max_message_size=max_message_size,
            )
        except Unreachable as exc:
            log.info("session %s: %s", session_id, exc)
            await node.wait_for_lease(found.owner)
            continue
        finally:
            node.relayed.discard(ws)
        if isinstance(outcome, Parked):
            continue
        return RELAYED
    return None


def _endpoint(found: RelayTo) -> Endpoint:
    """Where ``found``'s owner takes relays; :class:`Unreachable` if its lease says it in
    a way this version does not read."""
    try:
        return Endpoint.parse(found.address)
    except ValueError as exc:
        log.warning("node %s: its lease is no relay address this node reads (%s)", found.owner, exc)
        raise Unreachable(str(exc)) from None
