"""Tool definitions: server tools (run in the session) and app tools (run in the client).

Definitions are plain attrs records; nothing is checked when one is built, so a decorator
can stay light. :func:`vrt.define_agent` checks every definition at once (risk present,
``parameters`` a valid JSON Schema, names unique) and raises :class:`~vrt.DefinitionError`
naming the tool and the rule.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import cattrs
import jsonschema
from jsonschema import Draft202012Validator

from vrt._core.fastcheck import compile_schema
from vrt._core.schema import check_parameters
from vrt._errors import DefinitionError, InvalidArguments

if TYPE_CHECKING:
    from vrt._engine.context import ToolContext

Risk = Literal["low", "medium", "high"]
RISKS: tuple[Risk, ...] = ("low", "medium", "high")

RunFn = Callable[[Any, "ToolContext"], Awaitable[Any]]
AppRunFn = Callable[[Any, Any], Awaitable[Any]]

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@attrs.frozen(kw_only=True)
class ServerTool:
    """A tool that runs in the agent's session, on the server.

    ``risk`` is required (``"low"``, ``"medium"`` or ``"high"``); ``validate`` is optional
    (a callable, an attrs class or dataclass, or a class with pydantic's ``model_validate``)
    and its value is what ``run`` receives; ``timeout`` (seconds) cancels a run that takes
    longer and answers TIMEOUT.
    """

    name: str
    description: str
    parameters: dict[str, Any] = attrs.field(factory=lambda: dict(EMPTY_PARAMETERS))
    risk: Risk | None = None
    run: RunFn
    validate: Any = None
    timeout: float | None = None
    source: ToolSource | None = attrs.field(default=None, eq=False, repr=False)
    """Where the tool came from, when that can change its tools (an MCP server:
    ``vrt.mcp``): the agent takes the source's current tools at each model step."""


class ToolSource(Protocol):
    """A live set of server tools (``vrt.mcp.McpServer``): ``version`` changes whenever
    :meth:`current` does."""

    version: int

    def current(self) -> Sequence[ServerTool]:
        """The source's tools now."""
        ...


@attrs.frozen(kw_only=True)
class AppTool:
    """A tool the client hosts and runs in the user's app; it validates inside ``run``."""

    name: str
    description: str
    parameters: dict[str, Any] = attrs.field(factory=lambda: dict(EMPTY_PARAMETERS))
    run: AppRunFn


def server_tool(
    *,
    risk: Risk | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    name: str | None = None,
    validate: Any = None,
    timeout: float | None = None,
) -> Callable[[RunFn], ServerTool]:
    """Decorate ``async def run(args, ctx)`` into a :class:`ServerTool`.

    The name defaults to the function's, the description to its docstring.
    """

    def wrap(run: RunFn) -> ServerTool:
        return ServerTool(
            name=name or str(getattr(run, "__name__", "")),
            description=description if description is not None else _doc(run),
            parameters=parameters if parameters is not None else dict(EMPTY_PARAMETERS),
            risk=risk,
            run=run,
            validate=validate,
            timeout=timeout,
        )

    return wrap


def app_tool(
    *,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    name: str | None = None,
) -> Callable[[AppRunFn], AppTool]:
    """Decorate ``async def run(args, ctx)`` into an :class:`AppTool`."""

    def wrap(run: AppRunFn) -> AppTool:
        return AppTool(
            name=name or str(getattr(run, "__name__", "")),
            description=description if description is not None else _doc(run),
            parameters=parameters if parameters is not None else dict(EMPTY_PARAMETERS),
            run=run,
        )

    return wrap


def _doc(fn: object) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


# -- checking definitions ------------------------------------------------------------------------


def check_tool(tool: ServerTool | AppTool) -> None:
    """Raise :class:`DefinitionError` if ``tool`` cannot be offered to a model."""
    kind = "server tool" if isinstance(tool, ServerTool) else "app tool"
    if not isinstance(tool.name, str) or not _NAME.match(tool.name):
        raise DefinitionError(
            f"{kind} name {tool.name!r} is not valid: use 1-64 letters, digits, '_' or '-'"
        )
    where = f"{kind} {tool.name!r}"
    if not isinstance(tool.description, str):
        raise DefinitionError(f"{where}: description must be a string")
    check_parameters(tool.parameters, where)
    if not _is_async_callable(tool.run):
        raise DefinitionError(f"{where}: run must be an async function (async def run(args, ctx))")
    if isinstance(tool, ServerTool):
        if tool.risk is None:
            raise DefinitionError(f"{where} declares no risk: pass risk='low', 'medium' or 'high'")
        if tool.risk not in RISKS:
            raise DefinitionError(
                f"{where}: risk must be 'low', 'medium' or 'high', not {tool.risk!r}"
            )
        if tool.timeout is not None and not (
            isinstance(tool.timeout, int | float) and tool.timeout > 0
        ):
            raise DefinitionError(f"{where}: timeout must be a positive number of seconds")


def _is_async_callable(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with async __call__
    )


# -- validating arguments ------------------------------------------------------------------------

Validator = Callable[[dict[str, Any]], Any]

# cattrs alone coerces (3 becomes "3"); a validator must not, so primitives are strict.
_converter = cattrs.Converter(forbid_extra_keys=True)


def _strict_hook(kind: type) -> Callable[[Any, Any], Any]:
    def structure(value: Any, _: Any) -> Any:
        if type(value) is kind or (kind is float and type(value) is int):
            return value
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")

    return structure


for _kind in (str, int, float, bool):
    _converter.register_structure_hook(_kind, _strict_hook(_kind))


def compile_validate(validate: Any, where: str) -> Validator | None:
    """Turn a tool's ``validate`` into one function: arguments in, value out, or raise
    :class:`InvalidArguments`."""
    if validate is None:
        return None
    if _is_async_callable(validate):
        raise DefinitionError(f"{where}: validate must be synchronous (it runs before the tool)")
    if isinstance(validate, type) and (attrs.has(validate) or dataclasses.is_dataclass(validate)):
        cls = validate

        def structure(args: dict[str, Any]) -> Any:
            try:
                return _converter.structure(args, cls)
            except Exception as exc:
                raise InvalidArguments("; ".join(cattrs.transform_error(exc))) from None

        return structure
    model_validate = getattr(validate, "model_validate", None)
    if callable(model_validate):

        def pydantic_style(args: dict[str, Any]) -> Any:
            try:
                return model_validate(args)
            except Exception as exc:
                raise InvalidArguments(_message(exc)) from None

        return pydantic_style
    if callable(validate):
        fn = validate

        def call(args: dict[str, Any]) -> Any:
            try:
                return fn(args)
            except Exception as exc:
                raise InvalidArguments(_message(exc)) from None

        return call
    raise DefinitionError(
        f"{where}: validate must be a callable, an attrs class, a dataclass or a class "
        f"with model_validate, not {validate!r}"
    )


def _message(exc: Exception) -> str:
    text = str(exc)
    if isinstance(exc, InvalidArguments):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def schema_validator(parameters: dict[str, Any]) -> Validator:
    """A function that raises :class:`InvalidArguments` naming the first bad field.

    A schema within :mod:`vrt._core.fastcheck`'s subset is checked by its compiled
    predicate first (about 1 µs against jsonschema's 6 for a one-field object, a good part
    of a call's cost); jsonschema has the last word and writes the message whenever the
    predicate says no, so the two can only differ in speed.
    """
    validator = Draft202012Validator(parameters)
    try:
        fits: Callable[[Any], bool] | None = compile_schema(parameters)
    except (ValueError, TypeError):
        fits = None  # a keyword outside the subset: jsonschema alone

    def check(args: dict[str, Any]) -> dict[str, Any]:
        if fits is not None and fits(args):
            return args
        error = jsonschema.exceptions.best_match(validator.iter_errors(args))
        if error is not None:
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            raise InvalidArguments(f"arguments{path}: {error.message}")
        return args

    return check


def validate_arguments(args: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """Check ``args`` against a JSON Schema; raise :class:`InvalidArguments` if they do not fit.

    App tools validate inside ``run``; this helper makes that one line.
    """
    if not isinstance(args, dict):
        raise InvalidArguments("arguments must be a JSON object")
    checked: dict[str, Any] = schema_validator(schema)(args)
    return checked
