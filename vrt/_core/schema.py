"""The check of a tool's ``parameters``: what every layer that meets a tool definition runs.

The engine checks server tools in :func:`vrt.define_agent`; the wire's server core checks
the app tools a client declares in its ``hello``. Both must refuse the same schemas.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from vrt._errors import DefinitionError


def check_parameters(parameters: object, where: str) -> None:
    """``parameters`` must be a valid Draft 2020-12 JSON Schema describing an object."""
    if not isinstance(parameters, dict):
        raise DefinitionError(f"{where}: parameters must be a JSON Schema object (a dict)")
    try:
        Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise DefinitionError(
            f"{where}: parameters is not a valid JSON Schema at {path}: {exc.message}"
        ) from None
    _check_refs(parameters, parameters, where)
    if parameters.get("type") != "object":
        raise DefinitionError(
            f'{where}: parameters must describe an object ("type": "object"): '
            "tool arguments are a JSON object"
        )


def _check_refs(node: object, root: dict[str, Any], where: str) -> None:
    """Every ``$ref`` must point inside the schema: a tool schema is self-contained, and a
    dangling or remote reference would only fail when a call arrives."""
    if isinstance(node, list):
        for item in node:
            _check_refs(item, root, where)
        return
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str):
        if not ref.startswith("#"):
            raise DefinitionError(
                f"{where}: $ref {ref!r} is not local; tool schemas must be "
                "self-contained (use #/$defs/...)"
            )
        target: Any = root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise DefinitionError(f"{where}: $ref {ref!r} points nowhere in the schema")
    for key, value in node.items():
        if key not in ("const", "enum", "default", "examples"):
            _check_refs(value, root, where)
