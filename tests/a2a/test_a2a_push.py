"""Outbound A2A push notifications: an async task to an A2A agent whose card declares pushNotifications is sent
with a push config naming a live gateway node; the agent (examples/a2a_agent.py --push, a real a2a-sdk server)
pushes its task updates there and the task moves through the state machine. Agents without push are polled.

The async task runs through the worker's entry (``invoke.run_queued``) in this process, whose settings name the
gateway node as the public URL; the node receives the pushes."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token

from reach_platform import engine
from registry.a2a_cards import agent_card_import
from registry.models import CapabilityVersion
from registry.services import capability_version_activate
from routing import a2a_transport, lifecycle, snapshot
from routing.invoke import run_queued, task_fields, task_invoke
from routing.lifecycle import tasks_poll
from routing.models import Attempt, Task, TaskEvent
from routing.reaper import tasks_reap
from tests.factories import InstanceFactory
from tests.helpers import A2AAgentProcess, free_port, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
ANSWER = 'order-agent handled order.query: {"order_id": "12"}'


@pytest.fixture(scope="module")
def push_agent():
    proc = A2AAgentProcess(push=True).start()
    yield proc
    proc.stop()


def _register(agent, settings, node_url: str):
    settings.REACH = {**settings.REACH, "AGENT_ALLOWED_NETWORKS": ["127.0.0.0/8"], "PUBLIC_URL": node_url}
    agent.set_faults(reset=True)
    agent_card_import(url=agent.url, team="commerce", environment="dev")
    version = CapabilityVersion.objects.get()
    CapabilityVersion.objects.filter(pk=version.pk).update(
        output_schema={"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}})
    capability_version_activate(version=version)
    snapshot.clear_caches()
    a2a_transport._registered.clear()
    a2a_transport._served.clear()


@pytest.fixture
def pushing(push_agent, settings, gateway_nodes):
    (node,) = gateway_nodes(1)
    _register(push_agent, settings, node.url)
    push_agent.node = node
    return push_agent


def _async_task(user, request_id: str) -> Task:
    """An async task as ``claim`` writes it (queued for no Celery worker: this test runs it)."""
    row = Task.objects.create(**task_fields(caller=user, payload={"order_id": "12"}, capability="order.query",
                                            request_id=request_id, mode="async"))
    TaskEvent.objects.create(task=row, at=row.created_at, from_status="", to_status="pending")
    return row


def _status(row: Task, wanted: str):
    def check():
        row.refresh_from_db()
        return row.status == wanted

    wait_until(check, timeout=20, message=lambda: f"task {row.request_id} {wanted} (is {row.status})")


def test_a_long_task_is_accepted_and_finished_by_push(user, pushing):
    pushing.set_faults(latency_ms=500)
    row = _async_task(user, "r-push-1")
    assert engine.run(run_queued(row.pk)) in ("accepted", "running")  # the worker is free at once
    row.refresh_from_db()
    assert row.options["a2a"]["push"] is True and row.options["a2a"]["task_id"]
    _status(row, "succeeded")
    assert row.result == {"answer": ANSWER, "capability": "order.query"}
    done = TaskEvent.objects.get(task=row, to_status="succeeded")
    assert done.from_status in ("accepted", "running") and done.detail["reported_by"] == "push:order-service-agent"
    assert list(Attempt.objects.filter(task=row).values_list("outcome", flat=True)) == ["accepted"]
    assert pushing.stats()["executions"] == {"r-push-1": 1}


def test_a_question_comes_by_push_and_the_answer_runs_the_next_turn(user, pushing):
    pushing.set_faults(latency_ms=300)
    row = _async_task(user, "tck-input-required-push")
    engine.run(run_queued(row.pk))
    _status(row, "input_required")
    assert row.result == {"question": "Which order do you mean?"}
    asked = TaskEvent.objects.get(task=row, to_status="input_required")
    assert asked.detail["reported_by"] in ("push:order-service-agent", "read:order-service-agent")
    # the caller answers through the invoke API: the next turn goes to the same A2A task, followed by push again
    task_invoke(caller=user, payload={}, request_id="tck-input-required-push", mode="async", answer="order 12")
    _status(row, "succeeded")
    assert row.result["follow_up"] is True
    assert pushing.stats()["tasks"] == {row.options["a2a"]["task_id"]: 2}


def test_the_push_endpoint_takes_only_the_instance_the_task_was_sent_to(user, pushing):
    pushing.set_faults(latency_ms=3000)
    row = _async_task(user, "r-push-guard")
    engine.run(run_queued(row.pk))
    row.refresh_from_db()
    url, task_id = f"{pushing.node.url}/a2a-push/{row.pk}/{row.instance_id}", row.options["a2a"]["task_id"]
    update = {"statusUpdate": {"taskId": task_id, "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"}}}
    own_token = a2a_transport.push_token(row.pk, row.instance_id)

    def push(target=url, body=update, token=own_token):
        return httpx.post(target, json=body, headers={"X-A2A-Notification-Token": token}, timeout=10)

    assert push(token="forged").status_code == 403
    assert push(token="").json()["error"]["code"] == "bad_push_token"
    other = InstanceFactory()  # another agent's instance, with a token made for it
    stolen = push(target=f"{pushing.node.url}/a2a-push/{row.pk}/{other.pk}",
                  token=a2a_transport.push_token(row.pk, other.pk))
    assert stolen.status_code == 403 and stolen.json()["error"]["code"] == "not_your_task"
    assert push(body={"statusUpdate": {"taskId": "someone-elses-task", "status": {}}}).status_code == 403
    assert push(body={"nothing": 1}).status_code == 400
    assert push(body=["not", "an", "object"]).status_code == 400
    bad_json = httpx.post(url, content=b"{nope", timeout=10, headers={
        "Content-Type": "application/json", "X-A2A-Notification-Token": own_token})
    assert bad_json.status_code == 400
    missing = push(target=f"{pushing.node.url}/a2a-push/99999999/{row.instance_id}",
                   token=a2a_transport.push_token(99999999, row.instance_id))
    assert missing.status_code == 404
    row.refresh_from_db()
    assert row.status in ("accepted", "running")  # none of these moved it
    # the agent's own pushes still finish it
    _status(row, "succeeded")


def test_an_agent_without_push_is_polled(user, fresh_a2a_agent, settings, gateway_nodes):
    (node,) = gateway_nodes(1)
    _register(fresh_a2a_agent, settings, node.url)
    fresh_a2a_agent.set_faults(latency_ms=300)
    row = _async_task(user, "r-poll-1")
    assert engine.run(run_queued(row.pk)) == "succeeded"  # followed by GetTask within the attempt
    row.refresh_from_db()
    assert row.result["answer"] == ANSWER and "push" not in (row.options.get("a2a") or {})
    assert list(Attempt.objects.filter(task=row).values_list("outcome", flat=True)) == ["success"]


def test_a_caller_token_is_not_a_push_token(user, pushing):
    token = Token.objects.create(user=user).key
    row = _async_task(user, "r-push-caller")
    response = httpx.post(f"{pushing.node.url}/a2a-push/{row.pk}/1", timeout=10, json={"task": {"id": "x"}},
                          headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 403


def test_a_pushed_task_past_its_deadline_is_reaped_and_cancelled_on_the_agent(user, pushing):
    pushing.set_faults(latency_ms=20000)
    row = _async_task(user, "r-push-reap")
    engine.run(run_queued(row.pk))
    Task.objects.filter(pk=row.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert tasks_reap() == 1
    row.refresh_from_db()
    assert row.status == "failed" and row.error["code"] == "deadline_exceeded"
    remote = a2a_transport.get_task_sync(pushing.url, row.options["a2a"]["task_id"])
    assert remote["status"]["state"] == "TASK_STATE_CANCELED"


def test_a_lost_push_is_made_up_by_a_read_once_the_task_is_quiet(user, push_agent, settings):
    _register(push_agent, settings, f"http://127.0.0.1:{free_port()}")  # nobody listens there: every push is lost
    push_agent.set_faults(latency_ms=300)
    row = _async_task(user, "r-push-lost")
    engine.run(run_queued(row.pk))
    row.refresh_from_db()
    task_id = row.options["a2a"]["task_id"]
    wait_until(lambda: (a2a_transport.get_task_sync(push_agent.url, task_id) or {}).get("status", {}).get("state")
               == "TASK_STATE_COMPLETED", timeout=20, message="the agent to finish")
    assert tasks_poll() == 0  # not quiet for long enough yet
    Task.objects.filter(pk=row.pk).update(updated_at=timezone.now() - timedelta(seconds=lifecycle.A2A_QUIET_S + 1))
    assert tasks_poll() == 1
    row.refresh_from_db()
    assert row.status == "succeeded" and row.result["answer"] == ANSWER
    assert TaskEvent.objects.get(task=row, to_status="succeeded").detail["reported_by"] == "read:order-service-agent"
