"""One public door: __all__ matches the real exports, private modules stay private."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import vrt
import vrt.asgi
import vrt.mcp
import vrt.models
import vrt.testing


def test_all_matches_exports() -> None:
    public = {name for name in dir(vrt) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(vrt, name))}
    assert set(vrt.__all__) == public - (modules - {"models"})
    for name in vrt.__all__:
        assert getattr(vrt, name) is not None


def test_the_option_dicts_are_public() -> None:
    """The typed keywords of ``vrt.serve`` and ``vrt.asgi.app`` (generated from the options'
    declarations), for users building an options dict and for the API reference."""
    assert "ServerOptions" in vrt.__all__
    assert "AppOptions" in vrt.asgi.__all__
    assert set(vrt.asgi.AppOptions.__annotations__) < set(vrt.ServerOptions.__annotations__)
    assert "max_sessions" in vrt.ServerOptions.__annotations__


def test_public_modules_have_all() -> None:
    for module in (vrt.models, vrt.testing, vrt.mcp, vrt.asgi):
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)


def test_private_modules_start_with_underscore() -> None:
    public = {"models", "testing", "check", "mcp", "asgi"}  # DESIGN.md
    for info in pkgutil.iter_modules(vrt.__path__):
        assert info.name.startswith("_") or info.name in public, info.name
        importlib.import_module(f"vrt.{info.name}")


def test_every_public_name_has_a_docstring() -> None:
    for name in vrt.__all__:
        obj = getattr(vrt, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name


def test_api_names_of_design() -> None:
    for name in (
        "define_agent",
        "server_tool",
        "ServerTool",
        "AppTool",
        "app_tool",
        "ToolContext",
        "open_session",
        "ToolResult",
        "ResultCode",
        "TurnResult",
        "CallRecord",
        "ToolStream",
        "ToolPreview",
        "TurnStarted",
        "TurnEnded",
        "TextDelta",
        "Closed",
        "Phase",
        "ModelRequest",
        "ToolSpec",
        "models",
        "ScriptedModel",
        "say",
        "call",
        "pause",
        "Allow",
        "Reject",
        "Rewrite",
        "CallInfo",
        "Model",
    ):
        assert hasattr(vrt, name), name
    assert [p.value for p in vrt.Phase] == [
        "start",
        "arguments-delta",
        "arguments-complete",
        "progress",
        "settled",
        "cancelled",
        "failed",
    ]
    assert [c.value for c in vrt.ResultCode] == [
        "INTERRUPTED",
        "REJECTED",
        "INVALID",
        "TIMEOUT",
        "FAILED",
    ]
    for name in ("Text", "CallStart", "CallDelta", "CallEnd"):
        assert hasattr(vrt.models, name)
