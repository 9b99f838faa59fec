"""Each reliability rule against real agent processes."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from routing import breaker
from routing.models import Attempt, Task
from routing.snapshot import redis_client
from tests.routing.conftest import instance_of

pytestmark = pytest.mark.django_db(transaction=True)
ORDER = {"capability": "order.query", "payload": {"order_id": "1"}}


def test_sync_invoke_succeeds_with_timeline(api, running_agents):
    agents = running_agents(["order-agent"])
    response = api.post("/api/v1/invoke", {"task": "where is my order 12345", "request_id": "r-ok"}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "succeeded" and body["agent"] == "order-agent"
    assert "order-agent handled order.query" in body["result"]["answer"]
    detail = api.get("/api/v1/tasks/r-ok").json()
    assert [e["to_status"] for e in detail["events"]] == ["pending", "routed", "running", "succeeded"]
    assert agents.stats("order-agent")["executions"]["r-ok"] == 1
    # the invoke answer is built without a serializer: it must say exactly what the serializer says
    from routing.api.serializers import TaskOutput

    task = Task.objects.get(request_id="r-ok")
    assert body == {k: v for k, v in TaskOutput(task).data.items()} == {k: detail[k] for k in body}


def test_slow_agent_hits_its_dynamic_timeout(api, running_agents, settings):
    settings.REACH = {**settings.REACH, "MIN_TIMEOUT_S": 0.3, "BACKOFF_BASE_S": 0.01}
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", latency_ms=1500)
    body = api.post("/api/v1/invoke", {**ORDER, "request_id": "r-slow"}, format="json").json()
    assert body["status"] == "failed"
    attempts = list(Attempt.objects.filter(task__request_id="r-slow"))
    assert attempts[0].outcome == "timeout" and attempts[0].latency_ms < 1200


def test_5xx_retries_within_budget_and_4xx_does_not(api, running_agents, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.01}
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", fail_rate=1.0, fail_status=503)
    body = api.post("/api/v1/invoke", {**ORDER, "request_id": "r-5xx"}, format="json").json()
    assert body["status"] == "failed"
    # order.query allows 2 retries: 3 executions, each a 5xx, and the budget is spent accordingly
    assert agents.stats("order-agent")["executions"]["r-5xx"] == 3
    assert Task.objects.get(request_id="r-5xx").retry_budget == 1
    agents.set_faults("order-agent", fail_rate=1.0, fail_status=400)
    api.post("/api/v1/invoke", {**ORDER, "request_id": "r-4xx"}, format="json")
    assert agents.stats("order-agent")["executions"]["r-4xx"] == 1


def test_retry_budget_header_is_shared_by_nested_hops(api, running_agents, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.01}
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", fail_rate=1.0, fail_status=503)
    api.post("/api/v1/invoke", {**ORDER, "request_id": "r-nested"}, format="json",
             HTTP_X_REACH_RETRY_BUDGET="0", HTTP_X_REACH_DEPTH="1", HTTP_X_REACH_CALL_PATH="codegen-agent")
    assert agents.stats("order-agent")["executions"]["r-nested"] == 1


def test_non_idempotent_capability_is_never_executed_twice(api, running_agents, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.01}
    agents = running_agents(["notify-agent"])
    agents.set_faults("notify-agent", fail_rate=1.0, fail_status=503)
    body = api.post("/api/v1/invoke", {"capability": "notify.send", "payload": {"to": "a"},
                                       "request_id": "r-notify"}, format="json").json()
    assert body["status"] == "failed" and "not retried" in body["error"]["message"]
    assert agents.stats("notify-agent")["executions"]["r-notify"] == 1


def test_breaker_opens_after_failure_rate_and_half_opens_after_window(api, running_agents, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.001, "BACKOFF_JITTER_S": 0.001,
                      "BREAKER_CONSECUTIVE_FAILURES": 10_000}  # the rate rule (failures in a row: test_breaker_and_capacity)
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", fail_rate=1.0, fail_status=500)
    inst = instance_of("order-agent").pk
    for i in range(7):  # 3 attempts each -> 21 failed calls in the window
        api.post("/api/v1/invoke", {**ORDER, "request_id": f"r-b{i}"}, format="json")
    assert breaker.state(inst) == breaker.OPEN
    before = sum(agents.stats("order-agent")["by_capability"].values())
    response = api.post("/api/v1/invoke", {**ORDER, "request_id": "r-b-open"}, format="json")
    assert response.status_code == 202 and response.json()["status"] == "manual_review"
    assert sum(agents.stats("order-agent")["by_capability"].values()) == before  # no traffic while open
    redis_client().delete(breaker._keys(inst)[0])  # the open period is over (its key's TTL ran out)
    assert breaker.state(inst) == breaker.HALF_OPEN
    agents.set_faults("order-agent", fail_rate=0.0)
    assert api.post("/api/v1/invoke", {**ORDER, "request_id": "r-b-probe"}, format="json").json()["status"] \
        == "succeeded"
    assert breaker.state(inst) == breaker.CLOSED


def test_fallback_to_next_candidate_sets_flag(api, running_agents):
    agents = running_agents(["doc-summary-agent", "order-agent", "weekly-report-agent", "notify-agent",
                             "codegen-agent"])
    agents.set_faults("doc-summary-agent", bad_output_rate=1.0)
    body = api.post("/api/v1/invoke", {"task": "summarize this article for me", "request_id": "r-fb",
                                       "payload": {"text": "Long article text."},
                                       "top_k": 3}, format="json").json()
    task = Task.objects.get(request_id="r-fb")
    attempts = list(task.attempts.all())
    assert attempts[0].outcome == "bad_output"
    if body["status"] == "succeeded":
        assert body["fallback"] is True and body["agent"] != "doc-summary-agent"
        assert attempts[-1].is_fallback
    else:  # no other candidate was good enough to try
        assert task.decision["candidates"][0]["capability"] == "document.summarize"


def test_twenty_concurrent_invokes_with_one_request_id_execute_once(api, running_agents, user):
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", latency_ms=300)
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    token = Token.objects.get(user=user).key
    results = []

    def call():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        results.append(client.post("/api/v1/invoke", {**ORDER, "request_id": "r-dup"}, format="json").json())
        connection.close()

    threads = [threading.Thread(target=call) for _ in range(20)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert agents.stats("order-agent")["executions"]["r-dup"] == 1
    assert {r["status"] for r in results} == {"succeeded"} and len(results) == 20


def test_depth_and_cycle_are_refused(api, running_agents):
    running_agents(["order-agent"])
    deep = api.post("/api/v1/invoke", ORDER, format="json", HTTP_X_REACH_DEPTH="5")
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "depth_exceeded"
    cycle = api.post("/api/v1/invoke", ORDER, format="json", HTTP_X_REACH_DEPTH="2",
                     HTTP_X_REACH_CALL_PATH="order-agent,codegen-agent")
    assert cycle.status_code == 409 and cycle.json()["error"]["code"] == "cycle_detected"


def test_stale_address_answering_as_another_agent_is_discarded(api, running_agents):
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", endpoint_id_override="someone-else")
    body = api.post("/api/v1/invoke", {**ORDER, "request_id": "r-fp"}, format="json").json()
    assert body["status"] == "failed" and body["result"] is None
    assert Attempt.objects.get(task__request_id="r-fp", number=1).outcome == "fingerprint_mismatch"


def test_instance_qps_quota_answers_429_with_retry_after(api, running_agents):
    running_agents(["order-agent"])
    from registry.models import Instance
    from routing import snapshot

    Instance.objects.filter(agent__endpoint_id="order-agent").update(max_qps=0.5)
    snapshot.bump_generation()
    statuses = [api.post("/api/v1/invoke", ORDER, format="json") for _ in range(3)]
    refused = [r for r in statuses if r.status_code == 429]
    assert refused and int(refused[0]["Retry-After"]) >= 1


def test_caller_concurrency_quota_answers_429(api, running_agents, settings):
    settings.REACH = {**settings.REACH, "CALLER_MAX_QPS": 0.01}
    running_agents(["order-agent"])
    statuses = [api.post("/api/v1/invoke", ORDER, format="json").status_code for _ in range(3)]
    assert 429 in statuses


def test_a_retry_after_429_with_the_same_request_id_runs_once(api, user, running_agents, settings):
    """A refused request called no agent: its retry (same request_id, as idempotent callers do) must run, once."""
    settings.REACH = {**settings.REACH, "CALLER_MAX_QPS": 2}
    agents = running_agents(["order-agent"])
    statuses = [api.post("/api/v1/invoke", {**ORDER, "request_id": f"q-{i}"}, format="json") for i in range(4)]
    refused = [(i, r) for i, r in enumerate(statuses) if r.status_code == 429]
    assert refused, [r.status_code for r in statuses]
    i, first = refused[0]
    task = Task.objects.get(request_id=f"q-{i}")
    assert task.status == "failed" and task.error["code"] == "caller_rate" and task.error["refused"] is True
    assert f"q-{i}" not in agents.stats("order-agent")["executions"]
    assert int(first["Retry-After"]) >= 1
    redis_client().delete(f"reach:bucket:caller:{user.pk}")  # Retry-After has passed: the bucket refilled
    again = api.post("/api/v1/invoke", {**ORDER, "request_id": f"q-{i}"}, format="json")
    assert again.status_code == 200 and again.json()["status"] == "succeeded"
    assert agents.stats("order-agent")["executions"][f"q-{i}"] == 1
    events = [e["to_status"] for e in api.get(f"/api/v1/tasks/q-{i}").json()["events"]]
    assert events == ["pending", "failed", "pending", "routed", "running", "succeeded"]
    # and a third time it is the stored outcome: no second execution
    assert api.post("/api/v1/invoke", {**ORDER, "request_id": f"q-{i}"}, format="json").status_code == 200
    assert agents.stats("order-agent")["executions"][f"q-{i}"] == 1


def test_a_request_refused_for_its_input_is_recorded_and_refused_again_at_once(api, running_agents):
    running_agents(["order-agent"])
    bad = {"capability": "order.query", "payload": {"order_id": 5}, "request_id": "bad-1"}  # not a string
    first = api.post("/api/v1/invoke", bad, format="json")
    assert first.status_code == 400 and first.json()["error"]["code"] == "invalid_payload"
    task = Task.objects.get(request_id="bad-1")
    assert task.status == "failed" and task.error["code"] == "invalid_payload"  # not left PENDING
    assert [e["to_status"] for e in api.get("/api/v1/tasks/bad-1").json()["events"]] == ["pending", "failed"]
    started = time.monotonic()
    second = api.post("/api/v1/invoke", bad, format="json")
    assert second.status_code == 400 and second.json()["error"]["code"] == "invalid_payload"
    assert time.monotonic() - started < 5  # answered, not left waiting for a task that will never settle


def test_invoke_bad_input_is_4xx(api, running_agents):
    running_agents(["order-agent"])
    assert api.post("/api/v1/invoke", {"payload": {}}, format="json").status_code == 400
    assert api.post("/api/v1/invoke", {"capability": "nope"}, format="json").status_code == 404
    assert api.post("/api/v1/invoke", data="{x", content_type="application/json").status_code == 400
    big = {"task": "x" * 5000}
    assert api.post("/api/v1/invoke", big, format="json").status_code == 400
    assert api.get("/api/v1/tasks/missing").status_code == 404


def test_user_sessions_stick_to_one_instance_and_close_when_idle(api, running_agents, agent_procs):
    from datetime import timedelta

    from django.utils import timezone

    from registry.models import Agent, Instance
    from routing import snapshot
    from routing.models import AgentSession
    from routing.services import sessions_close_idle

    # given order-agent with two instances
    first = running_agents(["order-agent"])
    second = agent_procs(["order-agent"])
    Instance.objects.create(agent=Agent.objects.get(endpoint_id="order-agent"), instance_id="second",
                            url=f"{second.url('order-agent')}/invoke", max_concurrency=8, max_qps=1000,
                            last_seen_at=timezone.now())
    snapshot.bump_generation()
    # when one user calls four times
    for i in range(4):
        assert api.post("/api/v1/invoke", {**ORDER, "user_key": "alice", "request_id": f"s-{i}"},
                        format="json").json()["status"] == "succeeded"
    # then one open session holds every call on one instance
    session = AgentSession.objects.get(user_key="alice", closed_at__isnull=True)
    counts = [sum(p.stats("order-agent")["by_capability"].values()) for p in (first, second)]
    assert sorted(counts) == [0, 4]
    # and after 30 idle minutes it is closed; the next call opens a new one
    assert sessions_close_idle(now=timezone.now() + timedelta(minutes=31)) == 1
    assert AgentSession.objects.get(pk=session.pk).close_reason == "idle"
    api.post("/api/v1/invoke", {**ORDER, "user_key": "alice", "request_id": "s-new"}, format="json")
    assert AgentSession.objects.filter(user_key="alice", closed_at__isnull=True).exclude(pk=session.pk).exists()
