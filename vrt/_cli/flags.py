"""``vrt serve``'s flags for ``vrt.serve``'s options, made from the options' declarations
(:mod:`vrt._net.options`, :mod:`vrt._server.options`): each option declared with a
:class:`~vrt._net.options.Flag` is one flag, its value the option's (the flag's ``dest`` is
the option's name), its text read by the option's rule, its help the declared line with the
default. ``vrt serve`` adds them (:func:`add_flags`) and passes their values to ``vrt.serve``
(:func:`option_values`); ``vrt serve --workers`` gives each worker the same ones
(:func:`option_argv`). A new option with a flag needs no change here or there.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from vrt._net.options import about
from vrt._server.options import SERVE


class Container(Protocol):
    """An argument parser or one of its groups."""

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action: ...


def flagged() -> list[attrs.Attribute[Any]]:
    """The options of ``vrt.serve`` that are flags of ``vrt serve``, in declaration order."""
    return [field for field in SERVE if about(field).flag is not None]


def reading(read: Callable[[str], Any]) -> Callable[[str], Any]:
    """A rule's reader as an argparse ``type``: its ValueError is the one-line usage error."""

    def parse(text: str) -> Any:
        try:
            return read(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(read, "__name__", "value")
    return parse


def add_flags(parser: Container, groups: Mapping[str, Container] | None = None) -> None:
    """Add a flag for each flagged option to ``parser``, or to ``groups[its group]``."""
    for field in flagged():
        declared = about(field)
        flag = declared.flag
        assert flag is not None
        into = (groups or {}).get(declared.group, parser)
        name = declared.flag_name(field.name)
        if isinstance(field.default, bool):
            into.add_argument(name, dest=field.name, action="store_true", help=flag.help)
        elif flag.repeat:
            into.add_argument(
                name, dest=field.name, action="append", metavar=flag.metavar, help=flag.help
            )
        else:
            read = str if declared.rule is None else declared.rule.read
            shown = "" if field.default is None else " (default: %(default)s)"
            into.add_argument(
                name,
                dest=field.name,
                type=reading(read),
                default=field.default,
                metavar=flag.metavar,
                help=flag.help + shown,
            )


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The flagged options' values in ``args``, as ``vrt.serve`` takes them."""
    return {field.name: getattr(args, field.name) for field in flagged()}


def option_argv(args: argparse.Namespace) -> list[str]:
    """The flags that give the options of ``args`` again (those not at their default)."""
    argv: list[str] = []
    for field in flagged():
        declared = about(field)
        name = declared.flag_name(field.name)
        value = getattr(args, field.name)
        if value == field.default or value is None:
            continue
        if isinstance(field.default, bool):
            argv.append(name)
        elif declared.flag is not None and declared.flag.repeat:
            for item in value:
                argv += [name, str(item)]
        else:
            argv += [name, str(value)]
    return argv
