"""What ``vrt serve --metrics`` and ``vrt demo --web`` install: the OpenTelemetry SDK's
meter provider with a Prometheus reader (an application's choice; the library only
records through the API)."""

from __future__ import annotations

import os

from vrt._net.metrics import INSTALL_HINT


def install_prometheus() -> str | None:
    """Make the process's metrics readable at ``GET /metrics``: None once done, or why
    not (the ``metrics`` extra is missing)."""
    try:
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        return INSTALL_HINT
    resource = Resource.create(
        {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "vrt"}
    )
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()], resource=resource)
    metrics.set_meter_provider(provider)
    return None
