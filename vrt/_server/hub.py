"""The sessions of one server: connections in, sessions opened or resumed.

Each accepted connection is served by the task that accepted it: its handshake (a valid
``hello`` within ``handshake_timeout``), then the session it opens or resumes, carried until
the connection ends or a newer one takes the session over. Each session's actor lives in the
hub's nursery, so a session outlives its connections while it can be resumed.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import logging
import secrets
import ssl
import time
from collections.abc import Callable
from typing import Any

import trio
from trio_websocket import ConnectionClosed

from vrt._cluster.keeper import adopted_protocol
from vrt._cluster.node import Adopt, Node, NotYet
from vrt._cluster.relay import HANDOVER_CLOSE
from vrt._cluster.resume import Relayed, resume_elsewhere
from vrt._cluster.store import StoreError
from vrt._cluster.trust import Proven
from vrt._engine import telemetry
from vrt._engine.agent import Agent
from vrt._net.accept import Accepting, GuardedStream, Pending, peer_host
from vrt._net.options import Options
from vrt._net.proxied import ProxyHeaderError, address_key, forwarded_client
from vrt._net.pumps import AckTimer
from vrt._net.upgrade import RELAY_HEADER, HandshakeRequest, open_to_messages, upgrade
from vrt._server.actor import SessionActor
from vrt._server.link import send_and_close
from vrt._server.peers import address_of, peer_of, remote_of, shown
from vrt._wire import messages as m
from vrt._wire.audio import AudioInfo
from vrt._wire.server import ServerProtocol
from vrt.models._realtime import is_realtime

log = logging.getLogger("vrt.server")

DRAIN_RETRY = 1.0
"""Seconds between a drain's attempts to move the sessions still here."""
DRAIN_GRACE = 5.0
"""Seconds a drain waits, after its timeout, for the turns it interrupted to end."""


class Hub:
    """The sessions of one server, which outlive their connections while resumable.

    Each session's actor runs in the hub's nursery; each connection is served by the task
    that accepted it (:meth:`handle_stream`, :meth:`serve_connection`), attached to one
    session at a time.
    """

    def __init__(
        self,
        agent: Agent,
        options: Options,
        nursery: trio.Nursery,
        accepting: Accepting | None = None,
        node: Node | None = None,
    ) -> None:
        self.agent = agent
        model = agent.model
        self.audio = (
            AudioInfo(input_rate=model.input_rate, output_rate=model.output_rate)
            if is_realtime(model)
            else None
        )
        """The audio ``audio-v1`` offers: the agent's realtime model's rates (None: the model
        takes no audio, and ``audio-v1`` is not offered)."""
        self.node = node
        """This process among the nodes sharing a store (None: sessions live here only)."""
        self.draining = False
        """New sessions are refused (503) and every session moves at its next boundary."""
        self._emptied: trio.Event | None = None  # set when the last session leaves a drain
        self.options = options
        self.nursery = nursery
        self.accepting = accepting or Accepting(
            options.max_pending_connections,
            options.max_pending_per_peer,
            trusted=options.proxies,
        )
        self.sessions: dict[str, SessionActor] = {}
        self.by_peer: dict[Any, int] = {}
        """Live sessions per peer (principal, or remote address without a principal)."""
        self.acks = AckTimer()
        """Every session's ack timer: one task for the server."""
        nursery.start_soon(self.acks.run)

    @property
    def store_unreachable(self) -> bool:
        """Whether the store failed this node's last call: ``GET /healthz`` answers ``503
        store unreachable`` (the load balancer sends new clients to nodes that can save)."""
        return self.node is not None and not self.node.store_ok

    async def handle_stream(
        self,
        stream: trio.SocketStream,
        pending: Pending | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        relay_only: bool = False,
    ) -> None:
        """Serve one accepted TCP connection, counted in its pool as ``pending``: a
        trusted proxy's PROXY header, its TLS handshake (with ``ssl_context``), its upgrade
        and its ``hello`` within ``handshake_timeout`` of the accept, then its session.
        ``relay_only``: a connection to the port other nodes relay to, which serves their
        relays (with their proof) and nothing else.

        A peer that leaves before the upgrade is done is forgotten at once; one that is too
        slow is cut off (its socket reset) at the deadline, or sooner if the pool of
        handshakes needs its place (:class:`~vrt._net.accept.Accepting`).
        """
        if pending is None:
            pending = self.accepting.admit_stream(stream)
        guarded = GuardedStream(stream, ssl_context)
        deadline = trio.current_time() + self.options.handshake_timeout
        late = False
        client = peer_host(stream)
        """Who the connection is from: its peer, or the client a trusted proxy names."""

        def handshake_done() -> None:
            pending.done()

        try:
            async with trio.open_nursery() as nursery:  # trio-websocket's reader task
                upgraded = None
                with trio.move_on_at(deadline) as scope:
                    pending.guard(scope)
                    guarded.on_close = scope.cancel
                    proxied: str | None = client
                    if pending.proxy and not relay_only:
                        proxied = await self._proxy_header(guarded, pending, client)
                    if proxied is not None and await guarded.start_tls():  # else: gone
                        client = proxied
                        upgraded = await upgrade(
                            nursery, guarded, self.options, self, relay_only=relay_only
                        )
                    guarded.on_close = None
                late = scope.cancelled_caught and not guarded.gone
                if upgraded is not None:
                    relay = upgraded.relay
                    request = upgraded.request
                    if isinstance(relay, Proven):
                        client = relay.client  # as the relaying node saw it, and vouched
                    elif pending.proxy and pending.pool is not None:
                        client = forwarded_client(client, request.headers, self.options.proxies)
                        pending.pool.rekey(pending, address_key(client))
                    log.info(
                        "connection from %s%s",
                        remote_of(stream, guarded, client),
                        f" (relayed by node {relay.front})" if isinstance(relay, Proven) else "",
                    )
                    await self.serve_connection(
                        upgraded.ws,
                        upgraded.principal,
                        peer=peer_of(upgraded.principal, client),
                        client=client,
                        deadline=deadline,
                        stream=guarded,
                        handshake_done=handshake_done,
                        pending=pending,
                        request=request,
                        relay=relay if isinstance(relay, Proven) else None,
                        relay_only=relay_only,
                    )
                elif late:
                    log.debug(
                        "%s: no upgrade %s",
                        address_of(stream),
                        "before it was evicted" if pending.evicted else "within the timeout",
                    )
                nursery.cancel_scope.cancel()
        except Exception as exc:
            # trio-websocket's reader task can fail on what a peer sends (wsproto refusing
            # to send its own close in a state the peer brought about): that costs this
            # connection only, and is the peer's doing, so it is no error of ours.
            log.debug("%s: connection dropped: %r", address_of(stream), exc)
            late = True
        finally:
            handshake_done()
            if guarded.gone or guarded.aborted or late or pending.evicted:
                guarded.abort()  # nothing more to say: free the descriptor now
            else:
                with trio.CancelScope(shield=True):
                    await guarded.aclose()

    async def _proxy_header(
        self, guarded: GuardedStream, pending: Pending, peer: str
    ) -> str | None:
        """A trusted proxy's connection: the client its PROXY v2 header names (counted
        by that address from now on), or ``peer`` if it sent none; None if the header is
        malformed or the peer left within it (a DEBUG line: the connection is dropped)."""
        try:
            await guarded.proxy_header()
        except ProxyHeaderError as exc:
            log.debug("%s: no valid PROXY header (%s)", peer, exc)
            return None
        if guarded.client is None:
            return peer
        client = guarded.client[0]
        if pending.pool is not None:
            pending.pool.rekey(pending, address_key(client))
        return client

    def relay_of(self, handshake: HandshakeRequest) -> Proven | None:
        """What the upgrade ``handshake``'s ``x-vrt-relay`` proves: a relay from another
        node of this store, for one session (:mod:`vrt._cluster.trust`); None without the
        header, or without a valid proof (then it means nothing: a plain client's)."""
        value = handshake.header(RELAY_HEADER)
        if value is None or self.node is None:
            return None
        node = self.node
        proven = node.trust.verify(
            value, owner_name=node.name, path=handshake.path, now=time.time()
        )
        if proven is None:
            log.info("%s: x-vrt-relay without a valid proof: ignored", handshake.remote)
        return proven

    async def serve_connection(
        self,
        ws: Any,
        principal: Any = None,
        *,
        peer: Any = ("address", "local"),
        client: str | None = None,
        deadline: float | None = None,
        stream: GuardedStream | None = None,
        handshake_done: Callable[[], None] | None = None,
        pending: Pending | None = None,
        request: HandshakeRequest | None = None,
        relay: Proven | None = None,
        relay_only: bool = False,
    ) -> None:
        """Serve one upgraded connection: its ``hello`` (by ``deadline``: by default
        ``handshake_timeout`` from now), then the session it opens or resumes, until the
        connection ends (or a newer one takes the session over). ``relay``: another node
        relays it (proved), for the resume of one session, which its hello must be;
        ``relay_only``: it must be such a relay. ``client``: the client's address (the
        peer's, or the client a trusted proxy names), which a relay of it vouches for.

        ``ws`` is a trio-websocket connection or anything with its ``get_message``,
        ``send_message`` and ``aclose`` (the memory pair of :mod:`vrt.testing`); ``stream``
        its TCP stream, if it has one (torn down at once when the session overflows).
        """
        options = self.options
        if deadline is None:
            deadline = trio.current_time() + options.handshake_timeout
        proto = ServerProtocol(
            session_id=f"s_{secrets.token_hex(8)}",
            resume_token=secrets.token_urlsafe(32),  # 256 random bits
            server_tools=self.agent.registry.keys(),
            capabilities=options.capabilities,
            max_message_size=options.max_message_size,
            replay_limit=options.replay_limit,
            replay_limit_bytes=options.replay_limit_bytes,
            # A relay never opens a session (nodes relay resumes only): refused as a
            # session over the limits is.
            admit=(lambda: False)
            if relay is not None or relay_only
            else lambda: self._admits(peer),
            audio=self.audio,
        )
        proto.max_frame = options.max_message_size  # what vrt.connect takes by default
        try:
            hello = None
            with trio.move_on_at(deadline) as scope:
                if pending is not None:
                    pending.guard(scope)
                hello = await _handshake(ws, proto)
            if handshake_done is not None:
                handshake_done()
            if hello is None:
                if pending is not None and pending.evicted:
                    return  # the pool needed its place: reset, no goodbye to wait on
                await send_and_close(ws, proto.take_outbox())
                return
            open_to_messages(ws, options.max_message_size)  # at once: frames may follow
            if (relay is not None or relay_only) and (
                relay is None or hello.resume is None or hello.resume.session_id != relay.session_id
            ):
                log.info("refused a relayed hello: not the resume its proof is for")
                telemetry.refused("resume")
                proto.refuse(m.RESUME_FAILED, "the session cannot be resumed", hello.seq)
                await send_and_close(ws, proto.take_outbox())
                return
            if hello.resume is not None:
                await self._resume_on(
                    ws,
                    hello,
                    proto,
                    principal,
                    peer,
                    request,
                    stream,
                    relayed=relay is not None,
                    client=client or "unknown",
                )
                return
            else:
                actor = SessionActor(self, proto, hello, principal, peer)
                self._add(actor)
                log.info("session %s opened for %s", proto.session_id, shown(peer))
                await self.nursery.start(actor.run)
                if not proto.in_session:  # closed before it started, to make room
                    await send_and_close(ws, [])
                    return
            await actor.carry(ws, stream)
        except Exception:  # a bug must cost one connection, never the server
            log.exception("connection failed")
            with trio.move_on_after(1.0) as scope:
                scope.shield = True
                with contextlib.suppress(ConnectionClosed):
                    await ws.aclose()

    def _admits(self, peer: Any) -> bool:
        """Whether a new session of ``peer`` fits under ``max_sessions`` and
        ``max_sessions_per_peer``; at a limit, the oldest session there that never started
        a turn makes room (probe a08: a thousand hellos that never speak held every slot,
        and the slots of those that left, for the resume window)."""
        options = self.options
        if len(self.sessions) >= options.max_sessions and not self._make_room(None):
            telemetry.refused("sessions_cap")
            log.info("refused a session: at max_sessions (%d)", options.max_sessions)
            return False
        if self.by_peer.get(peer, 0) >= options.max_sessions_per_peer and not self._make_room(peer):
            telemetry.refused("sessions_cap")
            log.info(
                "refused a session of %s: at max_sessions_per_peer (%d)",
                shown(peer),
                options.max_sessions_per_peer,
            )
            return False
        return True

    def _make_room(self, peer: Any) -> bool:
        """Close the oldest session (of ``peer``, or of anyone) that never started a turn:
        like a handshake that never finishes, it had its chance. False if there is none."""
        for actor in self.sessions.values():
            if not actor.turned and (peer is None or actor.peer == peer):
                log.info(
                    "session %s closed (expired): it started no turn, and a new session "
                    "needed its place",
                    actor.log_id,
                )
                self.closed(actor)  # its place is free now; its task ends it
                actor.end("expired")
                return True
        return False

    def _add(self, actor: SessionActor) -> None:
        """``actor``'s session lives here now (opened or adopted): :meth:`closed` undoes it."""
        self.sessions[actor.proto.session_id] = actor
        telemetry.SESSIONS_OPEN.add(1)
        self.by_peer[actor.peer] = self.by_peer.get(actor.peer, 0) + 1

    def closed(self, actor: SessionActor) -> None:
        """``actor``'s session is over (or moved): its place is free."""
        if self.sessions.get(actor.proto.session_id) is not actor:
            return  # never registered (a failed adoption)
        del self.sessions[actor.proto.session_id]
        telemetry.SESSIONS_OPEN.add(-1)
        if not self.sessions and self._emptied is not None:
            self._emptied.set()
        left = self.by_peer[actor.peer] - 1
        if left:
            self.by_peer[actor.peer] = left
        else:
            del self.by_peer[actor.peer]

    async def _resume_on(
        self,
        ws: Any,
        hello: m.Hello,
        proto: ServerProtocol,
        principal: Any,
        peer: Any,
        request: HandshakeRequest | None,
        stream: GuardedStream | None,
        *,
        relayed: bool = False,
        client: str = "unknown",
    ) -> None:
        """Carry the session ``hello`` resumes on ``ws``: here, relayed to the node that
        runs it, or adopted here from the store (``handover-v1``); or refuse it.
        ``relayed``: another node relays the connection (proved); ``client``: the client's
        address (a relay onwards vouches for it)."""
        assert hello.resume is not None
        actor = self._matching(hello, principal)
        if actor is not None:
            keeper = actor.keeper
            if relayed and keeper is not None and await keeper.hand_over():
                # Between turns: nothing to carry through another node, the front adopts it.
                await send_and_close(ws, [], HANDOVER_CLOSE)
                return
            actor.resume(hello)
            if relayed and keeper is not None:
                keeper.move()  # to where the client is, after this turn
            await actor.carry(ws, stream)
            return
        if self._left(hello, principal):
            # Handed over (or taken over, or let go unsaved) a moment ago, its task not yet
            # done here: the client resumes again, and finds it where it went.
            await send_and_close(ws, [], HANDOVER_CLOSE)
            return
        if self.node is None or hello.resume.session_id in self.sessions:
            log.info("refused a resume (session, token, principal or lastSeq do not match)")
            telemetry.refused("resume")
            proto.refuse(m.RESUME_FAILED, "the session cannot be resumed", hello.seq)
            await send_and_close(ws, proto.take_outbox())
            return
        found: SessionActor | Relayed | None = None
        try:
            with trio.CancelScope() as gone:
                if stream is not None:  # the client left: stop looking for its session
                    stream.on_close = gone.cancel
                found = await resume_elsewhere(
                    self.node,
                    ws,
                    hello,
                    principal,
                    request,
                    client=client,
                    here=functools.partial(self._resumed_here, hello, principal),
                    adopt=functools.partial(
                        self._adopt, hello=hello, principal=principal, peer=peer
                    ),
                    max_message_size=self.options.max_message_size,
                )
            if stream is not None:
                stream.on_close = None
            if gone.cancelled_caught:
                log.info("session %s: the client left while its resume was looked for",
                         hello.resume.session_id)  # fmt: skip
                return
        except StoreError as exc:
            # Not the client's fault, nor the end of its session: it tries again. (The
            # node logs the store's outage once.)
            if not isinstance(exc, NotYet):
                self.node.store_failed(exc)
            log.info("session %s: cannot resume now: %s", hello.resume.session_id, exc)
            await send_and_close(ws, [], 1011)
            return
        if found is None:
            telemetry.refused("resume")
            proto.refuse(m.RESUME_FAILED, "the session cannot be resumed", hello.seq)
            await send_and_close(ws, proto.take_outbox())
            return
        if isinstance(found, SessionActor):
            await found.carry(ws, stream)

    def _resumed_here(self, hello: m.Hello, principal: Any) -> SessionActor | None:
        """The session ``hello`` resumes, if it runs here by now: resumed."""
        actor = self._matching(hello, principal)
        if actor is not None:
            actor.resume(hello)
        return actor

    async def _adopt(
        self, found: Adopt, *, hello: m.Hello, principal: Any, peer: Any
    ) -> SessionActor | None:
        """Host the session ``found`` in the store, resumed by ``hello``; None if its
        client's lastSeq does not fit what was saved."""
        proto = adopted_protocol(
            found, hello, self.agent.registry.keys(), self.options, audio=self.audio
        )
        if proto is None:
            return None
        origin = m.Hello(
            seq=0, protocol=m.PROTOCOL, capabilities=proto.capabilities, tools=proto.app_tools
        )
        actor = SessionActor(self, proto, origin, principal, peer, adopted=found)
        self._add(actor)
        log.info(
            "session %s adopted (%s)",
            proto.session_id,
            "its node was lost" if found.crashed else "handed over",
        )
        await self.nursery.start(actor.run)
        actor.resume(hello)
        actor.take_over(hello)
        return actor

    async def drain(self, drain_timeout: float) -> None:
        """Hand every session over to another node (``handover-v1``): new sessions are
        refused from now; each session moves at its next turn boundary, and a turn still
        open after ``drain_timeout`` seconds is interrupted so that it reaches one. A
        handover the store failed is tried again while the store answers. Returns when
        every session has moved, or a few seconds after the timeout: those still here
        then (the store does not answer, or a turn would not end) are let go unsaved
        (Movement ``abandon``, 1012): their clients resume elsewhere, where they are
        adopted from their last save once this node's lease is over."""
        self.draining = True
        if self.node is not None:
            self.node.draining = True
        self._emptied = trio.Event()
        self._move_all(again=False)  # now if between turns, else at the end of its turn
        with trio.move_on_after(drain_timeout):
            while self.sessions:
                with trio.move_on_after(DRAIN_RETRY):
                    await self._emptied.wait()
                self._move_all()
        if self.sessions:
            log.info("drain: %d sessions not handed over yet: interrupted", len(self.sessions))
            with trio.move_on_after(DRAIN_GRACE):
                while self.sessions:
                    self._move_all()
                    for actor in list(self.sessions.values()):
                        if actor.session is not None:
                            actor.session.interrupt()  # (a turn that started meanwhile too)
                    with trio.move_on_after(0.25):
                        await self._emptied.wait()
        left = [actor for actor in self.sessions.values() if actor.keeper is not None]
        abandoned = sum(actor.keeper.abandon() for actor in left if actor.keeper is not None)
        if len(left) > abandoned:
            log.warning(
                "drain: %d sessions cannot move (nothing of them in the store): they close",
                len(left) - abandoned,
            )
        if abandoned:
            log.warning(
                "drain: %d sessions could not be handed over (%s): let go unsaved; their "
                "clients resume at another node, which adopts them from their last save",
                abandoned,
                "the store does not answer"
                if self.node is not None and not self.node.store_ok
                else "their turns did not end",
            )
        # The connections relayed through this node to others: their clients resume at
        # once, and reach the node running their session some other way.
        relayed = self.node.relayed if self.node is not None else set()
        for ws in list(relayed):
            self.nursery.start_soon(send_and_close, ws, [], HANDOVER_CLOSE)
        if relayed:
            await trio.sleep(0.2)

    def _move_all(self, *, again: bool = True) -> None:
        """Ask every session to move (a drain). ``again``: a retry, for those whose
        handover the store failed, only while the store answers (the node's heartbeat
        says when it is back)."""
        if again and self.node is not None and not self.node.store_ok:
            return
        for actor in list(self.sessions.values()):
            if actor.keeper is not None:
                actor.keeper.move()

    def _matching(self, hello: m.Hello, principal: Any) -> SessionActor | None:
        """The session of this node that ``hello`` resumes, if the token, the principal
        and the lastSeq match; None otherwise (the caller gives one answer for all, so a
        refusal says nothing about whether a session exists)."""
        assert hello.resume is not None
        actor = self._credited(hello, principal)
        if actor is None or not actor.proto.can_resume(hello.resume.last_seq):
            return None
        return actor

    def _left(self, hello: m.Hello, principal: Any) -> bool:
        """Whether the session ``hello`` resumes (token and principal matching) has just
        left this node: handed over, taken over or let go, its task not yet done."""
        actor = self._credited(hello, principal)
        return actor is not None and actor.movement.state in MOVED

    def _credited(self, hello: m.Hello, principal: Any) -> SessionActor | None:
        """The session of this node ``hello`` names, if its token and principal match
        (compared in constant time, against a decoy when there is no such session)."""
        assert hello.resume is not None
        actor = self.sessions.get(hello.resume.session_id)
        token = actor.proto.resume_token if actor is not None else _DECOY_TOKEN
        # surrogatepass: a token is the peer's string, and JSON can carry a lone surrogate
        offered = hello.resume.token.encode("utf-8", "surrogatepass")
        matches = hmac.compare_digest(offered, token.encode())
        if actor is None or not matches or actor.principal != principal:
            return None
        return actor


MOVED = frozenset({"handed_over", "taken_over", "abandoned"})
"""Movement states of a session that left this node for another."""
_DECOY_TOKEN = secrets.token_urlsafe(32)  # compared against when the session is unknown


async def _handshake(ws: Any, proto: ServerProtocol) -> m.Hello | None:
    """Read frames until a valid ``hello`` (None if the peer left or was refused);
    protocol errors are answered on the way."""
    while proto.state == "handshaking":
        try:
            frame = await ws.get_message()
        except ConnectionClosed:
            return None
        accepted = proto.receive(frame)
        if accepted:
            hello: m.Hello = accepted[0]
            return hello
        for reply in proto.take_outbox():
            try:
                await ws.send_message(reply)
            except ConnectionClosed:
                return None
    return None
