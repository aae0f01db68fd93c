"""A session's saved state: what another process needs to go on with it (``handover-v1``).

Two parts. The **state** (:func:`encode_state`, a few kilobytes, written whole at every
turn boundary): the engine's epoch, turn count, whether a turn is open, pending inputs
and what the model keeps for the session, and the protocol's capabilities, app tools,
seq numbering both ways and the messages the client has not acked. The **history**
(:func:`encode_item`, one record an item, appended as it grows and trimmed at its front
as the session drops its oldest turns): a save costs what the turn added, not the whole
conversation again. :func:`restore` reads both back. The resume token is kept only as
its SHA-256 (it never reaches the store); the resuming client proves it has the token
and the adopting process takes it from there. The principal is kept as the SHA-256 of
its ``repr``: a resume must come with an equal one (a principal with a stable ``repr``,
such as a user id, compares across processes).

The format is JSON, versioned (``v``). The state is bounded by the replay buffer's
``replay_limit_bytes`` (about doubled by escaping; :class:`TooLarge` beyond
:func:`limit_bytes`), the history by the server's ``max_history_bytes``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any

import attrs

from vrt._core.results import CallRecord, ResultCode, ToolResult
from vrt._engine.session import Session
from vrt._wire import codec
from vrt._wire.messages import ToolDecl
from vrt._wire.server import ServerProtocol
from vrt.models import AgentText, HistoryItem, TurnInterrupted, UserInput
from vrt.models._render import strict_json

VERSION = 2


class TooLarge(Exception):
    """The session's state is over the bound for one record."""


@attrs.frozen(kw_only=True)
class State:
    """A session as saved at a turn boundary."""

    session_id: str
    token_hash: str
    principal_hash: str | None
    capabilities: tuple[str, ...]
    tools: tuple[dict[str, Any], ...]
    """The app tools the client declared, as the wire has them."""
    epoch: int
    turns: int
    """Turns started so far (the next is ``t_{turns + 1}``)."""
    open_turn: str | None
    """The turn that was running when this was saved (at its start), or None (between turns)."""
    turned: bool
    """A turn was ever asked for (the first-turn limit no longer applies)."""
    history: tuple[HistoryItem, ...]
    history_offset: int
    """The number of the first item of ``history`` in the conversation (the items before
    it were dropped, oldest turns first)."""
    sent_seq: int
    received_seq: int
    acked_by_peer: int
    replay: tuple[tuple[int, str], ...]
    inputs: tuple[str, ...] = ()
    """User inputs read whose turns had not started (the new process starts them)."""
    model: Any = None
    """What the model keeps for the session (``session_state``), if it keeps anything."""


def state_of(
    proto: ServerProtocol,
    session: Session,
    *,
    principal: Any,
    tools: Sequence[ToolDecl],
    open_turn: str | None,
    turned: bool,
    inputs: tuple[str, ...],
) -> State:
    """A live session as the store keeps it (its history apart: saved item by item), at a
    turn boundary: its protocol state ``proto``, its engine ``session``, whom it belongs
    to, the app tools its client declared, the turn open (None between turns), whether a
    turn was ever asked for, and the inputs whose turns have not started."""
    return State(
        session_id=proto.session_id,
        token_hash=token_hash(proto.resume_token),
        principal_hash=principal_hash(principal),
        capabilities=proto.capabilities,
        tools=tuple(codec.to_plain(t) for t in tools),
        epoch=session.epoch,
        turns=session.turns,
        open_turn=open_turn,
        turned=turned,
        history=(),
        history_offset=session.history_offset,
        sent_seq=proto.sent_seq,
        received_seq=proto.received_seq,
        acked_by_peer=proto.acked_by_peer,
        replay=tuple(proto.replay),
        inputs=inputs,
        model=session.model_state(),
    )


def token_hash(token: str) -> str:
    """The form a resume token is stored in."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def token_matches(offered: str, stored_hash: str) -> bool:
    """Whether ``offered`` is the token of ``stored_hash`` (in constant time)."""
    return hmac.compare_digest(token_hash(offered), stored_hash)


def principal_hash(principal: Any) -> str | None:
    """The form a principal is stored in (None for no principal)."""
    if principal is None:
        return None
    return hashlib.sha256(repr(principal).encode("utf-8", "backslashreplace")).hexdigest()


def limit_bytes(replay_limit_bytes: int) -> int:
    """The most bytes one session's state (its history apart) may take."""
    return 2 * replay_limit_bytes + 256 * 1024


def encode_state(state: State, limit: int) -> bytes:
    """``state`` but its history, as the store keeps it; :class:`TooLarge` over
    ``limit``."""
    data = {
        "v": VERSION,
        "session": state.session_id,
        "token": state.token_hash,
        "principal": state.principal_hash,
        "capabilities": list(state.capabilities),
        "tools": list(state.tools),
        "epoch": state.epoch,
        "turns": state.turns,
        "open": state.open_turn,
        "turned": state.turned,
        "base": state.history_offset,
        "seq": [state.sent_seq, state.received_seq, state.acked_by_peer],
        "replay": [list(entry) for entry in state.replay],
        "inputs": list(state.inputs),
        "model": state.model,
    }
    text = strict_json(data)
    if len(text) > limit:
        raise TooLarge(f"the session's state is {len(text)} bytes, over {limit}")
    return text.encode()


def encode_item(item: HistoryItem) -> bytes:
    """One history item as the store keeps it."""
    return strict_json(_item(item)).encode()


def checks(data: bytes) -> tuple[str, str | None]:
    """The token and principal hashes of a saved state (what a resume is checked
    against, before anything else is read); ValueError if it is not one."""
    try:
        raw = json.loads(data)
        if raw.get("v") != VERSION:
            raise ValueError(f"saved in format {raw.get('v')!r}, not {VERSION}")
        return str(raw["token"]), raw["principal"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a saved session: {exc}") from None


def restore(data: bytes, history: Sequence[bytes] = ()) -> State:
    """A saved state and its history back into a :class:`State`; ValueError if they are
    not one."""
    try:
        raw = json.loads(data)
        if raw.get("v") != VERSION:
            raise ValueError(f"saved in format {raw.get('v')!r}, not {VERSION}")
        sent, received, acked = raw["seq"]
        return State(
            session_id=raw["session"],
            token_hash=raw["token"],
            principal_hash=raw["principal"],
            capabilities=tuple(raw["capabilities"]),
            tools=tuple(raw["tools"]),
            epoch=int(raw["epoch"]),
            turns=int(raw["turns"]),
            open_turn=raw["open"],
            turned=bool(raw["turned"]),
            history=tuple(_history_item(json.loads(item)) for item in history),
            history_offset=int(raw["base"]),
            sent_seq=int(sent),
            received_seq=int(received),
            acked_by_peer=int(acked),
            replay=tuple((int(seq), str(frame)) for seq, frame in raw["replay"]),
            inputs=tuple(str(text) for text in raw["inputs"]),
            model=raw.get("model"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a saved session: {exc}") from None


def _item(item: HistoryItem) -> dict[str, Any]:
    if isinstance(item, UserInput):
        return {"k": "user", "turn": item.turn_id, "text": item.text}
    if isinstance(item, AgentText):
        return {"k": "agent", "turn": item.turn_id, "text": item.text}
    if isinstance(item, TurnInterrupted):
        return {"k": "interrupted", "turn": item.turn_id, "note": item.note}
    result = item.result
    return {
        "k": "call",
        "id": item.call_id,
        "name": item.name,
        "kind": item.kind,
        "arguments": item.arguments,
        "ok": result.ok,
        # Written as the model reads it (encode_item: str() for what is not JSON, NaN
        # as null), so the text it reads is the same after a move.
        "output": result.output,
        "code": None if result.code is None else str(result.code),
        "message": result.message,
    }


def _history_item(data: dict[str, Any]) -> HistoryItem:
    kind = data["k"]
    if kind == "user":
        return UserInput(turn_id=data["turn"], text=data["text"])
    if kind == "agent":
        return AgentText(turn_id=data["turn"], text=data["text"])
    if kind == "interrupted":
        return TurnInterrupted(turn_id=data["turn"], note=data["note"])
    if kind != "call":
        raise ValueError(f"unknown history item {kind!r}")
    code = data["code"]
    return CallRecord(
        call_id=data["id"],
        name=data["name"],
        kind="app" if data["kind"] == "app" else "server",
        arguments=data["arguments"],
        result=ToolResult(
            ok=bool(data["ok"]),
            output=data["output"],
            code=None if code is None else ResultCode(code),
            message=data["message"],
        ),
    )
