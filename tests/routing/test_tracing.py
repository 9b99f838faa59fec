"""OpenTelemetry spans for resolve and each attempt, continuing the caller's W3C trace."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytestmark = pytest.mark.django_db(transaction=True)
_exporter = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_exporter))
    trace.set_tracer_provider(provider)
    return _exporter


def test_resolve_and_attempt_spans_join_the_callers_trace(api, running_agents, spans, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.01}
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", fail_rate=1.0, fail_status=503)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    spans.clear()
    api.post("/api/v1/invoke", {"capability": "order.query", "payload": {}, "request_id": "otel-1"}, format="json",
             HTTP_TRACEPARENT=f"00-{trace_id}-00f067aa0ba902b7-01")
    finished = spans.get_finished_spans()
    names = [s.name for s in finished]
    assert names.count("reach.resolve") == 1 and names.count("reach.attempt") == 3
    assert {format(s.context.trace_id, "032x") for s in finished} == {trace_id}
    attempts = [s for s in finished if s.name == "reach.attempt"]
    assert [s.attributes["reach.attempt"] for s in attempts] == [1, 2, 3]
    assert {s.attributes["reach.outcome"] for s in attempts} == {"server_error"}
