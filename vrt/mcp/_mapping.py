"""What an MCP tool is in vrt's terms: pure functions, one tested table row each.

No I/O and no SDK connection here: an MCP ``Tool`` (its name, schema and annotations) in,
a name, a risk and a description out; a ``CallToolResult`` in, an output or a failure
out; a progress notification in, the ``progress`` vrt streams out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from vrt._engine.tools import RISKS, Risk

RiskOverride = Risk | Mapping[str, Risk] | Callable[[Any], Risk] | None
"""``risk=`` of ``vrt.mcp.connect_*``: one risk for every tool, a risk by MCP tool name
(the others mapped from their annotations), or a function of the MCP ``Tool``."""

FAILURE_TEXT_LIMIT = 2000
"""Characters of an ``isError`` result's text kept in the FAILED message."""

_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_-]")


def risk_of(tool: Any, override: RiskOverride = None) -> Risk:
    """The risk of an MCP tool: ``override`` if it says, else from its annotations.

    ``readOnlyHint`` true is ``"low"``; not read-only with ``destructiveHint`` false is
    ``"medium"``; anything else ``"high"``: MCP's defaults say an unannotated tool may be
    destructive (``destructiveHint`` defaults to true, ``readOnlyHint`` to false).
    """
    if isinstance(override, str):
        return _checked(override, tool)
    if isinstance(override, Mapping):
        if tool.name in override:
            return _checked(override[tool.name], tool)
    elif callable(override):
        return _checked(override(tool), tool)
    annotations = getattr(tool, "annotations", None)
    read_only = getattr(annotations, "read_only_hint", None)
    destructive = getattr(annotations, "destructive_hint", None)
    if read_only is True:
        return "low"
    if destructive is False:
        return "medium"
    return "high"


def _checked(risk: object, tool: Any) -> Risk:
    if risk not in RISKS:
        raise ValueError(f"the risk of MCP tool {tool.name!r} must be one of {RISKS}, not {risk!r}")
    return risk


def vrt_name(name: str, prefix: str = "") -> str:
    """The name the model sees: ``prefix`` + the MCP name, with every character a vrt tool
    name may not hold (letters, digits, ``_``, ``-``) made ``_``, at most 64."""
    return _NOT_A_NAME.sub("_", prefix + name)[:64]


def description_of(tool: Any) -> str:
    """The tool's description (its title when it has none)."""
    text = getattr(tool, "description", None) or ""
    if not text:
        annotations = getattr(tool, "annotations", None)
        text = getattr(tool, "title", None) or getattr(annotations, "title", None) or ""
    return str(text)


def parameters_of(tool: Any) -> dict[str, Any]:
    """The tool's ``inputSchema``, an object schema (an empty one when it has none)."""
    schema = getattr(tool, "input_schema", None)
    if not isinstance(schema, dict) or not schema:
        return {"type": "object", "properties": {}}
    return dict(schema)


def output_of(result: Any) -> Any:
    """A successful ``CallToolResult`` as vrt's output: ``structuredContent`` when the
    server gave one, else the content blocks as JSON (a list of objects)."""
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return structured
    return [_block(block) for block in getattr(result, "content", None) or []]


def failure_of(result: Any) -> str:
    """An ``isError`` result's message: the text of its text blocks (bounded)."""
    texts = [
        str(getattr(block, "text", ""))
        for block in getattr(result, "content", None) or []
        if getattr(block, "type", None) == "text"
    ]
    text = " ".join(" ".join(texts).split()) or "the MCP tool reported an error"
    if len(text) > FAILURE_TEXT_LIMIT:
        text = text[: FAILURE_TEXT_LIMIT - 3] + "..."
    return text


def progress_of(progress: float, total: float | None, message: str | None) -> dict[str, Any]:
    """An MCP progress notification as vrt's ``progress`` payload (only what it carries)."""
    out: dict[str, Any] = {"progress": progress}
    if total is not None:
        out["total"] = total
    if message is not None:
        out["message"] = message
    return out


def _block(block: Any) -> Any:
    dump = getattr(block, "model_dump", None)
    if callable(dump):
        data = dump(mode="json", by_alias=True, exclude_none=True)
    else:
        data = block
    return json.loads(json.dumps(data, default=str))
