"""trio-vrt: the tool-calling engine of a realtime (voice) AI agent, on Trio.

The public door: everything users need is importable from here; ``vrt.models`` (the model
protocol's events and history), ``vrt.testing`` (helpers for tests) and ``vrt.check`` are
the other public modules, with ``vrt.mcp`` (tools from MCP servers) and ``vrt.asgi`` (the
server as an ASGI application), which ``import vrt`` does not load.
"""

from vrt import models
from vrt._client.client import Client
from vrt._client.dial import connect
from vrt._core.events import (
    AudioDelta,
    Closed,
    ConfirmRequest,
    Event,
    Phase,
    Reconnecting,
    Resumed,
    TextDelta,
    ToolPreview,
    ToolStream,
    Transcript,
    TurnEnded,
    TurnStarted,
)
from vrt._core.results import CallRecord, ResultCode, ToolResult, TurnResult
from vrt._engine.agent import Agent, Allow, CallInfo, Reject, Rewrite, define_agent
from vrt._engine.confirm import require_confirmation
from vrt._engine.context import Signal, ToolContext
from vrt._engine.session import Session, open_session
from vrt._engine.subscription import Subscription
from vrt._engine.tools import AppTool, ServerTool, app_tool, server_tool, validate_arguments
from vrt._engine.turn import Turn
from vrt._errors import (
    CallAborted,
    DefinitionError,
    InvalidArguments,
    InvalidTransition,
    ModelError,
    RemoteProtocolError,
    SessionClosed,
    VrtError,
)
from vrt._server.option_types import ServerOptions
from vrt._server.serve import HandshakeRequest, Refuse, Server, serve
from vrt._wire.audio import AudioInfo
from vrt.models import Model, ModelRequest, ToolSpec
from vrt.models._scripted import ScriptedModel, call, pause, say

__all__ = [
    "Agent",
    "Allow",
    "AppTool",
    "AudioDelta",
    "AudioInfo",
    "CallAborted",
    "CallInfo",
    "CallRecord",
    "Client",
    "Closed",
    "ConfirmRequest",
    "DefinitionError",
    "Event",
    "HandshakeRequest",
    "InvalidArguments",
    "InvalidTransition",
    "Model",
    "ModelError",
    "ModelRequest",
    "Phase",
    "Reconnecting",
    "Refuse",
    "Reject",
    "RemoteProtocolError",
    "ResultCode",
    "Resumed",
    "Rewrite",
    "ScriptedModel",
    "Server",
    "ServerOptions",
    "ServerTool",
    "Session",
    "SessionClosed",
    "Signal",
    "Subscription",
    "TextDelta",
    "ToolContext",
    "ToolPreview",
    "ToolResult",
    "ToolSpec",
    "ToolStream",
    "Transcript",
    "Turn",
    "TurnEnded",
    "TurnResult",
    "TurnStarted",
    "VrtError",
    "app_tool",
    "call",
    "connect",
    "define_agent",
    "models",
    "open_session",
    "pause",
    "require_confirmation",
    "say",
    "serve",
    "server_tool",
    "validate_arguments",
]

__version__ = "0.1.0"
