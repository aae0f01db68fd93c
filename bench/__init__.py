"""vrt's benchmarks: tools that measure, each run from the repository's root as
``python -m bench.NAME`` (``--help`` for its knobs, ``--quick`` for a smoke run where it
has one). bench/README.md says what each measures, how to run it, and its current figures.

The shared parts: :mod:`bench.harness` (the machine, its processes, redis and ``vrt serve``
started for a run), :mod:`bench.fleet` (the clients of a served run), :mod:`bench.windows`
(configurations measured in interleaved windows) and :mod:`bench.agents` (the agents the
servers run). Nothing here imports the tests, and the tests import nothing from here.

This module imports nothing: ``python -m bench.tracing`` must install the OpenTelemetry SDK
before vrt is first imported.
"""
