"""The model side of vrt: what a model is asked, and the events it streams back.

A model is anything with ``stream(request) -> AsyncIterator[ModelEvent]``. One call of
``stream`` is one model step. Within a step the model may say text and make calls; a call
is ``CallStart``, any number of ``CallDelta`` fragments of its JSON arguments, then
``CallEnd``. ``CallEnd(arguments=...)`` may carry the whole arguments at once (a model that
does not stream them); otherwise the arguments are the concatenated deltas. A step whose
stream ends with a call not ended means the model stopped before completing its arguments:
that call fails. A model may also say its token counts (``Usage``), which only traces show.

The adapters of real models (each a :class:`Model` over HTTP, streaming Server-Sent
Events): :class:`OpenAIChat` (Chat Completions, and vLLM, Ollama, llama.cpp, LM Studio),
:class:`OpenAIResponses` (the Responses API, stateless) and :class:`AnthropicMessages`.
What each sends is public and pure: :func:`render_openai_chat`,
:func:`render_openai_responses`, :func:`render_anthropic`.

Realtime (speech-to-speech) models, held open over one WebSocket for a session's life:
:class:`OpenAIRealtime` (the Realtime API) and :class:`GeminiLive` (the Live API). Each is
a :class:`RealtimeModel`; a new model session starts from a :class:`RealtimeSeed` (the
instructions, the tools and the history so far).
"""

from vrt._core.results import CallRecord
from vrt.models._adapters import AnthropicMessages, OpenAIChat, OpenAIResponses
from vrt.models._anthropic import render_anthropic
from vrt.models._chat import render_openai_chat
from vrt.models._gemini_live import GeminiLive
from vrt.models._openai_realtime import OpenAIRealtime
from vrt.models._protocol import (
    AgentText,
    CallDelta,
    CallEnd,
    CallStart,
    HistoryItem,
    Model,
    ModelEvent,
    ModelRequest,
    Text,
    ToolSpec,
    TurnInterrupted,
    Usage,
    UserInput,
)
from vrt.models._realtime import RealtimeModel, RealtimeSeed
from vrt.models._responses import render_openai_responses

__all__ = [
    "AgentText",
    "AnthropicMessages",
    "CallDelta",
    "CallEnd",
    "CallRecord",
    "CallStart",
    "GeminiLive",
    "HistoryItem",
    "Model",
    "ModelEvent",
    "ModelRequest",
    "OpenAIChat",
    "OpenAIRealtime",
    "OpenAIResponses",
    "RealtimeModel",
    "RealtimeSeed",
    "Text",
    "ToolSpec",
    "TurnInterrupted",
    "Usage",
    "UserInput",
    "render_anthropic",
    "render_openai_chat",
    "render_openai_responses",
]
