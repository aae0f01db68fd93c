"""A session's saved state: what another process needs to go on with it (``handover-v1``).

:func:`snapshot` writes, at a turn boundary, everything a session is between turns: the
engine's (history, epoch, turn count, whether a turn is open, the model's own state for
the session) and the protocol's (capabilities, app tools, seq numbering both ways, the
messages the client has not acked). :func:`restore` reads it back into the parts a
:class:`~vrt._net.actor.SessionActor` is made of. The resume token is kept only as its
SHA-256 (it never reaches the store); the resuming client proves it has the token and the
adopting process takes it from there. The principal is kept as the SHA-256 of its
``repr``: a resume must come with an equal one (a principal with a stable ``repr``, such
as a user id, compares across processes).

The format is JSON, versioned (``v``). It is bounded: the history by the server's
``max_history_bytes`` and the replay buffer by ``replay_limit_bytes``, each about doubled
by escaping; :func:`snapshot` refuses (:class:`TooLarge`) beyond :func:`limit_bytes`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import attrs

from vrt._core.results import CallRecord, ResultCode, ToolResult
from vrt.models import AgentText, HistoryItem, TurnInterrupted, UserInput
from vrt.models._render import strict_json

VERSION = 1


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
    sent_seq: int
    received_seq: int
    acked_by_peer: int
    replay: tuple[tuple[int, str], ...]
    inputs: tuple[str, ...] = ()
    """User inputs read whose turns had not started (the new process starts them)."""
    model: Any = None
    """What the model keeps for the session (``session_state``), if it keeps anything."""


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


def limit_bytes(max_history_bytes: int, replay_limit_bytes: int) -> int:
    """The most bytes one saved session may take."""
    return 2 * (max_history_bytes + replay_limit_bytes) + 256 * 1024


def snapshot(state: State, limit: int) -> bytes:
    """``state`` as the bytes the store keeps; :class:`TooLarge` over ``limit``."""
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
        "history": [_item(item) for item in state.history],
        "seq": [state.sent_seq, state.received_seq, state.acked_by_peer],
        "replay": [list(entry) for entry in state.replay],
        "inputs": list(state.inputs),
        "model": state.model,
    }
    text = strict_json(data)
    if len(text) > limit:
        raise TooLarge(f"the session's state is {len(text)} bytes, over {limit}")
    return text.encode()


def restore(data: bytes) -> State:
    """Saved bytes back into a :class:`State`; ValueError if they are not one."""
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
            history=tuple(_history_item(item) for item in raw["history"]),
            sent_seq=int(sent),
            received_seq=int(received),
            acked_by_peer=int(acked),
            replay=tuple((int(seq), str(frame)) for seq, frame in raw["replay"]),
            inputs=tuple(str(text) for text in raw["inputs"]),
            model=raw.get("model"),
        )
    except (KeyError, TypeError, ValueError) as exc:
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
        # What the model reads of an output is its JSON text (vrt.models renders it with
        # str() for what is not JSON): the same text after a move.
        "output": json.loads(strict_json(result.output)),
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
