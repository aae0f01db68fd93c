"""Voice sessions: the server's CPU per session-second of audio-v1, against a bare relay.

Run it as ``python -m bench.audio`` from the repository's root (``--sessions 10,50``,
``--seconds 20``; ``--quick`` for a smoke run; ``--profile`` for cProfile of the vrt
server). Four kinds of process, so each is measured alone:

- **the model**: :class:`vrt.testing.FakeRealtime` (``api="openai"``) in a process of its
  own (``--role fake``), its CPU not counted: every response says ``--words`` words (60 ms
  of a 400 Hz tone a word, in chunks of 20 ms: 33 words is 2 s of voice), paced at about
  real time (``delay`` 15 ms before each message: a word is a transcript delta and three
  audio deltas); it hears the user with its energy detector (100 ms loud: speech started;
  500 ms of silence: stopped, and it answers).
- **vrt** (``--role vrt``): ``vrt.serve`` of an agent on ``vrt.models.OpenAIRealtime``
  pointed at the fake: each session a vrt/1 connection with ``audio-v1`` and its own
  upstream WebSocket; the client's binary frames go up as ``input_audio_buffer.append``
  (base64 in JSON), the model's ``response.output_audio.delta`` come down as binary
  frames between ``audio.start`` and ``audio.end``, with transcripts and the turn's
  messages (acked, replayable) as vrt sends them.
- **the relay** (``--role relay``), the baseline: a bare trio-websocket server that, per
  client connection, opens a WebSocket to the same fake and relays, nothing else: each
  binary frame from the client up as ``input_audio_buffer.append`` (base64 in JSON, as
  the real API wants it), and of what comes down, each ``response.output_audio.delta``
  decoded from base64 and sent to the client as a binary frame (every other event parsed
  and dropped). The least any voice relay to a realtime API does.
- **the clients** (this process): ``--sessions`` sessions, each sending 20 ms frames of
  PCM16 at 24 kHz on a real-time clock (absolute deadlines): 300 ms of the fake's tone
  every 5 s (a turn), silence the rest; each reads everything that comes down. Against
  vrt each is a ``vrt.connect(url, audio=True)`` client (``send_audio``, ``AudioDelta``
  events); against the relay, a raw trio-websocket connection. Sessions start spread over
  the 5 s, so turns do not come in step.

For each session count, relay first then vrt (``--rounds`` alternates the order): the
sessions connect, 2 s to settle, then a window of ``--seconds`` in which the server
process's CPU (utime + stime from /proc) is read at both ends; the figure is CPU seconds
per session-second (the window times the sessions), its ratio vrt / relay (target at most
1.3x), and sessions per core (1 / that figure). The table also gives the audio each way
per session-second as the clients counted it (both servers must carry the same), the
turns the clients saw end (vrt) and the fake's and this process's CPU, for context.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import cProfile
import functools
import json
import logging
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel
import trio_websocket

import vrt
from bench.harness import ROOT, cpu_seconds, machine_busy, stop, version, vrt_from

HOST = "127.0.0.1"
RATE = 24000
FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000  # 480
TURN_EVERY = 5.0
SPEAK_MS = 300
KEY = "sk-bench-audio-0123456789"
TARGET = 1.3
SETTLE = 2.0
WORDS = [33]
"""Words an answer (``--words``), for the real-time check of a window."""
SERVE_OPTIONS: dict[str, Any] = {
    "max_sessions": 100_000,
    "max_sessions_per_peer": 100_000,  # every session comes from 127.0.0.1
    "max_pending_per_peer": 256,
    "max_messages_per_second": 100_000,
}
"""vrt.serve's defaults but the per-peer and rate limits, as bench.harness.SERVE_FLAGS."""


# -- the processes measured, and the fake model --------------------------------------------------


async def role_fake(words: int, delay: float) -> None:
    from vrt.testing import FakeRealtime

    text = " ".join(f"word{i}" for i in range(words))
    steps = [[vrt.say(text)]] * 1_000_000
    async with FakeRealtime(steps, api="openai", chunk_ms=FRAME_MS, delay=delay) as fake:
        print(fake.url, flush=True)
        while True:
            await trio.sleep(1)
            fake.received.clear()  # it keeps every message: a run would hold them all


async def role_vrt(upstream: str) -> None:
    model = vrt.models.OpenAIRealtime(url=upstream, api_key=KEY)
    agent = vrt.define_agent(model=model)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(vrt.serve, agent, HOST, 0, **SERVE_OPTIONS))
        print(server.url, flush=True)


async def role_relay(upstream: str) -> None:
    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        client = await request.accept()
        headers = [(b"Authorization", f"Bearer {KEY}".encode())]
        try:
            async with trio_websocket.open_websocket_url(
                upstream + "?model=gpt-realtime", extra_headers=headers
            ) as model:
                async with trio.open_nursery() as nursery:

                    async def up() -> None:
                        while True:
                            frame = await client.get_message()
                            if isinstance(frame, bytes):
                                event = {
                                    "type": "input_audio_buffer.append",
                                    "audio": base64.b64encode(frame).decode(),
                                }
                                await model.send_message(json.dumps(event))

                    async def down() -> None:
                        while True:
                            event = json.loads(await model.get_message())
                            if event["type"] == "response.output_audio.delta":
                                await client.send_message(base64.b64decode(event["delta"]))

                    nursery.start_soon(up)
                    nursery.start_soon(down)
        except* trio_websocket.ConnectionClosed:  # the client left (or the model did)
            pass

    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(
                trio_websocket.serve_websocket,
                handler,
                HOST,
                0,
                ssl_context=None,
                max_message_size=1 << 20,
            )
        )
        print(f"ws://{HOST}:{server.port}/", flush=True)


def run_role(role: str, args: argparse.Namespace) -> None:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if role == "fake":
        main = functools.partial(role_fake, args.words, args.delay)
    else:
        main = functools.partial(role_vrt if role == "vrt" else role_relay, args.upstream)
    profile = cProfile.Profile() if args.profile_to else None
    try:
        if profile is not None:
            profile.enable()
        trio.run(main)
    except* KeyboardInterrupt:  # SIGINT: the bench is done with this process
        pass
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile_to)


@contextlib.asynccontextmanager
async def process(folder: Path, label: str, *argv: str) -> AsyncIterator[tuple[int, str]]:
    """``python -m bench.audio ARGV`` from the root; its pid and the first line it prints."""
    command = [sys.executable, "-m", "bench.audio", *argv]
    log = folder / f"{label}-{time.strftime('%H%M%S')}.log"
    with log.open("wb") as err:
        proc = await trio.lowlevel.open_process(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=err
        )
        try:
            assert proc.stdout is not None
            line = b""
            with trio.fail_after(60):
                while not line.endswith(b"\n"):
                    chunk = await proc.stdout.receive_some(1)
                    if not chunk:
                        raise RuntimeError(f"{label} exited: {log.read_text()[-2000:]}")
                    line += chunk
            yield proc.pid, line.decode().strip()
        finally:
            await stop(proc)
            problems = [
                x for x in log.read_text(errors="replace").splitlines()
                if "Traceback" in x or " ERROR " in x or "Error" in x
            ]  # fmt: skip
            if problems:
                tail = "\n    ".join(log.read_text(errors="replace").splitlines()[-12:])
                print(f"  ! {label} logged {len(problems)} problem lines, the last:\n    {tail}")


# -- the clients ---------------------------------------------------------------------------------

SILENCE = b"\x00\x00" * FRAME_SAMPLES


def frames() -> list[bytes]:
    """The 5 s of one turn, in 20 ms frames: 300 ms of tone, then silence."""
    from vrt.testing._realtime_core import tone

    count = int(TURN_EVERY * 1000) // FRAME_MS
    loud = SPEAK_MS // FRAME_MS
    return [tone(i * FRAME_SAMPLES, FRAME_SAMPLES) if i < loud else SILENCE for i in range(count)]


@dataclass
class Counts:
    up: int = 0  # bytes of PCM sent
    down: int = 0  # bytes of PCM received
    turns: int = 0  # turns seen ended (vrt)

    def snapshot(self) -> tuple[int, int, int]:
        return self.up, self.down, self.turns


async def pace(send: Any, counts: Counts, offset: float) -> None:
    """``send`` each 20 ms frame at its time, the turn's tone ``offset`` s into each 5 s."""
    cycle = frames()
    shift = int(offset * 1000) // FRAME_MS
    start = trio.current_time()
    k = 0
    while True:
        await trio.sleep_until(start + k * FRAME_MS / 1000)
        frame = cycle[(k - shift) % len(cycle)]
        await send(frame)
        counts.up += len(frame)
        k += 1


async def vrt_session(url: str, counts: Counts, offset: float, ready: Any) -> None:
    async with vrt.connect(url, audio=True) as client:
        assert client.audio is not None, "the server did not offer audio-v1"
        async with client.subscribe() as events:

            async def send(frame: bytes) -> None:
                client.send_audio(frame)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pace, send, counts, offset)
                ready()
                async for event in events:
                    if isinstance(event, vrt.AudioDelta):
                        counts.down += len(event.pcm)
                    elif isinstance(event, vrt.TurnEnded):
                        counts.turns += 1


async def relay_session(url: str, counts: Counts, offset: float, ready: Any) -> None:
    async with trio_websocket.open_websocket_url(url) as ws:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pace, ws.send_message, counts, offset)
            ready()
            while True:
                frame = await ws.get_message()
                if isinstance(frame, bytes):
                    counts.down += len(frame)


@dataclass
class Window:
    kind: str
    sessions: int
    seconds: float
    server_cpu: float
    fake_cpu: float
    load_cpu: float
    busy: float
    up: int
    down: int
    turns: int
    failed: int

    def real_time(self, words: int) -> bool:
        """Did the window carry the audio it offered? Up within 10% of the clients'
        clock, down at least 3/4 of the fake's answers: else the machine was overloaded
        (the clients or the fake fell behind) and the CPU figure means less work."""
        per = self.sessions * self.seconds
        down = words * 60 * RATE * 2 / 1000 / TURN_EVERY
        return self.up / per >= 0.9 * RATE * 2 and self.down / per >= 0.75 * down

    @property
    def per_session_second(self) -> float:
        return self.server_cpu / (self.sessions * self.seconds)


async def measure(
    kind: str, url: str, server_pid: int, fake_pid: int, sessions: int, seconds: float
) -> Window:
    counts = [Counts() for _ in range(sessions)]
    failed: list[str] = []
    session = vrt_session if kind == "vrt" else relay_session
    connected = 0

    def sample() -> tuple[float, float, float, float]:
        """CPU seconds of the server, the fake and this process; the machine's busy time."""
        return cpu_seconds(server_pid), cpu_seconds(fake_pid), time.process_time(), machine_busy()

    def ready() -> None:
        nonlocal connected
        connected += 1

    async def one(i: int) -> None:
        try:
            await session(url, counts[i], random.uniform(0, TURN_EVERY), ready)
        except Exception as exc:  # counted and shown
            failed.append(f"{type(exc).__name__}: {exc}"[:200])

    async with trio.open_nursery() as nursery:
        for i in range(sessions):
            nursery.start_soon(one, i)
            if i % 10 == 9:
                await trio.sleep(0.05)
        with trio.fail_after(60):
            while connected + len(failed) < sessions:  # noqa: ASYNC110
                await trio.sleep(0.05)
        await trio.sleep(SETTLE)
        before = [c.snapshot() for c in counts]
        s0, f0, l0, b0 = sample()
        w0 = time.perf_counter()
        await trio.sleep(seconds)
        wall = time.perf_counter() - w0
        s1, f1, l1, b1 = sample()
        after = [c.snapshot() for c in counts]
        nursery.cancel_scope.cancel()
    for line in failed[:3]:
        print(f"  ! a {kind} session failed: {line}")
    return Window(
        kind=kind,
        sessions=sessions,
        seconds=wall,
        server_cpu=s1 - s0,
        fake_cpu=f1 - f0,
        load_cpu=l1 - l0,
        busy=b1 - b0,
        up=sum(a[0] - b[0] for a, b in zip(after, before, strict=True)),
        down=sum(a[1] - b[1] for a, b in zip(after, before, strict=True)),
        turns=sum(a[2] - b[2] for a, b in zip(after, before, strict=True)),
        failed=len(failed),
    )


async def run(args: argparse.Namespace) -> list[Window]:
    windows: list[Window] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.logs or tmp)
        async with process(
            folder, "fake", "--role", "fake", "--words", str(args.words), "--delay", str(args.delay)
        ) as (fake_pid, fake_url):
            for round_ in range(args.rounds):
                kinds = list(args.kinds) if round_ % 2 == 0 else list(reversed(args.kinds))
                for sessions in args.sessions:
                    for kind in kinds:
                        extra: list[str] = []
                        profile = None
                        if args.profile and sessions == max(args.sessions):
                            profile = folder / f"{kind}.prof"
                            extra = ["--profile-to", str(profile)]
                        async with process(
                            folder, kind, "--role", kind, "--upstream", fake_url, *extra
                        ) as (pid, url):
                            window = await measure(kind, url, pid, fake_pid, sessions, args.seconds)
                        windows.append(window)
                        show_window(window)
                        if profile is not None and profile.exists():
                            print(f"  cProfile of the {kind} server, {sessions} sessions:")
                            by_package(pstats.Stats(str(profile)))
    return windows


def by_package(stats: pstats.Stats) -> None:
    """The profile's own time (tottime) summed by package (vrt by subpackage), busy time
    only: epoll's wait is the process idle."""
    found: Counter[str] = Counter()
    for (path, _, name), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "poll' of 'select.epoll" in name:
            key = "(idle: epoll wait)"
        elif "/bench/" in path:
            key = "bench (the relay's own code)"
        elif "/vrt/" in path:
            key = "vrt/" + path.split("/vrt/")[1].split("/")[0]
        elif "site-packages/" in path:
            key = path.split("site-packages/")[1].split("/")[0]
        elif path == "~":
            key = name.split(" of ")[0].strip("<>")[:40]
        else:
            key = "stdlib " + Path(path).name
        found[key] += own
    idle = found.pop("(idle: epoll wait)", 0.0)
    busy = sum(found.values())
    print(f"    busy {busy:.2f} s (idle {idle:.2f} s), own time by package:")
    for key, own in found.most_common(12):
        print(f"    {own:7.2f} s {100 * own / busy:5.1f} %  {key}")


# -- the figures ---------------------------------------------------------------------------------


def show_window(w: Window) -> None:
    per = w.sessions * w.seconds
    print(
        f"  {w.kind:<5} {w.sessions:>4} sessions {w.seconds:5.1f} s:"
        f" server {w.server_cpu:6.2f} s CPU"
        f" = {w.per_session_second * 1e3:6.2f} ms per session-second;"
        f" audio up {w.up / per / 1e3:5.1f} kB/s, down {w.down / per / 1e3:5.1f} kB/s a session;"
        f" turns {w.turns}; fake {w.fake_cpu:5.2f} s, clients {w.load_cpu:5.2f} s,"
        f" machine {w.busy / w.seconds:4.2f} cores; failed {w.failed}"
        + ("" if w.real_time(WORDS[0]) else "; NOT REAL TIME (overloaded)"),
        flush=True,
    )


def table(windows: list[Window], words: int) -> None:
    if {w.kind for w in windows} != {"relay", "vrt"}:
        return  # --kinds with one of them: the windows above are all there is
    print()
    print(
        "| sessions | relay ms CPU / session-s | vrt ms CPU / session-s | vrt / relay |"
        " sessions a core: relay, vrt | audio down kB/s a session: relay, vrt | vrt turns |"
    )
    print("|---|---|---|---|---|---|---|")
    for sessions in sorted({w.sessions for w in windows}):
        mine = [w for w in windows if w.sessions == sessions]

        def total(kind: str, mine: list[Window] = mine) -> tuple[float, float, float, int]:
            ws = [w for w in mine if w.kind == kind]
            cpu = sum(w.server_cpu for w in ws)
            session_seconds = sum(w.sessions * w.seconds for w in ws)
            down = sum(w.down for w in ws)
            return (
                cpu / session_seconds,
                down / session_seconds,
                session_seconds,
                sum(w.turns for w in ws),
            )

        relay, relay_down, _, _ = total("relay")
        mine_vrt, vrt_down, _, turns = total("vrt")
        ratio = mine_vrt / relay if relay else float("inf")
        ok = all(w.real_time(words) for w in mine)
        mark = ("PASS" if ratio <= TARGET else "**MISS**") if ok else "n/a: not real time"
        print(
            f"| {sessions} | {relay * 1e3:.2f} | {mine_vrt * 1e3:.2f} |"
            f" {ratio:.2f}x: {mark} |"
            f" {1 / relay:,.0f}, {1 / mine_vrt:,.0f} |"
            f" {relay_down / 1e3:.1f}, {vrt_down / 1e3:.1f} | {turns} |"
        )
    print(
        f"\ntarget: vrt / relay at most {TARGET}x; sessions a core = 1 / CPU per session-second;"
        " a row whose windows fell behind real time (the machine overloaded) has no verdict"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", default="10,25", help="session counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (order reversed every other)")
    parser.add_argument("--words", type=int, default=33, help="words an answer (60 ms each)")
    parser.add_argument("--delay", type=float, default=0.015, help="the fake's pace, s a message")
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 sessions, 5 s")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile each server (the largest count), by package",
    )
    parser.add_argument("--kinds", default="relay,vrt", help="the servers, in this order")
    parser.add_argument("--logs", help="keep the processes' logs in this folder")
    parser.add_argument("--role", choices=["fake", "vrt", "relay"], help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    WORDS[0] = args.words
    if args.role:
        run_role(args.role, args)
        return
    if args.quick:
        args.sessions, args.seconds = "5", 5.0
    args.sessions = [int(x) for x in str(args.sessions).split(",")]
    args.kinds = args.kinds.split(",")
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)
    print(
        f"audio-v1: {args.sessions} sessions, {args.seconds:g} s windows, 24 kHz 20 ms frames both"
        f" ways, a turn every {TURN_EVERY:g} s ({args.words * 60} ms answers); {vrt_from()};"
        f" trio-websocket {version('trio-websocket')}, pid {os.getpid()}"
    )
    start = time.perf_counter()
    windows = trio.run(run, args)
    table(windows, args.words)
    print(f"wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
