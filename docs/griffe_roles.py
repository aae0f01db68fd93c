"""A griffe extension for the API reference: Sphinx roles in vrt's docstrings become links.

vrt's docstrings name other objects the Sphinx way (``:func:`connect```,
``:class:`~vrt.Closed```), which Markdown would show as literal text. Each role becomes an
optional cross-reference (autorefs' ``<autoref optional>``): a link when the object is in
the reference, plain code when it is not (a private helper, a trio name), so a docstring
never breaks ``mkdocs build --strict`` and the library's docstrings stay as they are.
"""

from __future__ import annotations

import functools
import re
from html import escape
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|exc|attr|data|const|mod|obj):`(~?)([^`<>]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(functools.partial(_link, obj), obj.docstring.value)


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:  # an alias's docstring is its target's
            found.extend(_objects(member))
    return found


def _link(obj: griffe.Object, match: re.Match[str]) -> str:
    short, target = match[1] == "~", match[2].strip()
    title = target.rsplit(".", 1)[-1] if short else target
    identifier = _resolve(obj, target.removesuffix("()"))
    code = f"<code>{escape(title)}</code>"
    return f'<autoref identifier="{escape(identifier)}" optional>{code}</autoref>'


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as Python would find its first name from ``obj``."""
    head, _, rest = target.partition(".")
    scope: griffe.Object | None = obj if obj.is_class or obj.is_module else obj.parent
    while scope is not None:
        if head in scope.members:
            member = scope.members[head]
            path = member.target_path if member.is_alias else member.path
            return f"{path}.{rest}" if rest else path
        scope = scope.parent
    return target
