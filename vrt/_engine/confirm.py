"""The built-in confirmation hook: ask the user before a risky call runs."""

from __future__ import annotations

import json
from typing import Any

from vrt._core.events import ConfirmRequest
from vrt._engine.agent import BeforeToolCall, CallInfo, Decision, Reject
from vrt._engine.current import current_session
from vrt._engine.tools import RISKS, Risk
from vrt._errors import DefinitionError


def require_confirmation(min_risk: Risk = "high", *, apps: bool = False) -> BeforeToolCall:
    """A ``before_tool_call`` hook that asks the user to confirm risky calls.

    Server calls whose risk is ``min_risk`` or above (and every app call when
    ``apps=True``) wait for the user's answer: in process a :class:`~vrt.ConfirmRequest`
    event on ``session.subscribe()``, over the wire a ``confirm.request`` to the client.
    A denial settles the call REJECTED with the user's reason; an interrupt while
    waiting settles it INTERRUPTED. Other calls are allowed at once.
    """
    if min_risk not in RISKS:
        raise DefinitionError(f"min_risk must be 'low', 'medium' or 'high', not {min_risk!r}")
    threshold = RISKS.index(min_risk)

    async def confirm(info: CallInfo) -> Decision:
        if info.kind == "app":
            if not apps:
                return None
        elif info.risk is None or RISKS.index(info.risk) < threshold:
            return None
        session = current_session.get()
        call_id = info.call_id

        async def reply(approved: bool, reason: str | None) -> None:
            session.answer_confirmation(call_id, approved, reason)

        request = ConfirmRequest(
            call_id=call_id,
            name=info.name,
            arguments=info.arguments,
            risk=info.risk,
            prompt=_prompt(info),
            reply=reply,
        )
        approved, reason = await session.confirm(call_id, request)
        return None if approved else Reject(reason or "the user declined")

    return confirm


def _prompt(info: CallInfo) -> str:
    shown: Any = info.arguments
    text = shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False)
    if len(text) > 200:
        text = text[:197] + "..."
    risk = f" ({info.risk} risk)" if info.risk else ""
    return f"Allow {info.name}{risk} with {text}?"
