"""Definitions are checked at define_agent, with clear vrt errors."""

from __future__ import annotations

from typing import Any

import pytest

import vrt


async def run(args: Any, ctx: vrt.ToolContext) -> None:
    return None


def model() -> vrt.ScriptedModel:
    return vrt.ScriptedModel([])


def server(**kw: Any) -> vrt.ServerTool:
    fields: dict[str, Any] = {"name": "t", "description": "d", "risk": "low", "run": run}
    fields.update(kw)
    return vrt.ServerTool(**fields)


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([server(risk=None)], "server tool 't' declares no risk"),
        ([server(risk="extreme")], "risk must be 'low', 'medium' or 'high'"),
        ([server(parameters={"type": "objekt"})], "parameters is not a valid JSON Schema at type"),
        (
            [server(parameters={"type": "object", "properties": {"a": {"minLength": -1}}})],
            "not a valid JSON Schema at properties/a/minLength",
        ),
        ([server(parameters=[])], "parameters must be a JSON Schema object"),
        ([server(parameters={"type": "string"})], "parameters must describe an object"),
        ([server(), server()], "two server tools are named 't'"),
        ([server(name="has space")], "name 'has space' is not valid"),
        ([server(name="")], "name '' is not valid"),
        ([server(run=lambda a, c: None)], "run must be an async function"),
        ([server(timeout=0)], "timeout must be a positive number"),
        ([server(validate=42)], "validate must be a callable"),
        (["nope"], "tools must be vrt.ServerTool"),
    ],
)
def test_bad_definitions(tools: list[Any], message: str) -> None:
    with pytest.raises(vrt.DefinitionError, match=message.replace("(", r"\(")):
        vrt.define_agent(model=model(), tools=tools)


def test_decorator_without_risk_fails_at_define_agent() -> None:
    @vrt.server_tool(description="no risk here")
    async def lookup(args: Any, ctx: vrt.ToolContext) -> None:
        return None

    assert lookup.name == "lookup"
    with pytest.raises(vrt.DefinitionError, match="server tool 'lookup' declares no risk"):
        vrt.define_agent(model=model(), tools=[lookup])


def test_app_tool_is_not_a_server_tool() -> None:
    @vrt.app_tool(description="highlight")
    async def highlight(args: Any, ctx: Any) -> None:
        return None

    with pytest.raises(vrt.DefinitionError, match="is an app tool"):
        vrt.define_agent(model=model(), tools=[highlight])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"client_tools": "maybe"}, "client_tools must be 'ignore' or 'accept'"),
        ({"client_tool_timeout": 0}, "client_tool_timeout must be a positive"),
        ({"max_steps": 0}, "max_steps must be an integer >= 1"),
        ({"before_tool_call": 3}, "before_tool_call must be an async function"),
        ({"model": object()}, "model must have a stream"),
    ],
)
def test_bad_options(options: dict[str, Any], message: str) -> None:
    kw: dict[str, Any] = {"model": model()}
    kw.update(options)
    with pytest.raises(vrt.DefinitionError, match=message):
        vrt.define_agent(**kw)


def test_decorator_defaults_and_specs() -> None:
    @vrt.server_tool(risk="medium")
    async def weather(args: Any, ctx: vrt.ToolContext) -> None:
        """Weather now.

        Longer text the model does not need.
        """

    agent = vrt.define_agent(model=model(), tools=[weather], instructions="hi")
    assert weather.description == "Weather now."
    assert weather.parameters == {"type": "object", "properties": {}}
    assert agent.specs == (
        vrt.ToolSpec(
            name="weather",
            description="Weather now.",
            parameters={"type": "object", "properties": {}},
        ),
    )


def test_validate_arguments_helper() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert vrt.validate_arguments({"n": 1}, schema) == {"n": 1}
    with pytest.raises(vrt.InvalidArguments, match=r"arguments.n: 'x' is not of type 'integer'"):
        vrt.validate_arguments({"n": "x"}, schema)
    with pytest.raises(vrt.InvalidArguments, match="must be a JSON object"):
        vrt.validate_arguments([1], schema)


def test_errors_share_one_root() -> None:
    for error in (
        vrt.DefinitionError,
        vrt.InvalidTransition,
        vrt.InvalidArguments,
        vrt.CallAborted,
        vrt.SessionClosed,
    ):
        assert issubclass(error, vrt.VrtError)
