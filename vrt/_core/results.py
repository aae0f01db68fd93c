"""Results: what every call ends with, and what a turn ends with."""

from __future__ import annotations

import enum
from typing import Any, Literal

import attrs


class ResultCode(enum.StrEnum):
    """Why a call did not succeed. The values are the wire strings."""

    INTERRUPTED = "INTERRUPTED"
    """The call's turn was interrupted before or while it ran."""
    REJECTED = "REJECTED"
    """Declined, for example by the user or by a before_tool_call hook."""
    INVALID = "INVALID"
    """The arguments are not valid for the tool."""
    TIMEOUT = "TIMEOUT"
    """No result arrived in time."""
    FAILED = "FAILED"
    """The tool raised, or nobody hosts a tool of that name."""


@attrs.frozen(kw_only=True)
class ToolResult:
    """The one result of one call: ``ok`` with an ``output``, or a failure with a ``code``."""

    ok: bool
    output: Any = None
    code: ResultCode | None = None
    message: str | None = None

    @classmethod
    def success(cls, output: Any = None) -> ToolResult:
        """A successful result; a tool that returns nothing answers ``output=None``."""
        return cls(ok=True, output=output)

    @classmethod
    def failure(cls, code: ResultCode, message: str | None = None) -> ToolResult:
        """A failed result with its code and an optional human-readable message."""
        return cls(ok=False, code=code, message=message)


Kind = Literal["server", "app"]
TurnStatus = Literal["finished", "interrupted", "failed"]


@attrs.frozen(kw_only=True)
class CallRecord:
    """One call as the history keeps it: who was called with what, and its one result.

    ``arguments`` is the parsed JSON object the tool saw (after any hook rewrite), or the raw
    JSON text when the model's arguments were not a JSON object. A call to a tool nobody
    hosts has ``kind="server"``: the server answered it (FAILED).
    """

    call_id: str
    name: str
    kind: Kind
    arguments: Any
    result: ToolResult


@attrs.frozen(kw_only=True)
class TurnResult:
    """How a turn ended, with every call's record in call order."""

    turn_id: str
    status: TurnStatus
    calls: tuple[CallRecord, ...]
    message: str | None = None
    """Why the turn failed (``status == "failed"``), without a traceback."""
