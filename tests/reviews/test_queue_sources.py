"""Where manual review items come from (low score, every candidate failed, dead letters), how they are filtered,
and how a reviewer settles them: re-dispatch to a chosen agent (a real worker runs it), answer, replay."""

from __future__ import annotations

import pytest
from django.test import Client

from reviews.models import ReviewClaim, RoutingFeedback
from routing.callbacks import delivery_dead_letter
from routing.models import CallbackDelivery, Task
from tests.helpers import wait_until
from tests.reviews.conftest import as_user, person

ORDER = {"capability": "order.query", "payload": {"order_id": "1"}}


def queue(client, **params) -> list[dict]:
    response = client.get("/api/v1/review-queue", params)
    assert response.status_code == 200, response.json()
    return response.json()["results"]


@pytest.mark.django_db(transaction=True)
def test_unrelated_request_is_redispatched_to_a_chosen_agent_and_the_caller_gets_its_answer(
        api, running_agents, celery_worker_proc, django_user_model):
    agents = running_agents(["order-agent", "notify-agent"])
    body = api.post("/api/v1/invoke", {"task": "qwzx plorb vantish", "payload": {"order_id": "1"},
                                       "request_id": "rd-1"}, format="json").json()
    assert body["status"] == "manual_review"
    rev = as_user(person(django_user_model, "rev", group="reviewer"))
    assert [i["request_id"] for i in queue(rev, reason="low_score")] == ["rd-1"]
    assert rev.post("/api/v1/review-queue/rd-1/redispatch", {"capability": "order.query"},
                    format="json").status_code == 403  # claim first
    assert rev.post("/api/v1/review-queue/rd-1/claim").status_code == 200
    r = rev.post("/api/v1/review-queue/rd-1/redispatch", {"capability": "no.such"}, format="json")
    assert r.status_code == 400
    r = rev.post("/api/v1/review-queue/rd-1/redispatch", {"capability": "order.query"}, format="json")
    assert r.status_code == 202, r.json()
    child_id = r.json()["redispatched_as"]
    wait_until(lambda: Task.objects.get(request_id="rd-1").status == "succeeded", timeout=30,
               message="the original task to end with the re-dispatched task's outcome")
    child, origin = Task.objects.get(request_id=child_id), Task.objects.get(request_id="rd-1")
    assert child.parent_request_id == "rd-1" and child.status == "succeeded"
    assert origin.result == child.result and "answer" in origin.result
    assert agents.stats("order-agent")["executions"][child_id] == 1
    assert origin.events.last().detail["via"] == child_id
    feedback = RoutingFeedback.objects.get(task=origin)
    assert (feedback.request_text, feedback.capability, feedback.correct) == ("qwzx plorb vantish", "order.query",
                                                                              True)
    assert queue(rev) == [] and queue(rev, status="resolved")[0]["resolution"] == "redispatched"


@pytest.mark.django_db(transaction=True)
def test_every_candidate_failing_puts_the_request_in_the_queue_and_an_answer_completes_it(
        api, running_agents, django_user_model, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.001, "BACKOFF_JITTER_S": 0.001}
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", fail_rate=1.0, fail_status=503)
    assert api.post("/api/v1/invoke", {**ORDER, "request_id": "af-1"}, format="json").json()["status"] == "failed"
    rev = as_user(person(django_user_model, "rev", group="reviewer"))
    items = queue(rev, reason="all_failed")
    assert [(i["request_id"], i["status"]) for i in items] == [("af-1", "failed")]
    rev.post("/api/v1/review-queue/af-1/claim")
    r = rev.post("/api/v1/review-queue/af-1/answer", {"answer": {"status": "shipped"}}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    assert api.get("/api/v1/tasks/af-1").json()["result"] == {"status": "shipped"}


@pytest.mark.django_db
def test_dead_letters_join_the_queue_and_are_replayed(user, django_user_model, django_capture_on_commit_callbacks):
    task = Task.objects.create(request_id="dl-1", caller=user, status="succeeded", result={"ok": 1},
                               callback_url="http://127.0.0.1:9/hook")
    delivery = CallbackDelivery.objects.create(task=task, url=task.callback_url, body={"request_id": "dl-1"},
                                               attempts=4)
    delivery_dead_letter(delivery.pk)
    rev = as_user(person(django_user_model, "rev", group="reviewer"))
    assert [i["reason"] for i in queue(rev)] == ["dead_letter"]
    rev.post("/api/v1/review-queue/dl-1/claim")
    # it has its outcome: it cannot be answered or re-dispatched, only replayed or dismissed
    assert rev.post("/api/v1/review-queue/dl-1/answer", {"answer": 1}, format="json").status_code == 409
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        r = rev.post("/api/v1/review-queue/dl-1/replay")
    assert r.status_code == 200 and r.json()["replayed"] == 1 and callbacks
    assert CallbackDelivery.objects.get(pk=delivery.pk).status == "pending"
    assert ReviewClaim.objects.get(task=task).resolution == "replayed"
    # dying again reopens the item
    CallbackDelivery.objects.filter(pk=delivery.pk).update(status="pending")
    delivery_dead_letter(delivery.pk)
    assert [i["request_id"] for i in queue(rev, status="waiting")] == ["dl-1"]


@pytest.mark.django_db
def test_queue_filters_and_the_waiting_count_on_the_admin_index(user, django_user_model):
    from datetime import timedelta

    from django.utils import timezone

    old = Task.objects.create(request_id="f-old", caller=user, status="manual_review", review_reason="low_score",
                              decision={"candidates": [{"capability": "order.query", "score": 0.3}]})
    Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    Task.objects.create(request_id="f-new", caller=user, status="manual_review", review_reason="low_score",
                        decision={"candidates": [{"capability": "doc.summarize", "score": 0.2}]})
    Task.objects.create(request_id="f-failed", caller=user, status="failed", review_reason="all_failed")
    Task.objects.create(request_id="f-none", caller=user, status="succeeded")
    reviewer = person(django_user_model, "rev", group="reviewer")
    rev = as_user(reviewer)
    assert [i["request_id"] for i in queue(rev)] == ["f-old", "f-new", "f-failed"]  # oldest first
    assert [i["request_id"] for i in queue(rev, older_than="24h")] == ["f-old"]
    assert [i["request_id"] for i in queue(rev, capability_guess="doc.summarize")] == ["f-new"]
    assert [i["request_id"] for i in queue(rev, reason="all_failed")] == ["f-failed"]
    rev.post("/api/v1/review-queue/f-new/claim")
    assert [i["request_id"] for i in queue(rev, status="claimed")] == ["f-new"]
    assert [i["request_id"] for i in queue(rev, status="waiting")] == ["f-old", "f-failed"]
    assert rev.get("/api/v1/review-queue", {"status": "bogus"}).status_code == 400

    client = Client()
    client.force_login(reviewer)
    index = client.get("/admin/").content.decode()
    assert 'id="queue-waiting-count"><b>2</b> waiting' in index
    listing = client.get("/admin/reviews/reviewitem/").content.decode()
    assert "f-old" in listing and "f-new" in listing and "f-none" not in listing
    assert listing.index("f-old") < listing.index("f-new")
    listing = client.get("/admin/reviews/reviewitem/", {"guess": "order.query"}).content.decode()
    assert "f-old" in listing and "f-new" not in listing
    listing = client.get("/admin/reviews/reviewitem/", {"age": "24h"}).content.decode()
    assert "f-old" in listing and "f-failed" not in listing
