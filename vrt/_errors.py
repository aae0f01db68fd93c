"""One error tree, rooted at :class:`VrtError`."""

from __future__ import annotations


class VrtError(Exception):
    """Base of every error trio-vrt raises on purpose."""


class DefinitionError(VrtError):
    """A tool or agent definition is wrong (missing risk, bad schema, duplicate name...)."""


class InvalidTransition(VrtError):
    """A machine was sent an event its class does not allow in its current state.

    Inside the engine this is a bug report, except for the one documented case of a late
    event after a final state (a tool that ignored its cancellation), which is logged and
    dropped.
    """

    def __init__(self, machine: str, state: str, event: str) -> None:
        super().__init__(f"{machine}: event {event!r} is not allowed in state {state!r}")
        self.machine = machine
        self.state = state
        self.event = event


class InvalidArguments(VrtError):
    """A tool's arguments are not valid for it; the call's result is INVALID."""


class ToolFailed(VrtError):
    """Raised by a server tool to answer FAILED with exactly ``message`` (a failure the
    tool reports, such as an MCP ``isError``: logged at INFO, not as the tool's bug)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CallAborted(VrtError):
    """Raised by ``ToolContext.committing()`` when the call's turn was already interrupted."""


class SessionClosed(VrtError):
    """The session closed before the awaited thing happened (e.g. ``Turn.wait``)."""


class RemoteProtocolError(VrtError):
    """The peer refused us or broke the protocol; ``code`` is the wire error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ModelError(VrtError):
    """The model failed a step: a provider's HTTP error, an error event in its stream, a
    lost connection, or a stream that broke the rules of :mod:`vrt.models`.

    ``status`` is the HTTP status (None for a stream error or a lost connection);
    ``message`` is short and never carries a key, a header or a request body. Raised
    inside the step: the turn ends ``failed``, and no next step runs.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message if status is None else f"HTTP {status}: {message}")
        self.status = status
        self.message = message
