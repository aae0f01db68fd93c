"""What a hostile session costs the server: memory per attacking session, and how it ends.

Run it as ``python -m bench.hostile`` (``--quick`` for a smoke run). Each attack runs
against a fresh in-process ``vrt.serve`` (its defaults, but ``max_sessions_per_peer``:
every attacker comes from 127.0.0.1) from raw sockets on loopback, ``--sessions`` at once,
for ``--seconds``, or ``--held-seconds`` for the two that the server holds until they
stall (it closes a session held 30 s without progress: ``vrt.serve``'s docstring):

- ``blind-ack`` (held): hello, a long answer asked for, then acks on a ramp, never reading;
- ``no-read`` (held): the same without acks;
- ``unfinished``: hello, then a frame declared 4 MiB of which 1 MiB - 1 KiB is sent;
- ``big-inputs``: 1 MiB inputs as fast as the rate limit reads them (each a barge-in);
- ``big-args``: the model streams a call of 120 KiB arguments in 1,000 deltas to a
  client that never reads (previews, arguments-complete, the app call).

It prints, per attack: Python heap growth at its peak per session (tracemalloc, the
server's and this process's raw sockets alike; the attackers hold little), RSS growth per
session, and what happened to the sessions (closed and why, or still held).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

import vrt
from bench.harness import HOST, version, vrt_from

HELD = frozenset({"blind-ack", "no-read"})
"""The attacks the server holds (the model paused) until they stall: they last
``--held-seconds``, past vrt.serve's 30 s without progress, to see the session closed."""


# -- a raw peer: the upgrade and client frames by hand -------------------------------------------

UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def ws_frame(payload: bytes, *, declared: int | None = None) -> bytes:
    """A client text frame (zero mask: valid, and no cost to mask megabytes); ``declared``
    announces more payload than is given (an unfinished frame)."""
    n = len(payload) if declared is None else declared
    head = bytes([0x81])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


def message(type_: str, seq: int, **fields: Any) -> bytes:
    return ws_frame(json.dumps({"type": type_, "seq": seq, **fields}).encode())


HELLO = message("hello", 1, protocol="vrt/1", capabilities=["tool-stream-v1"], tools=[])


async def raw_upgraded(port: int) -> trio.SocketStream:
    """A TCP connection past its WebSocket upgrade (the 101 read, nothing else)."""
    stream = await trio.open_tcp_stream(HOST, port)
    await stream.send_all(UPGRADE)
    data = b""
    with trio.fail_after(5):
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise RuntimeError(f"closed during the upgrade: {data!r}")
            data += chunk
    if not data.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"upgrade refused: {data[:80]!r}")
    return stream


# -- the attacks ---------------------------------------------------------------------------------


class Long:
    """A long answer, 1 KiB a delta."""

    async def stream(self, request: vrt.ModelRequest) -> AsyncIterator[Any]:
        for _ in range(200_000):
            yield vrt.models.Text(text="z" * 1024)


class BigArgs:
    """A call of 120 KiB arguments in 1,000 deltas, then nothing."""

    async def stream(self, request: vrt.ModelRequest) -> AsyncIterator[Any]:
        if request.step > 1:
            return
        text = json.dumps({"text": "p" * (120 << 10)})
        call_id = f"{request.turn_id}_c"
        yield vrt.models.CallStart(call_id=call_id, name="echo")
        size = len(text) // 1000 + 1
        for start in range(0, len(text), size):
            yield vrt.models.CallDelta(call_id=call_id, delta=text[start : start + size])
        yield vrt.models.CallEnd(call_id=call_id)


ECHO = [{"name": "echo", "description": "", "parameters": {"type": "object"}}]


async def blind_ack(stream: trio.SocketStream) -> None:
    await stream.send_all(HELLO + message("input", 2, text="long"))
    for k in range(1, 10**6):
        await stream.send_all(ws_frame(json.dumps({"type": "ack", "seq": 40 * k}).encode()))
        await trio.sleep(0.05)


async def no_read(stream: trio.SocketStream) -> None:
    await stream.send_all(HELLO + message("input", 2, text="long"))
    await trio.sleep_forever()


BODY = b"a" * ((1 << 20) - 1024)
"""Shared by every attacker, allocated before the measurement: the heap growth is the
server's, not the attackers' own copies."""


async def send_parts(stream: trio.SocketStream, *parts: bytes, declared: int | None = None) -> None:
    """One text frame of ``parts`` (their total, or ``declared``), sent piece by piece."""
    head = ws_frame(b"", declared=declared if declared is not None else sum(map(len, parts)))
    await stream.send_all(head)
    for part in parts:
        await stream.send_all(part)


async def unfinished(stream: trio.SocketStream) -> None:
    await stream.send_all(HELLO)
    await send_parts(stream, b'{"type":"input","seq":2,"text":"', BODY, declared=4 << 20)
    await trio.sleep_forever()


async def big_inputs(stream: trio.SocketStream) -> None:
    await stream.send_all(HELLO)
    for seq in range(2, 10**6):
        await send_parts(stream, b'{"type":"input","seq":%d,"text":"' % seq, BODY, b'"}')


async def big_args(stream: trio.SocketStream) -> None:
    hello = message("hello", 1, protocol="vrt/1", capabilities=["tool-stream-v1"], tools=ECHO)
    await stream.send_all(hello + message("input", 2, text="go"))
    await trio.sleep_forever()


ATTACKS: dict[str, tuple[Callable[[trio.SocketStream], Awaitable[None]], Any]] = {
    "blind-ack": (blind_ack, Long),
    "no-read": (no_read, Long),
    "unfinished": (unfinished, None),
    "big-inputs": (big_inputs, None),
    "big-args": (big_args, BigArgs),
}


async def ended(stream: trio.SocketStream) -> str:
    """Whether the server closed ``stream`` (reading what is left, for up to 2 s)."""
    with trio.move_on_after(2):
        try:
            while await stream.receive_some(1 << 16):
                pass
        except trio.BrokenResourceError:
            return "reset by the server"
        return "closed by the server"
    return "still open"


def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def attack(name: str, sessions: int, seconds: float) -> dict[str, Any]:
    run, model_class = ATTACKS[name]
    model = model_class() if model_class else vrt.ScriptedModel([[vrt.say("ok")]] * 10**6)
    agent = vrt.define_agent(model=model, client_tools="accept")
    outcome: dict[str, int] = {}
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(vrt.serve, agent, "127.0.0.1", 0, max_sessions_per_peer=1000)
        )
        rss_before = rss()
        tracemalloc.start()
        base, _ = tracemalloc.get_traced_memory()

        async def one() -> None:
            stream = await raw_upgraded(server.port)
            with trio.move_on_after(seconds):
                try:
                    await run(stream)
                except trio.BrokenResourceError:
                    pass  # the server dropped it
            verdict = await ended(stream)
            outcome[verdict] = outcome.get(verdict, 0) + 1
            await stream.aclose()

        async with trio.open_nursery() as attackers:
            for _ in range(sessions):
                attackers.start_soon(one)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss_after = rss()
        nursery.cancel_scope.cancel()
    return {
        "heap": (peak - base) / sessions,
        "rss": (rss_after - rss_before) / sessions,
        "outcome": outcome,
    }


async def main(args: argparse.Namespace) -> None:
    print(
        f"python -m bench.hostile: vrt {vrt.__version__}, trio {version('trio')}, "
        f"{args.sessions} sessions per attack, {args.seconds:g} s each ({', '.join(sorted(HELD))}"
        f": {args.held_seconds:g} s), pid {os.getpid()}\n{vrt_from()}"
    )
    print(f"{'attack':<12} {'heap peak / session':>20} {'RSS / session':>15}  outcome")
    for name in args.attacks or ATTACKS:
        seconds = args.held_seconds if name in HELD else args.seconds
        got = await attack(name, args.sessions, seconds)
        print(
            f"{name:<12} {got['heap'] / 2**20:>17.2f} MiB {got['rss'] / 2**20:>11.2f} MiB  "
            + ", ".join(f"{k}: {v}" for k, v in sorted(got["outcome"].items()))
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10, help="attackers at once (10)")
    parser.add_argument("--seconds", type=float, default=8.0, help="each attack's length (8 s)")
    parser.add_argument(
        "--held-seconds",
        type=float,
        default=36.0,
        help="blind-ack's and no-read's: past the server's 30 s stall (36 s)",
    )
    parser.add_argument("--quick", action="store_true", help="2 sessions, 2 s each (all)")
    parser.add_argument("attacks", nargs="*", choices=[*ATTACKS, []], metavar="ATTACK")
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.seconds, args.held_seconds = 2, 2.0, 2.0
    return args


if __name__ == "__main__":
    trio.run(main, parse())
