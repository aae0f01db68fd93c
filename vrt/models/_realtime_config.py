"""What the two realtime model classes share: the API key and the checks of their settings.

The key is read once, when the model is made (the argument, else the API's environment
variables), and goes in a header only: never in the URL, a repr, a log or an event. A
server that echoes it in an error gets it redacted before the message is cut short, as
the HTTP adapters do (:func:`vrt.models._adapters._short`).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from vrt.models._adapters import _short
from vrt.models._render import User

Output = Literal["audio", "text"]


def read_key(api_key: str | None, variables: tuple[str, ...]) -> str | None:
    """``api_key``, else the first of ``variables`` set in the environment; None when
    neither gives one (then no key header is sent)."""
    key = api_key
    for variable in variables:
        if key is not None:
            break
        key = os.environ.get(variable) or None
    key = key.strip() if isinstance(key, str) else key
    if key is not None and (not isinstance(key, str) or not key.isprintable()):
        raise ValueError("api_key must be a string of printable characters")
    return key or None


def upstream_text(text: str, key: str | None) -> str:
    """What a server said, fit for an event: the key redacted, then one short line."""
    if key:
        text = text.replace(key, "***")
    return _short(text)


def check_common(
    model: Any, url: Any, output: Any, voice: Any, input_rate: Any, timeout: Any
) -> None:
    """The settings both classes take, each checked with a short reason."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a model name, not {model!r}")
    if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
        raise ValueError(f"url must be a ws:// or wss:// URL, not {url!r}")
    if output not in ("audio", "text"):
        raise ValueError(f'output must be "audio" or "text", not {output!r}')
    if voice is not None and (not isinstance(voice, str) or not voice):
        raise ValueError(f"voice must be a voice name or None, not {voice!r}")
    if not (isinstance(input_rate, int) and not isinstance(input_rate, bool) and input_rate > 0):
        raise ValueError(f"input_rate must be a positive number of samples, not {input_rate!r}")
    if not (isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")


def user_text(entry: User) -> str:
    """A user message's text: its notes, then its input (the notes alone when an
    interrupted turn is the last thing in the history)."""
    return entry.content if entry.text else entry.content.rstrip("\n")
