"""``GET /metrics``: the process's metrics in Prometheus' text format.

vrt records its metrics through ``opentelemetry-api`` (:mod:`vrt._engine.telemetry`); the
application installs the SDK with the Prometheus exporter's reader, which registers with
``prometheus_client``'s default registry, and ``vrt.serve(metrics=True)`` (``vrt serve
--metrics``) serves that registry on the HTTP front. Both come with ``trio-vrt[metrics]``.
"""

from __future__ import annotations

import importlib.util

INSTALL_HINT = "install trio-vrt[metrics] (opentelemetry-sdk, opentelemetry-exporter-prometheus)"


def available() -> bool:
    """Whether ``prometheus_client`` can be imported (``metrics=True`` needs it)."""
    return importlib.util.find_spec("prometheus_client") is not None


def exposition() -> tuple[bytes, str]:
    """The default registry in Prometheus' text format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
