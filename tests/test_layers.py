"""The layers of vrt point down only: each package imports only the layers below it.

From the bottom: ``machines/`` (no vrt at all), ``vrt._errors``, ``vrt._core`` (tables,
records), the sans-IO ``vrt._wire`` and the model protocol ``vrt.models``, the Trio engine
``vrt._engine``, the plumbing both sides use ``vrt._net``; above it three rooms: the
client ``vrt._client``, what lets a session move ``vrt._cluster`` (never the server's
rooms: the server calls it, not the other way round), and the server ``vrt._server``;
``vrt.check`` reads only the base; ``vrt.asgi`` (the ASGI front) the server and what is
below it; ``vrt.testing`` may use everything but the CLI, ``vrt._cli`` everything. Imports inside
``if TYPE_CHECKING:`` count too: a type from a higher layer is a dependency all the same.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import vrt

ROOT = Path(vrt.__file__).parent.parent

BASE = {"vrt._errors", "vrt._core", "machines"}
ALLOWED: dict[str, set[str]] = {
    "machines": set(),
    "vrt._errors": set(),
    "vrt._core": {"vrt._errors", "machines"},
    "vrt._wire": BASE,
    "vrt.models": BASE,
    "vrt.check": BASE,
    "vrt._engine": BASE | {"vrt.models"},
    "vrt._net": BASE | {"vrt.models", "vrt._engine", "vrt._wire"},
    "vrt._client": BASE | {"vrt.models", "vrt._engine", "vrt._wire", "vrt._net"},
    "vrt._cluster": BASE | {"vrt.models", "vrt._engine", "vrt._wire", "vrt._net"},
    "vrt._server": BASE | {"vrt.models", "vrt._engine", "vrt._wire", "vrt._net", "vrt._cluster"},
    "vrt.mcp": BASE | {"vrt.models", "vrt._engine"},  # tools from MCP servers (an extra)
    "vrt.asgi": BASE | {"vrt.models", "vrt._engine", "vrt._net", "vrt._wire", "vrt._server"},
    "vrt.testing": BASE
    | {"vrt.models", "vrt._engine", "vrt._wire", "vrt._net", "vrt._client", "vrt._server"}
    | {"vrt._cluster", "vrt", "vrt.mcp", "vrt.asgi"},
    "vrt._cli": BASE
    | {"vrt.models", "vrt._engine", "vrt._wire", "vrt._net", "vrt._client", "vrt._server"}
    | {"vrt._cluster", "vrt.testing", "vrt", "vrt.check", "vrt.asgi"},
    "vrt": BASE
    | {"vrt.models", "vrt._engine", "vrt._wire", "vrt._net", "vrt._client"}
    | {"vrt._server"},  # __init__
}
"""What each layer may import of the others (its own package always)."""

NO_TRIO = ("vrt._core", "vrt._wire", "vrt.check", "machines")
"""Layers that must stay synchronous and free of I/O."""


def _layer(module: str) -> str:
    """The layer a module belongs to: its package under vrt (or machines)."""
    parts = module.split(".")
    if parts[0] == "machines":
        return "machines"
    if len(parts) == 1:
        return "vrt"
    return ".".join(parts[:2])


def _module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, with its line: ``from vrt import models`` counts as
    ``vrt.models``, ``from vrt import Agent`` as ``vrt``."""
    tree = ast.parse(path.read_text())
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}:{node.lineno}: use absolute imports"
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.append(
                    (
                        node.lineno,
                        name if node.module == "vrt" and _is_module(name) else node.module,
                    )
                )
    return found


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def violations(root: Path) -> list[str]:
    """Every import under ``root`` (a tree holding ``vrt/`` and ``machines/``) that points
    up or sideways, and every trio import in a layer that must not have one."""
    problems = []
    for path in sorted([*root.glob("vrt/**/*.py"), *root.glob("machines/**/*.py")]):
        module = _module_of(path, root)
        layer = _layer(module)
        if module == "vrt.__main__":
            continue  # the command line's entry point
        for line, name in _imports(path):
            where = f"{path.relative_to(root)}:{line}"
            if name.split(".")[0] in ("trio", "trio_websocket") and layer.startswith(NO_TRIO):
                problems.append(f"{where}: {layer} imports {name}")
            if name.split(".")[0] not in ("vrt", "machines"):
                continue
            target = _layer(name)
            if target != layer and target not in ALLOWED[layer]:
                problems.append(f"{where}: {layer} imports {name} ({target} is not below it)")
    return problems


def test_layers_point_down_only() -> None:
    assert violations(ROOT) == []


def test_every_module_belongs_to_a_known_layer() -> None:
    for path in (ROOT / "vrt").glob("**/*.py"):
        module = _module_of(path, ROOT)
        assert _layer(module) in ALLOWED or module == "vrt.__main__", module


@pytest.mark.parametrize(
    ("file", "line", "found"),
    [
        ("vrt/_engine/turn.py", "from vrt._net import pumps", "vrt._engine imports vrt._net"),
        ("vrt/_wire/codec.py", "import trio", "vrt._wire imports trio"),
        ("vrt/_wire/client.py", "from vrt._engine import call", "vrt._wire imports vrt._engine"),
        ("vrt/_wire/server.py", "from vrt import models", "vrt._wire imports vrt.models"),
        ("machines/turn.py", "import vrt", "machines imports vrt"),
        ("vrt/_core/tables.py", "from vrt._engine.tools import AppTool", "vrt._core imports"),
        ("vrt/check/_model.py", "import trio", "vrt.check imports trio"),
        ("vrt/_server/hub.py", "from vrt import asgi", "vrt._server imports vrt.asgi"),
        ("vrt/_cluster/node.py", "from vrt._server import hub", "vrt._cluster imports vrt._server"),
        ("vrt/_cluster/store.py", "import vrt._client.dial", "vrt._cluster imports vrt._client"),
        ("vrt/_client/dial.py", "from vrt._server.link import Link", "vrt._client imports"),
        ("vrt/_net/pumps.py", "from vrt._server import frames", "vrt._net imports vrt._server"),
        ("vrt/asgi.py", "import vrt.testing", "vrt.asgi imports vrt.testing"),
    ],
)
def test_a_wrong_import_is_found(tmp_path: Path, file: str, line: str, found: str) -> None:
    """The check on a copy of the tree with one deliberately wrong import added."""
    for package in ("vrt", "machines"):
        shutil.copytree(ROOT / package, tmp_path / package)
    target = tmp_path / file
    target.write_text(target.read_text() + f"\n{line}\n")
    (problem,) = violations(tmp_path)
    assert problem.startswith(f"{file}:") and found in problem, problem


def test_modules_inside_public_packages_are_private() -> None:
    """``vrt.models``, ``vrt.testing`` and ``vrt.check`` are public through their
    ``__init__``; every other module in them starts with an underscore."""
    for package in ("models", "testing", "check"):
        for path in (ROOT / "vrt" / package).glob("*.py"):
            assert path.stem == "__init__" or path.stem.startswith("_"), path
