"""``vrt serve``'s flags for ``vrt.serve``'s options, made from the options' declarations
(:mod:`vrt._net.options`, :mod:`vrt._server.options`): each option declared with a
:class:`~vrt._net.options.Flag` is one flag, its value the option's (the flag's ``dest`` is
the option's name), its text read by the option's rule, its help the declared line with the
default. ``vrt serve`` adds them (:func:`add_flags`) and passes their values to ``vrt.serve``
(:func:`option_values`); ``vrt serve --workers`` gives each worker the same ones
(:func:`option_argv`). A new option with a flag needs no change here or there.

A flag with an environment variable (:attr:`~vrt._net.options.Flag.env`) takes its value
from there when it is not given. A secret's flag (``--cluster-secret``) is never written
on a worker's command line, which ``ps`` shows to every user of the machine: given as a
flag, it is put in that environment variable, which the workers inherit.
"""

from __future__ import annotations

import argparse
import os
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
        read = str if declared.rule is None else declared.rule.read
        if isinstance(field.default, bool):
            into.add_argument(name, dest=field.name, action="store_true", help=flag.help)
        elif flag.repeat:
            into.add_argument(
                name,
                dest=field.name,
                action="append",
                type=reading(read),
                metavar=flag.metavar,
                help=flag.help,
            )
        elif flag.env is not None:
            default = os.environ.get(flag.env)
            into.add_argument(
                name,
                dest=field.name,
                type=reading(read),
                default=field.default if default is None else read_env(flag.env, read, default),
                action=_Exported if declared.secret else "store",
                metavar=flag.metavar,
                help=f"{flag.help}; or ${flag.env}",
            )
        else:
            shown = "" if field.default is None else " (default: %(default)s)"
            into.add_argument(
                name,
                dest=field.name,
                type=reading(read),
                default=field.default,
                metavar=flag.metavar,
                help=flag.help + shown,
            )


def read_env(name: str, read: Callable[[str], Any], text: str) -> Any:
    """The value of environment variable ``name``, read as its flag's: SystemExit with one
    line (naming the variable, never its value) if it is not one."""
    try:
        return read(text)
    except ValueError as exc:
        raise SystemExit(f"vrt serve: ${name}: {exc}") from None


class _Exported(argparse.Action):
    """A secret's flag: its value is also put in the flag's environment variable, for the
    workers (which get no secret on their command line) to inherit."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        for field in flagged():
            flag = about(field).flag
            if field.name == self.dest and flag is not None and flag.env is not None:
                os.environ[flag.env] = values


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
        if value == field.default or value is None or declared.secret:
            continue  # (a secret reaches the workers in its environment variable)
        if isinstance(field.default, bool):
            argv.append(name)
        elif declared.flag is not None and declared.flag.repeat:
            for item in value:
                argv += [name, str(item)]
        else:
            argv += [name, str(value)]
    return argv
