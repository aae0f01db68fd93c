"""A long fuzzing run outside pytest: ``python -m tests.fuzzing`` (``--quick``, ``--seed``,
``--oracle``, ``--help``). It prints every outcome counted, cases per second, what escaped
or broke a check (both should be 0), and exits with status 1 if anything did."""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata

from tests.fuzzing.drivers import (
    ClientDriver,
    Driver,
    Escaped,
    Hung,
    ServerDriver,
    Violation,
    client_sequence,
    server_sequence,
    short,
)
from tests.fuzzing.frames import CLIENT_OFFERS, SERVER_SUPPORTS, Frames, RandomChooser
from vrt._wire.server import MAX_MESSAGE_SIZE

SLOW = 0.1
"""A frame that takes longer than this many seconds is counted as slow."""


def version(name: str) -> str:
    """The installed version of distribution ``name``, or ``?``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Tally:
    """The outcomes of one core's run."""

    core: str
    outcomes: Counter[str] = field(default_factory=Counter)
    cases: int = 0
    sequences: int = 0
    probes: int = 0
    slow: int = 0
    slowest: float = 0.0
    slowest_frame: str = ""
    failures: list[str] = field(default_factory=list)
    quirks: Counter[str] = field(default_factory=Counter)
    wall: float = 0.0
    sessions: Counter[str] = field(default_factory=Counter)
    """Sequences welcomed, and with which capabilities."""
    batches: int = 0
    items: Counter[str] = field(default_factory=Counter)
    """The outcome of each message of the batches read, as if it had come alone."""

    @property
    def escaped(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k.startswith("escaped"))

    @property
    def broken(self) -> int:
        return self.outcomes["broken check"]


def run(
    core: str,
    cases: int,
    seed: int,
    max_message_size: int,
    *,
    oracle: bool,
    hang: float,
    verbose: bool,
) -> Tally:
    """Sequences, each to a fresh core (``server`` or ``client``), until ``cases`` frames
    were delivered."""
    tally = Tally(core)
    rng = random.Random(f"{seed}:{core}")
    c = RandomChooser(rng)
    frames = Frames(c, max_message_size)
    started = time.perf_counter()
    while tally.cases < cases:
        tally.sequences += 1
        driver: ServerDriver | ClientDriver
        if core == "server":
            supports = c.pick(SERVER_SUPPORTS)
            driver = ServerDriver(max_message_size, capabilities=supports, oracle=oracle, hang=hang)
        else:
            driver = ClientDriver(capabilities=c.pick(CLIENT_OFFERS), oracle=oracle, hang=hang)

        def count(outcome: str, driver: Driver = driver) -> None:
            tally.cases += 1
            tally.outcomes[outcome] += 1
            if driver.elapsed > SLOW:
                tally.slow += 1
            if driver.elapsed > tally.slowest:
                tally.slowest = driver.elapsed
                tally.slowest_frame = f"{outcome}: {short(driver.last, 60)}"

        try:
            if isinstance(driver, ServerDriver):
                server_sequence(c, frames, driver, count)
            else:
                client_sequence(c, frames, driver, count)
            tally.probes += 1
        except (Violation, Escaped, Hung) as exc:
            label = (
                "broken check"
                if isinstance(exc, Violation)
                else f"escaped {type(exc.__cause__).__name__}"
                if isinstance(exc, Escaped)
                else "hung"
            )
            tally.cases += 1
            tally.outcomes[label] += 1
            if len(tally.failures) < 5 or verbose:
                where = ""
                if exc.__cause__ is not None:
                    tb = traceback.extract_tb(exc.__cause__.__traceback__)[-1]
                    where = f" (at {tb.filename.split('/vrt/')[-1]}:{tb.lineno})"
                tally.failures.append(f"{label}{where}: {exc}"[:600])
        tally.quirks += driver.quirks
        tally.batches += driver.batches
        tally.items += driver.items
        if driver.negotiated is not None:
            tally.sessions["welcomed"] += 1
            tally.sessions["batch-v1"] += driver.batching
            tally.sessions["local previews"] += driver.local_previews
    tally.wall = time.perf_counter() - started
    return tally


def report(args: argparse.Namespace, tallies: list[Tally]) -> None:
    for tally in tallies:
        rate = tally.cases / tally.wall if tally.wall else 0.0
        what = "ServerProtocol.receive" if tally.core == "server" else "ClientProtocol.receive"
        print(
            f"\n{tally.core} core ({what}): {tally.cases:,} cases in {tally.sequences:,} "
            f"sequences, {tally.wall:.1f} s, {rate:,.0f} cases/s"
        )
        width = max(len(k) for k in tally.outcomes)
        for outcome, n in sorted(tally.outcomes.items()):
            print(f"  {outcome:<{width}}  {n:>8,}  {n / tally.cases:6.1%}")
        print(f"  {'escaped exception':<{width}}  {tally.escaped:>8,}   (should be 0)")
        print(f"  {'broken check':<{width}}  {tally.broken:>8,}   (should be 0)")
        print(
            f"  {'slow (> 100 ms)':<{width}}  {tally.slow:>8,}   slowest "
            f"{tally.slowest * 1000:.1f} ms ({tally.slowest_frame})"
        )
        print(
            f"  still working after their sequence: {tally.probes:,} of "
            f"{tally.sequences:,} sequences"
        )
        sessions = tally.sessions
        print(
            f"  sessions welcomed: {sessions['welcomed']:,}, with batch-v1 "
            f"{sessions['batch-v1']:,}, with local previews (local-preview-v1 and "
            f"tool-stream-v1) {sessions['local previews']:,}"
        )
        items = sum(tally.items.values())
        print(
            f"  batches read: {tally.batches:,} frames, {items:,} messages in them, each as "
            f"if it had come alone:"
        )
        width = max((len(k) for k in tally.items), default=0)
        for outcome, n in sorted(tally.items.items()):
            print(f"    {outcome:<{width}}  {n:>8,}  {n / items:6.1%}")
        for quirk, n in tally.quirks.items():
            print(f"  known deviation, reported: {quirk} ({n:,} times)")
        for failure in tally.failures:
            print(f"  ! {failure}")


# -- main ----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Fuzz the sans-IO vrt/1 cores with generated and mutated frames."
    )
    add = parser.add_argument
    add("--cases", type=int, default=100_000, help="frames per core (100,000)")
    add("--seed", type=int, default=0, help="seed of random.Random (0)")
    add("--core", choices=("server", "client", "both"), default="both", help="(both)")
    add(
        "--max-message-size",
        type=int,
        default=MAX_MESSAGE_SIZE,
        help=f"the server core's limit, bytes ({MAX_MESSAGE_SIZE:,})",
    )
    add("--oracle", action="store_true", help="check every verdict against jsonschema (slower)")
    add("--hang", type=float, default=10.0, help="seconds after which a frame is hung (10)")
    add("--quick", action="store_true", help="a fast smoke run (2,000 cases per core)")
    add("-v", "--verbose", action="store_true", help="show every failure, not the first 5")
    args = parser.parse_args(argv)
    if args.quick:
        args.cases = 2_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print(
        f"vrt fuzz: Python {platform.python_version()}, jsonschema {version('jsonschema')}, "
        f"cattrs {version('cattrs')}, {platform.machine()}; seed {args.seed}, "
        f"{args.cases:,} cases per core, max_message_size {args.max_message_size:,}"
        f"{', oracle' if args.oracle else ''}"
    )
    cores = ("server", "client") if args.core == "both" else (args.core,)
    tallies = [
        run(
            core,
            args.cases,
            args.seed,
            args.max_message_size,
            oracle=args.oracle,
            hang=args.hang,
            verbose=args.verbose,
        )
        for core in cores
    ]
    report(args, tallies)
    return 1 if any(t.escaped or t.broken or t.outcomes["hung"] for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
