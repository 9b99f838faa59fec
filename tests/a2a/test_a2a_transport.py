"""The outbound a2a transport: an agent registered from its A2A card, called through the one invoke path (the
REST API), against the example A2A agent as a real server."""

from __future__ import annotations

import pytest

from registry.a2a_cards import agent_card_import
from registry.models import CapabilityVersion
from registry.services import capability_version_activate
from routing import a2a_transport, snapshot
from routing.models import Attempt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def a2a_routed(fresh_a2a_agent, settings):
    settings.REACH = {**settings.REACH, "AGENT_ALLOWED_NETWORKS": ["127.0.0.0/8"], "BACKOFF_BASE_S": 0.01}
    agent_card_import(url=fresh_a2a_agent.url, team="commerce", environment="dev")
    version = CapabilityVersion.objects.get()
    CapabilityVersion.objects.filter(pk=version.pk).update(
        output_schema={"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}})
    capability_version_activate(version=version)
    snapshot.clear_caches()
    a2a_transport._registered.clear()
    a2a_transport._served.clear()
    return fresh_a2a_agent


def _invoke(api, request_id: str, **body):
    response = api.post("/api/v1/invoke", {"capability": "order.query", "payload": {"order_id": "12"},
                                           "request_id": request_id, **body}, format="json")
    assert response.status_code in (200, 502), response.content  # 502: every attempt failed
    return response.json()


def test_invoke_sends_message_and_maps_the_task_artifact(api, a2a_routed):
    body = _invoke(api, "r-a2a-1", task="where is order 12", user_key="u-1")
    assert body["status"] == "succeeded", body
    assert body["agent"] == "order-service-agent"
    assert body["result"] == {"answer": 'order-agent handled order.query: {"order_id": "12"}',
                              "capability": "order.query"}
    # our request_id is the A2A message id, executed once
    stats = a2a_routed.stats()
    assert stats["executions"] == {"r-a2a-1": 1}
    # the task text as a text part; the caller's session as the A2A context
    assert stats["texts"]["r-a2a-1"] == "where is order 12"
    assert stats["contexts"]["r-a2a-1"] == a2a_transport.context_id("order-service-agent", "u-1")
    # a repeat of the request_id answers from the task, without a second execution
    assert _invoke(api, "r-a2a-1")["status"] == "succeeded"
    assert a2a_routed.stats()["executions"] == {"r-a2a-1": 1}


def test_tck_message_id_behaviours_are_carried_through(api, a2a_routed):
    message = _invoke(api, "tck-message-response-r1")
    assert message["status"] == "succeeded" and message["result"]["answer"] == "Direct message response"
    text = _invoke(api, "tck-artifact-text-r1")
    assert text["result"]["answer"] == "Generated text content"
    data = _invoke(api, "tck-artifact-data-r1")  # {"key", "count"}: breaks output_schema, so it is refused
    assert data["status"] == "failed"
    assert Attempt.objects.filter(task__request_id="tck-artifact-data-r1", outcome="bad_output").exists()


def test_input_required_is_answered_through_the_invoke_api(api, a2a_routed):
    asked = _invoke(api, "tck-input-required-r1", user_key="u-7")
    assert asked["status"] == "input_required" and asked["result"] == {"question": "Which order do you mean?"}
    # a plain repeat answers from the task without executing
    assert _invoke(api, "tck-input-required-r1")["status"] == "input_required"
    assert a2a_routed.stats()["executions"] == {"tck-input-required-r1": 1}
    done = _invoke(api, "tck-input-required-r1", answer={"order_id": "12"})
    assert done["status"] == "succeeded", done
    assert done["result"]["follow_up"] is True and done["result"]["answer"].endswith('{"order_id": "12"}')
    stats = a2a_routed.stats()
    # the answer went to the same A2A task and context, as the next message of the request
    assert stats["executions"] == {"tck-input-required-r1": 1, "tck-input-required-r1:1": 1}
    assert list(stats["tasks"].values()) == [2]
    assert stats["contexts"]["tck-input-required-r1:1"] == stats["contexts"]["tck-input-required-r1"] \
        == a2a_transport.context_id("order-service-agent", "u-7")
    events = [e["to_status"] for e in api.get("/api/v1/tasks/tck-input-required-r1").json()["events"]]
    assert events == ["pending", "routed", "running", "input_required", "pending", "routed", "running",
                      "succeeded"]
    # an answer to a task that asks nothing is a plain repeat
    assert _invoke(api, "tck-input-required-r1", answer="again")["status"] == "succeeded"
    assert sum(a2a_routed.stats()["executions"].values()) == 2


def test_rejection_is_retried_as_an_agent_error(api, a2a_routed):
    rejected = _invoke(api, "tck-reject-task-r1")  # the SDK answers an internal error (-32603): retried
    assert rejected["status"] == "failed"
    assert a2a_routed.stats()["executions"]["tck-reject-task-r1"] == 3  # 1 + order.query's max_retries (2)


def test_a_card_that_names_another_agent_is_a_fingerprint_mismatch(api, a2a_routed):
    a2a_routed.set_faults(card_name="Impostor agent")
    body = _invoke(api, "r-a2a-impostor")
    assert body["status"] == "failed"
    attempt = Attempt.objects.filter(task__request_id="r-a2a-impostor").first()
    assert attempt.outcome == "fingerprint_mismatch" and "Impostor agent" in attempt.error
    assert "r-a2a-impostor" not in a2a_routed.stats()["executions"]  # nothing was sent


def test_a_slow_task_times_out(api, a2a_routed, settings):
    settings.REACH = {**settings.REACH, "MIN_TIMEOUT_S": 0.5}
    a2a_routed.set_faults(latency_ms=3000)
    body = _invoke(api, "r-a2a-slow")
    assert body["status"] == "failed"
    assert Attempt.objects.filter(task__request_id="r-a2a-slow").first().outcome == "timeout"


def test_an_unanswered_question_is_reaped_and_the_agent_task_cancelled(api, a2a_routed):
    from datetime import timedelta

    import httpx
    from django.utils import timezone

    from routing.models import Task
    from routing.reaper import tasks_reap

    assert _invoke(api, "tck-input-required-reap")["status"] == "input_required"
    task = Task.objects.get(request_id="tck-input-required-reap")
    Task.objects.filter(pk=task.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert tasks_reap() == 1
    task.refresh_from_db()
    assert task.status == "failed" and task.error["code"] == "deadline_exceeded"
    remote = httpx.post(a2a_routed.url, headers={"A2A-Version": "1.0"}, timeout=5, json={
        "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task.options["a2a"]["task_id"]}}).json()
    assert remote["result"]["status"]["state"] == "TASK_STATE_CANCELED"
