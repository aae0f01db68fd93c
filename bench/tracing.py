"""``vrt serve`` with the OpenTelemetry SDK installed first: the traced server of
``python -m bench.load --tracing`` (bench/README.md, "Tracing on against off").

``python -m bench.tracing MODE serve bench.agents:agent ...`` (from the repository's root),
MODE ``traces`` or ``traces+metrics``: before vrt is imported it sets, as the global providers,

- ``traces``: a ``TracerProvider`` with a ``BatchSpanProcessor`` (the SDK's defaults: a
  queue of 2,048 spans, batches of 512, every 5 s or when 512 wait) over an in-memory
  exporter (:class:`Exporter`, the SDK's ``InMemorySpanExporter``);
- ``metrics``: a ``MeterProvider`` with an ``InMemoryMetricReader`` (nothing collects
  until the process ends: the cost is the recording and aggregation alone),

then runs the ``vrt`` command line (``vrt._cli.main``) with the rest of its arguments, as
``python -m vrt`` would. The library is not changed. When the command returns (SIGINT: the
bench stops its servers so) the providers are shut down (the last spans exported) and one
line goes to stderr, ``vrt-bench-tracing {...}``: the spans exported by name's first word
(``invoke_agent``, ``chat``, ``execute_tool``), the ones the exporter still holds, and with
metrics the data points and a few sums (calls, turns recorded). bench/serving.py reads
it from the server's log.

The line also gives the CPU seconds of each of the process's threads by name (the batch
processor's worker is ``OtelBatchSpanRecordProcessor``). ``VRT_BENCH_PROFILE=FILE``
profiles the command's main thread with cProfile into ``FILE.MODE.pstats``; MODE ``off``
installs nothing (the same launcher, to profile the untraced server alike).

``VRT_BENCH_KEEP_SPANS=1`` keeps every span in the exporter until the end (a long run holds
hundreds of thousands, and the garbage collector walks them all); by default the exporter
counts each batch and then drops it, as an exporter that sends its batches away would.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

MARK = "vrt-bench-tracing "
"""The start of the line this launcher writes to stderr at the end."""

MODES = ("traces", "traces+metrics", "metrics", "sampled", "off")


class Exporter(InMemorySpanExporter):
    """The SDK's in-memory exporter, counting what it is given by the span name's first
    word; unless ``keep``, it drops each batch once counted (the BatchSpanProcessor's
    worker thread calls :meth:`export`)."""

    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.keep = keep
        self.by_name: Counter[str] = Counter()
        self.batches = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = super().export(spans)
        self.batches += 1
        for span in spans:
            self.by_name[span.name.partition(" ")[0]] += 1
        if not self.keep:
            self.clear()
        return result


def install(mode: str) -> tuple[Any, Exporter | None, Any, Any]:
    """Set the global providers for ``mode``: (tracer provider, exporter, meter provider,
    metric reader), None where the mode has none."""
    tracer_provider = exporter = meter_provider = reader = None
    if "traces" in mode or mode == "sampled":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        exporter = Exporter(keep=os.environ.get("VRT_BENCH_KEEP_SPANS") == "1")
        # sampled: what production usually runs, a tenth of the turns traced (the turn's
        # span decides, its children follow it)
        sampler = ParentBased(TraceIdRatioBased(0.1)) if mode == "sampled" else None
        tracer_provider = TracerProvider(sampler=sampler)
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
    if "metrics" in mode:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[reader])
        metrics.set_meter_provider(meter_provider)
    return tracer_provider, exporter, meter_provider, reader


def metric_summary(reader: Any) -> dict[str, Any]:
    """Data points per instrument, and the sums a sanity check needs."""
    points: dict[str, int] = {}
    sums: dict[str, float] = {}
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data is not None else ():
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                found = list(metric.data.data_points)
                points[metric.name] = len(found)
                if metric.name in ("vrt.tool.calls", "vrt.frames"):
                    sums[metric.name] = sum(p.value for p in found)
                elif metric.name in ("vrt.turn.duration", "vrt.tool.duration"):
                    sums[metric.name + " count"] = sum(p.count for p in found)
    return {"points": points, "sums": sums}


def threads_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads (``/proc/self/task``) by their Python name:
    the batch processor's worker thread is ``OtelBatchSpanRecordProcessor``."""
    import threading

    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    seconds: Counter[str] = Counter()
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        name = names.get(int(task), "other threads")
        fields = text[text.rindex(")") + 2 :].split()
        seconds[name] += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return {name: round(value, 2) for name, value in seconds.items()}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in MODES:
        print(f"usage: python -m bench.tracing {{{','.join(MODES)}}} serve ...", file=sys.stderr)
        return 2
    mode, rest = argv[0], argv[1:]
    tracer_provider, exporter, meter_provider, reader = install(mode)

    from vrt._cli import main as vrt_main  # after the providers: vrt's tracer is the SDK's

    profile_to = os.environ.get("VRT_BENCH_PROFILE")
    profiler = None
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        status = vrt_main(rest)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile_to}.{mode}.pstats")
        report: dict[str, Any] = {"mode": mode, "threads": threads_cpu()}
        if tracer_provider is not None and exporter is not None:
            tracer_provider.shutdown()  # the processor exports what it still queues
            report["spans"] = dict(exporter.by_name)
            report["batches"] = exporter.batches
            report["held"] = len(exporter.get_finished_spans())
        if meter_provider is not None:
            report["metrics"] = metric_summary(reader)
            meter_provider.shutdown()
        print(MARK + json.dumps(report), file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
