"""OpenTelemetry spans for resolve and for each attempt; the W3C ``traceparent`` sent to agents carries the
attempt span's context, so agents continue the caller's trace.

Off by default: without a configured SDK the API is a no-op. ``REACH_OTEL_EXPORTER=console`` prints spans;
``otlp`` sends them to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (needs opentelemetry-exporter-otlp installed)."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

tracer = trace.get_tracer("agent-reach")
propagator = TraceContextTextMapPropagator()


def configure_from_env() -> None:
    exporter_name = os.environ.get("REACH_OTEL_EXPORTER", "").strip().lower()
    if not exporter_name:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        raise ValueError(f"REACH_OTEL_EXPORTER must be 'console' or 'otlp', not '{exporter_name}'")
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-reach"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def parent_context(traceparent: str):
    """The caller's context from an incoming ``traceparent`` (None when absent or malformed)."""
    if not traceparent:
        return None
    return propagator.extract({"traceparent": traceparent})


def current_traceparent() -> str:
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    return carrier.get("traceparent", "")
