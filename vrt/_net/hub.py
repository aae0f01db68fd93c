"""The sessions of one server: connections in, sessions opened or resumed.

Each accepted connection is served by the task that accepted it: its handshake (a valid
``hello`` within ``handshake_timeout``), then the session it opens or resumes, carried until
the connection ends or a newer one takes the session over. Each session's actor lives in the
hub's nursery, so a session outlives its connections while it can be resumed.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
from typing import Any

import trio
from trio_websocket import ConnectionClosed

from vrt._engine.agent import Agent
from vrt._net.actor import SessionActor
from vrt._net.link import send_and_close
from vrt._net.options import Options
from vrt._net.pumps import AckTimer
from vrt._wire import messages as m
from vrt._wire.server import ServerProtocol

log = logging.getLogger("vrt.server")


class Hub:
    """The sessions of one server, which outlive their connections while resumable.

    Each session's actor runs in the hub's nursery; each connection is served by the task
    that accepted it (:meth:`serve_connection`), attached to one session at a time.
    """

    def __init__(self, agent: Agent, options: Options, nursery: trio.Nursery) -> None:
        self.agent = agent
        self.options = options
        self.nursery = nursery
        self.sessions: dict[str, SessionActor] = {}
        self.acks = AckTimer()
        """Every session's ack timer: one task for the server."""
        nursery.start_soon(self.acks.run)

    async def serve_connection(self, ws: Any, principal: Any = None) -> None:
        """Serve one connection: its handshake, then the session it opens or resumes, until
        the connection ends (or a newer one takes the session over).

        ``ws`` is a trio-websocket connection or anything with its ``get_message``,
        ``send_message`` and ``aclose`` (the memory pair of :mod:`vrt.testing`).
        """
        options = self.options
        proto = ServerProtocol(
            session_id=f"s_{secrets.token_hex(8)}",
            resume_token=secrets.token_urlsafe(32),  # 256 random bits
            server_tools=self.agent.registry.keys(),
            capabilities=options.capabilities,
            max_message_size=options.max_message_size,
            replay_limit=options.replay_limit,
            admit=lambda: len(self.sessions) < options.max_sessions,
        )
        try:
            hello = None
            with trio.move_on_after(options.handshake_timeout):
                hello = await _handshake(ws, proto)
            if hello is None:
                await send_and_close(ws, proto.take_outbox())
                return
            if hello.resume is not None:
                actor = self._resume(hello, proto, principal)
                if actor is None:
                    await send_and_close(ws, proto.take_outbox())
                    return
            else:
                actor = SessionActor(self, proto, hello, principal)
                self.sessions[proto.session_id] = actor
                await self.nursery.start(actor.run)
            await actor.carry(ws)
        except Exception:  # a bug must cost one connection, never the server
            log.exception("connection failed")
            with trio.move_on_after(1.0) as scope:
                scope.shield = True
                with contextlib.suppress(ConnectionClosed):
                    await ws.aclose()

    def _resume(self, hello: m.Hello, proto: ServerProtocol, principal: Any) -> SessionActor | None:
        """The session ``hello`` resumes, now attached; None (refused on ``proto``) if the
        session is unknown, closed, the token wrong or the principal another: one answer
        for all, so a refusal says nothing about whether a session exists."""
        assert hello.resume is not None
        actor = self.sessions.get(hello.resume.session_id)
        token = actor.proto.resume_token if actor is not None else _DECOY_TOKEN
        matches = hmac.compare_digest(hello.resume.token.encode(), token.encode())
        if (
            actor is None
            or not matches
            or actor.principal != principal
            or not actor.proto.can_resume(hello.resume.last_seq)
        ):
            log.info("refused a resume (session, token, principal or lastSeq do not match)")
            proto.refuse(m.RESUME_FAILED, "the session cannot be resumed", hello.seq)
            return None
        actor.resume(hello)
        return actor


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
