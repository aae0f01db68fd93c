"""The server's options, declared once (``vrt/_net/options.py``, ``vrt/_server/options.py``):
the generated TypedDicts are current and typed, ``vrt.serve`` and ``vrt.asgi.app`` refuse an
unknown keyword by name and show every option to ``inspect``, and ``vrt serve``'s flags (and
each worker's command line under ``--workers``) are the declared ones."""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import vrt
import vrt.asgi
from vrt._cli import main, optiontypes
from vrt._cli.commands import _parser
from vrt._cli.flags import flagged, option_values
from vrt._cli.workers import worker_command
from vrt._net.options import Options, about
from vrt._server.options import APP, SERVE

ROOT = Path(__file__).parent.parent
AGENT = vrt.define_agent(model=vrt.ScriptedModel([]))


# -- the generated TypedDicts ---------------------------------------------------------------------


def test_the_generated_file_is_current() -> None:
    assert optiontypes.check() == []
    assert list(vrt.ServerOptions.__annotations__) == [f.name for f in SERVE]
    assert set(vrt.asgi.AppOptions.__optional_keys__) == {f.name for f in APP}
    assert vrt.ServerOptions.__required_keys__ == frozenset()


def test_a_stale_or_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "option_types.py"
    assert optiontypes.check(path) == [f"{path}: missing"]
    optiontypes.write(path)
    assert optiontypes.check(path) == []
    path.write_text(path.read_text().replace("Live sessions", "Sessions"))
    assert optiontypes.check(path) == [f"{path}: stale (an option's declaration changed)"]


def test_a_changed_declaration_makes_it_stale(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Change one option's documented paragraph: ``vrt diagrams --check`` fails, naming the
    generated file, until ``vrt diagrams`` writes it again."""
    declared = about(attrs.fields(Options).max_sessions)
    changed = attrs.evolve(declared, doc="Live sessions, now documented otherwise.")
    monkeypatch.setattr(
        optiontypes,
        "about",
        lambda field: changed if field.name == "max_sessions" else about(field),
    )
    assert "now documented otherwise" in optiontypes.source()
    assert main(["diagrams", "--check", "--dir", str(ROOT / "diagrams")]) == 1
    err = capsys.readouterr().err
    assert f"{optiontypes.FILE}: stale (an option's declaration changed)" in err, err


def test_every_option_is_documented() -> None:
    for field in SERVE:
        declared = about(field)
        assert declared.doc and "\n\n" not in declared.doc, field.name  # one paragraph
        assert declared.flag is None or declared.flag.help, field.name
    docs = inspect.getsource(sys.modules["vrt._server.option_types"])
    for field in SERVE:
        assert f'    {field.name}: {field.type}\n    """' in docs, field.name  # its docstring


def test_the_options_type_check(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    """Typed for users under mypy strict: a right keyword passes, a wrong type or an unknown
    name fails, and an options dict typed ``vrt.ServerOptions`` can be spread."""
    use = tmp_path / "use.py"
    use.write_text(
        "import vrt\nimport vrt.asgi\n\n\n"
        "async def main(agent: vrt.Agent) -> None:\n"
        "    await vrt.serve(agent, '127.0.0.1', 0, max_sessions=5, store=None)\n"
        "    options: vrt.ServerOptions = {'resume_window': 0, 'allowed_origins': ['x']}\n"
        "    await vrt.serve(agent, **options)\n"
        "    vrt.asgi.app(agent, max_sessions=5)\n"
        "    await vrt.serve(agent, max_sessions='x')  # line 10\n"
        "    await vrt.serve(agent, max_sesions=5)  # line 11\n"
        "    vrt.asgi.app(agent, relay_host='x')  # line 12\n"
    )
    cache = getattr(pytestconfig, "cache", None)  # pytest's cache keeps mypy's across runs
    folder = cache.mkdir("mypy") if cache is not None else tmp_path
    # A process of its own: mypy raises the recursion limit of the process it runs in
    # (which then parses JSON nested deeper than a server would: tests/test_wire_errors.py).
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(folder), str(use)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out, status = done.stdout, done.returncode
    errors = sorted(int(n) for n in re.findall(r"use\.py:(\d+): error", out))
    assert (status, errors) == (1, [10, 11, 12]), out
    assert 'Argument "max_sessions" to "serve" has incompatible type "str"' in out, out


# -- vrt.serve and vrt.asgi.app read them ---------------------------------------------------------


def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(
        TypeError,
        match=re.escape(
            "serve() got an unexpected keyword argument 'max_sesions' "
            "(did you mean 'max_sessions'?)"
        ),
    ):
        trio.run(lambda: vrt.serve(AGENT, port=0, max_sesions=1))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"serve\(\) got an unexpected keyword argument 'x'$"):
        trio.run(lambda: vrt.serve(AGENT, port=0, x=1))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"app\(\) got an unexpected keyword argument 'colour'"):
        vrt.asgi.app(AGENT, colour=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"'relay_host' \(vrt\.serve's only"):
        vrt.asgi.app(AGENT, relay_host="10.0.0.1")  # type: ignore[call-arg]


def test_inspect_shows_every_option_with_its_default() -> None:
    for function, fields in ((vrt.serve, SERVE), (vrt.asgi.app, APP)):
        parameters = inspect.signature(function).parameters
        for field in fields:
            parameter = parameters[field.name]
            assert parameter.kind is parameter.KEYWORD_ONLY, field.name
            assert parameter.default == field.default, field.name
    assert list(inspect.signature(vrt.serve).parameters)[:4] == [
        "agent",
        "host",
        "port",
        "task_status",
    ]


def test_a_value_goes_through_its_check() -> None:
    options = vrt.asgi.app(AGENT, allowed_origins=["https://a.example"], resume_window=5).options
    assert options.allowed_origins == frozenset({"https://a.example"})
    assert options.resume_window == 5.0 and isinstance(options.resume_window, float)
    assert options.max_sessions == 1000  # the declared default
    with pytest.raises(ValueError, match=r"replay_limit_bytes \(4096\) must be at least twice"):
        vrt.asgi.app(AGENT, replay_limit_bytes=4096, max_message_size=4096)
    with pytest.raises(ValueError, match="drain_timeout must not be negative, not -1"):
        trio.run(lambda: vrt.serve(AGENT, port=0, drain_timeout=-1))


async def test_serve_on_sockets_it_is_given() -> None:
    """``sockets=``: listening sockets someone else bound (``vrt serve --workers``: the
    parent's); the server serves on them, not on ``host:port``, and refuses a socket that
    does not listen."""
    with socket.socket() as given:
        given.bind(("127.0.0.1", 0))
        given.listen()
        port = given.getsockname()[1]
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                functools.partial(vrt.serve, AGENT, "127.0.0.1", 1, sockets=[given])
            )
            assert server.port == port
            async with vrt.connect(server.url) as client:
                assert client.session_id
            nursery.cancel_scope.cancel()
    with socket.socket() as quiet:
        quiet.bind(("127.0.0.1", 0))
        with pytest.raises(ValueError, match="not a listening TCP socket"):
            await vrt.serve(AGENT, sockets=[quiet])
    with pytest.raises(ValueError, match="a list of listening sockets"):
        await vrt.serve(AGENT, sockets=5)  # type: ignore[typeddict-item]


# -- vrt serve's flags ----------------------------------------------------------------------------

FLAGS_BEFORE = {
    "--host", "--port", "--log-level", "--certfile", "--keyfile", "--workers",
    "--resume-window", "--handshake-timeout", "--max-pending-connections",
    "--max-pending-per-peer", "--max-sessions", "--max-sessions-per-peer",
    "--first-turn-timeout", "--max-open-calls", "--max-queued-app-calls",
    "--max-messages-per-second", "--replay-limit", "--replay-limit-bytes",
    "--max-message-size", "--max-history-bytes", "--allowed-origin", "--web", "--metrics",
    "--store", "--node", "--drain-timeout", "--relay-host",
}  # fmt: skip
"""``vrt serve``'s flags before the options were declared once: every one stays."""


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_every_declared_flag_is_in_vrt_serve_help_with_its_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(capsys)
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)) >= FLAGS_BEFORE
    for field in flagged():
        declared = about(field)
        flag = declared.flag
        assert flag is not None
        name = declared.flag_name(field.name)
        if isinstance(field.default, bool):
            entry = f"{name} {flag.help}"
        else:
            entry = f"{name} {flag.metavar or field.name.upper()} {flag.help}"
            if field.default is not None and not flag.repeat:
                entry += f" (default: {field.default})"
        assert entry in text, (entry, text)
    args = _parser().parse_args(["serve"])
    assert option_values(args) == {field.name: field.default for field in flagged()}


REPEATED = {
    "allowed_origins": ["https://a.example", "https://b.example"],
    "trusted_proxies": ["10.0.0.0/8", "192.168.0.0/16,fd00::/8"],
}
"""Two values of each repeated flag (a new one needs its own here)."""


def _every_option_set() -> tuple[list[str], dict[str, Any]]:
    """A ``vrt serve`` command line that gives every flagged option a value other than its
    default (made from the declarations: a new option is tested too), and those values."""
    argv: list[str] = []
    values: dict[str, Any] = {}
    for field in flagged():
        declared = about(field)
        assert declared.flag is not None
        name = declared.flag_name(field.name)
        default = field.default
        if isinstance(default, bool):
            argv.append(name)
            values[field.name] = True
        elif declared.flag.repeat:
            for item in REPEATED[field.name]:
                argv += [name, item]
            values[field.name] = REPEATED[field.name]
        else:
            value = f"{field.name}-value" if default is None else default + 3
            argv += [name, str(value)]
            values[field.name] = value
    return argv, values


def test_vrt_serve_passes_every_option_to_vrt_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.delenv("VRT_CLUSTER_SECRET", raising=False)  # (--cluster-secret sets it)

    def serve(agent: vrt.Agent, host: str, port: int, label: str, **options: Any) -> int:
        seen.update(options, host=host, port=port)
        return 0

    monkeypatch.setattr("vrt._cli.commands._serve_until_interrupted", serve)
    monkeypatch.setattr("vrt._cli.commands.install_prometheus", lambda: None)  # process-wide
    monkeypatch.setattr("vrt._cli.commands.logging.basicConfig", lambda **kwargs: None)
    argv, values = _every_option_set()
    assert main(["serve", "tests.serve_agent:agent", "--port", "0", *argv]) == 0
    for name, value in values.items():
        assert seen[name] == value, name
    assert "sockets" not in seen and seen["ssl_context"] is None and seen["parent"] is None


def test_a_workers_command_line_carries_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """``vrt serve --workers N`` starts each worker with every option it was given (the
    node's name gets the worker's index), the port, its index, the parent's listening
    sockets and its link to the parent; a secret in its environment variable, never on its
    command line (which ``ps`` shows)."""
    monkeypatch.delenv("VRT_CLUSTER_SECRET", raising=False)
    argv, values = _every_option_set()
    flags = ["--host", "0.0.0.0", "--log-level", "debug", "--workers", "3"]
    flags += ["--certfile", "cert.pem", "--keyfile", "key.pem"]
    args = _parser().parse_args(["serve", "tests.serve_agent:agent", *argv, *flags])
    command = worker_command(args, 4567, 2, [5, 6], 7)
    assert command[:4] == [sys.executable, "-m", "vrt", "serve"]
    worker = _parser().parse_args(command[3:])
    expected = {**vars(args), "port": 4567, "worker_index": 2, "workers": 1}
    expected |= {"listen_fd": [5, 6], "supervisor_fd": 7}
    expected["node"] = f"{values['node']}:2"
    assert vars(worker) == expected
    for name, value in values.items():
        if name != "node":
            assert getattr(worker, name) == value, name
    secret = values["cluster_secret"]
    assert secret not in command and os.environ["VRT_CLUSTER_SECRET"] == secret


def test_a_worker_keeps_the_defaults() -> None:
    args = _parser().parse_args(["serve", "m:a", "--workers", "2", "--store", "redis://h:1"])
    command = worker_command(args, 80, 0, [3], 4)
    assert _parser().parse_args(command[3:]) == argparse.Namespace(
        **{**vars(args), "port": 80, "worker_index": 0, "workers": 1}
        | {"listen_fd": [3], "supervisor_fd": 4}
    )
    assert "--node" not in command  # host:pid:0, the worker's own
