"""Async execution on a real Celery worker, http-async agents, and the callback outbox."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from routing.models import CallbackDelivery, CallerSecret, Task
from tests.factories import agent_client, allowlisted
from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
ORDER = {"capability": "order.query", "payload": {"order_id": "7"}}


class Receiver:
    """A caller's callback endpoint: fails the first ``failures`` deliveries, records the rest."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls = 0
        self.received: list[tuple[bytes, dict]] = []
        self.tries: list[tuple[bytes, dict]] = []  # every delivery, refused ones too
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.calls += 1
                receiver.tries.append((raw, dict(self.headers)))
                if receiver.calls <= receiver.failures:
                    self.send_response(500)
                else:
                    receiver.received.append((raw, dict(self.headers)))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()


@pytest.fixture
def receiver():
    made = []

    def make(failures: int = 0) -> Receiver:
        made.append(Receiver(failures))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _status(request_id: str) -> str:
    return Task.objects.get(request_id=request_id).status


def test_async_invoke_runs_on_the_worker(api, running_agents, celery_worker_proc):
    agents = running_agents(["order-agent"])
    response = api.post("/api/v1/invoke", {**ORDER, "mode": "async", "request_id": "a-1"}, format="json")
    assert response.status_code == 202 and response.json()["status"] == "pending"
    assert response.json()["links"]["self"] == "/api/v1/tasks/a-1"
    wait_until(lambda: _status("a-1") == "succeeded", timeout=30, message="async task to finish")
    assert agents.stats("order-agent")["executions"]["a-1"] == 1
    events = [e["to_status"] for e in api.get("/api/v1/tasks/a-1").json()["events"]]
    assert events == ["pending", "routed", "running", "succeeded"]


def test_http_async_agent_acks_then_reports_by_callback(api, live_server, running_agents):
    key = allowlisted("ocr-agent", team="vision")
    running_agents(["ocr-agent"], gateway=live_server.url, keys={"ocr-agent": key})
    response = api.post("/api/v1/invoke", {"capability": "ocr.extract", "payload": {"image_url": "x.png"},
                                           "request_id": "ocr-1"}, format="json")
    assert response.status_code == 202 and response.json()["status"] == "accepted"
    wait_until(lambda: _status("ocr-1") == "succeeded", timeout=20, message="the agent's callback")
    events = [e["to_status"] for e in api.get("/api/v1/tasks/ocr-1").json()["events"]]
    assert events == ["pending", "routed", "running", "accepted", "running", "succeeded"]
    assert "ocr-agent handled ocr.extract" in Task.objects.get(request_id="ocr-1").result["answer"]
    # a repeated report is harmless
    again = agent_client(key).post("/api/v1/tasks/ocr-1/callback", {"status": "failed"}, format="json")
    assert again.status_code == 200 and _status("ocr-1") == "succeeded"


def test_only_the_agent_the_task_was_sent_to_may_report(api, live_server, running_agents):
    running_agents(["order-agent"])
    api.post("/api/v1/invoke", {**ORDER, "request_id": "own-1"}, format="json")
    other = agent_client(allowlisted("notify-agent", team="platform"))
    response = other.post("/api/v1/tasks/own-1/callback", {"status": "failed"}, format="json")
    assert response.status_code == 403 and response.json()["error"]["code"] == "not_your_task"


def test_a_key_of_the_same_endpoint_id_in_another_environment_may_not_report(api, live_server, running_agents):
    """A staging key of the endpoint id the dev task was sent to: refused, and the task keeps its outcome."""
    dev_key = allowlisted("ocr-agent", team="vision")
    running_agents(["ocr-agent"], keys={"ocr-agent": dev_key}, faults={"ocr-agent": {"no_callback": True}})
    api.post("/api/v1/invoke", {"capability": "ocr.extract", "payload": {"image_url": "x.png"},
                                "request_id": "ocr-env"}, format="json")
    assert _status("ocr-env") == "accepted"
    staging = agent_client(allowlisted("ocr-agent", environment="staging", team="vision"))
    forged = staging.post("/api/v1/tasks/ocr-env/callback", {"status": "succeeded", "result": {"forged": 1}},
                          format="json")
    assert forged.status_code == 403 and forged.json()["error"]["code"] == "not_your_task"
    assert _status("ocr-env") == "accepted" and Task.objects.get(request_id="ocr-env").result is None
    own = agent_client(dev_key).post("/api/v1/tasks/ocr-env/callback", {"status": "succeeded", "result": {"ok": 1}},
                                     format="json")
    assert own.status_code == 200 and _status("ocr-env") == "succeeded"


def test_callback_delivered_once_after_two_failures_with_valid_signature(api, running_agents, receiver, user,
                                                                        celery_worker_proc):
    running_agents(["order-agent"])
    hook = receiver(failures=2)
    api.post("/api/v1/invoke", {**ORDER, "request_id": "cb-1", "callback_url": hook.url}, format="json")
    delivery = CallbackDelivery.objects.get(task__request_id="cb-1")
    wait_until(lambda: CallbackDelivery.objects.get(pk=delivery.pk).status == "delivered", timeout=30,
               message="delivery")
    assert hook.calls == 3 and len(hook.received) == 1
    raw, headers = hook.received[0]
    body = json.loads(raw)
    assert body["request_id"] == "cb-1" and body["status"] == "succeeded" and "answer" in body["result"]
    secret = CallerSecret.objects.get(caller=user).secret
    expected = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    assert headers["X-Reach-Signature"] == expected
    assert CallbackDelivery.objects.get(pk=delivery.pk).attempts == 3


def test_worker_tries_a_callback_with_the_outcome_and_every_try_signs_the_same_bytes(api, running_agents, receiver,
                                                                                    user, celery_worker_proc):
    """A worker's outcome statement writes the outbox row with its first try counted and reads the caller's
    signing secret, so the first POST follows it directly; a retry reads the row back and sends the same bytes."""
    running_agents(["order-agent"])
    hook = receiver(failures=1)
    for key in ("first-1", "first-2"):  # the caller's first delivery makes its secret; the second's is read
        api.post("/api/v1/invoke", {**ORDER, "mode": "async", "request_id": key, "callback_url": hook.url},
                 format="json")
        wait_until(lambda key=key: CallbackDelivery.objects.filter(task__request_id=key, status="delivered").exists(),
                   timeout=30, message=f"delivery of {key}")
    first, second = (CallbackDelivery.objects.get(task__request_id=key) for key in ("first-1", "first-2"))
    assert (first.attempts, second.attempts) == (2, 1)
    assert [e["to_status"] for e in api.get("/api/v1/tasks/first-2").json()["events"]] == [
        "pending", "routed", "running", "succeeded"]
    secret = CallerSecret.objects.get(caller=user).secret
    assert len(hook.tries) == 3 and hook.tries[0][0] == hook.tries[1][0]  # the refused try and its retry
    for raw, headers in hook.tries:
        assert headers["X-Reach-Signature"] == "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    bodies = [json.loads(raw) for raw, _ in hook.received]
    assert [(b["request_id"], b["status"]) for b in bodies] == [("first-1", "succeeded"), ("first-2", "succeeded")]


def test_failing_receiver_is_dead_lettered_then_replayed_from_admin(api, admin_client, running_agents, receiver,
                                                                   celery_worker_proc):
    running_agents(["order-agent"])
    hook = receiver(failures=10**6)
    api.post("/api/v1/invoke", {**ORDER, "request_id": "cb-dead", "callback_url": hook.url}, format="json")
    delivery = CallbackDelivery.objects.get(task__request_id="cb-dead")
    wait_until(lambda: CallbackDelivery.objects.get(pk=delivery.pk).status == "dead", timeout=40,
               message="dead letter")
    assert hook.calls == 4  # the first try and 3 retries
    hook.failures = 0
    response = admin_client.post("/admin/routing/callbackdelivery/", {"action": "replay",
                                                                     "_selected_action": [delivery.pk]})
    assert response.status_code == 302
    wait_until(lambda: CallbackDelivery.objects.get(pk=delivery.pk).status == "delivered", timeout=30,
               message="replayed delivery")
    assert len(hook.received) == 1


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data", "http://metadata.google.internal/x",
                                 "http://10.1.2.3/hook", "ftp://example.com/hook", "http://[fe80::1]/hook"])
def test_callback_urls_that_reach_inside_are_refused(api, registry_ready, url):
    response = api.post("/api/v1/invoke", {**ORDER, "callback_url": url}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] in ("callback_url_refused", "invalid")
    assert not Task.objects.exists()


def test_reaper_fails_a_task_stuck_past_its_deadline_and_fires_its_callback(api, running_agents, receiver):
    from datetime import timedelta

    from django.utils import timezone

    from routing.services import tasks_reap

    # given an async agent that ACKs and then never reports (it has no gateway to report to)
    running_agents(["ocr-agent"])
    hook = receiver()
    api.post("/api/v1/invoke", {"capability": "ocr.extract", "payload": {"image_url": "x"}, "request_id": "stuck-1",
                                "callback_url": hook.url}, format="json")
    assert _status("stuck-1") == "accepted"
    # nothing happens before the deadline
    assert tasks_reap() == 0
    # when the deadline has passed
    assert tasks_reap(now=timezone.now() + timedelta(hours=1)) == 1
    task = Task.objects.get(request_id="stuck-1")
    assert task.status == "failed" and task.error["code"] == "deadline_exceeded"
    last = task.events.order_by("-at", "-id").first()
    assert last.detail["reason"] == "deadline passed while accepted"
    assert CallbackDelivery.objects.filter(task=task).exists()


@pytest.mark.parametrize("capability, payload, expected", [
    ("order.query", {"order_id": "1"}, "succeeded"),   # idempotent: resumed and completed once
    ("notify.send", {"to": "ops"}, "failed"),          # not idempotent: may have run, so never run again
])
def test_worker_killed_mid_task(api, running_agents, celery_worker_proc, capability, payload, expected):
    agent = "order-agent" if capability == "order.query" else "notify-agent"
    agents = running_agents([agent])
    agents.set_faults(agent, latency_ms=2500)
    rid = f"kill-{capability}"
    api.post("/api/v1/invoke", {"capability": capability, "payload": payload, "mode": "async", "request_id": rid},
             format="json")
    # when the worker is inside the agent call
    wait_until(lambda: agents.stats(agent)["executions"].get(rid) == 1, timeout=30, message="the agent call")
    celery_worker_proc.kill()
    agents.set_faults(agent, latency_ms=0)
    assert _status(rid) == "running"
    # and a new worker comes up
    celery_worker_proc.start()
    wait_until(lambda: _status(rid) in ("succeeded", "failed"), timeout=60, interval=0.5, message="the outcome")
    task = Task.objects.get(request_id=rid)
    assert task.status == expected
    if expected == "succeeded":
        assert any(e.detail.get("resumed") for e in task.events.all())
        assert Task.objects.filter(request_id=rid, status="succeeded").count() == 1
    else:
        assert task.error["code"] == "worker_lost"
        assert agents.stats(agent)["executions"][rid] == 1


def _queue_drained() -> bool:
    from reach_platform.celery import app

    with app.connection_for_read() as conn:
        client = conn.default_channel.client
        return client.llen("celery") == 0 and client.hlen("unacked") == 0


def test_messages_carrying_the_row_take_the_task_once(api, running_agents, request):
    """An async task's message carries its row as claimed (a header), and the worker takes the task with the
    RUNNING checkpoint itself (one compare-and-set that also takes the lease) instead of leasing it first. The
    same task queued three more times while its agent answers slowly (twice carrying the row, once by its id
    alone, as a web process of the release before sends it) still runs once, and a message that comes after it
    settled changes nothing."""
    from routing import rowsql
    from routing.tasks import CLAIMED_HEADER, execute_task

    agents = running_agents(["order-agent"])
    request.getfixturevalue("celery_worker_proc")
    # a worker's first task is planned in a database thread (it builds the routing snapshot), after a lease
    api.post("/api/v1/invoke", {**ORDER, "mode": "async", "request_id": "warm-up"}, format="json")
    wait_until(lambda: _status("warm-up") == "succeeded", timeout=30, message="the first task")
    agents.set_faults("order-agent", latency_ms=1500)
    api.post("/api/v1/invoke", {**ORDER, "mode": "async", "request_id": "dup-msg"}, format="json")
    task = Task.objects.get(request_id="dup-msg")
    carried = rowsql.rows_json(Task, [task], add=False)
    for headers in ({CLAIMED_HEADER: carried}, {CLAIMED_HEADER: carried}, None):  # while the first runs
        execute_task.apply_async((task.pk,), headers=headers)
    wait_until(lambda: _status("dup-msg") == "succeeded" and _queue_drained(), timeout=40, message="the messages")
    assert agents.stats("order-agent")["executions"]["dup-msg"] == 1
    task.refresh_from_db()
    events = list(task.events.order_by("at", "id"))
    assert [e.to_status for e in events] == ["pending", "routed", "running", "succeeded"]
    assert task.claimed_at >= events[2].at  # taken by its checkpoint: a lease taken first would be older
    execute_task.apply_async((task.pk,), headers={CLAIMED_HEADER: carried})
    wait_until(_queue_drained, timeout=20, message="the late message")
    assert agents.stats("order-agent")["executions"]["dup-msg"] == 1
    assert [e.to_status for e in task.events.order_by("at", "id")] == ["pending", "routed", "running", "succeeded"]
    assert _status("dup-msg") == "succeeded"


def test_http_async_agent_without_callbacks_is_polled_at_its_status_url(api, running_agents):
    from registry.models import Instance
    from routing.services import tasks_poll

    # given an async agent that never calls back but answers GET /status
    agents = running_agents(["ocr-agent"])
    agents.set_faults("ocr-agent", no_callback=True)
    Instance.objects.filter(agent__endpoint_id="ocr-agent").update(status_url=f"{agents.url('ocr-agent')}/status")
    from routing import snapshot

    snapshot.bump_generation()
    api.post("/api/v1/invoke", {"capability": "ocr.extract", "payload": {"image_url": "y.png"},
                                "request_id": "poll-1"}, format="json")
    assert _status("poll-1") == "accepted"
    # when the poller runs until the agent is done
    wait_until(lambda: tasks_poll() >= 0 and _status("poll-1") == "succeeded", timeout=20, interval=0.3,
               message="the poll to see the result")
    task = Task.objects.get(request_id="poll-1")
    assert "ocr-agent handled ocr.extract" in task.result["answer"]
    assert any(e.detail.get("reported_by") == "poll:ocr-agent" for e in task.events.all())
