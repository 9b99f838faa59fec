"""The manual review queue: claim race, answer by hand, reject."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from rest_framework.test import APIClient

from reviews.models import ReviewClaim, RoutingFeedback
from routing.models import CallbackDelivery, Task
from tests.helpers import as_user


def reviewer(django_user_model, name: str):
    user = django_user_model.objects.create_user(name)
    user.groups.add(Group.objects.get(name="reviewer"))
    return user


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_claims_exactly_one_wins(django_user_model, user):
    Task.objects.create(request_id="q-race", caller=user, task_text="something odd", status="manual_review", review_reason="low_score")
    people = [reviewer(django_user_model, f"rev{i}") for i in range(2)]
    statuses = []
    barrier = threading.Barrier(2)

    def claim(person):
        barrier.wait()
        statuses.append(as_user(person).post("/api/v1/review-queue/q-race/claim").status_code)
        connection.close()

    threads = [threading.Thread(target=claim, args=(p,)) for p in people]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(statuses) == [200, 409]
    assert ReviewClaim.objects.filter(task__request_id="q-race").count() == 1


@pytest.mark.django_db
def test_answer_by_hand_completes_the_callers_task_and_fires_its_callback(django_user_model, user,
                                                                         django_capture_on_commit_callbacks):
    Task.objects.create(request_id="q-1", caller=user, task_text="what is the meaning of this invoice",
                        status="manual_review", review_reason="low_score", callback_url="http://127.0.0.1:9/hook")
    rev, other = reviewer(django_user_model, "rev"), reviewer(django_user_model, "other")
    assert as_user(rev).get("/api/v1/review-queue").json()["results"][0]["request_id"] == "q-1"
    # answering needs the claim
    assert as_user(rev).post("/api/v1/review-queue/q-1/answer", {"answer": {"a": 1}}, format="json").status_code == 403
    assert as_user(rev).post("/api/v1/review-queue/q-1/claim").status_code == 200
    assert as_user(other).post("/api/v1/review-queue/q-1/answer", {"answer": {"a": 1}},
                               format="json").status_code == 403
    with django_capture_on_commit_callbacks(execute=False):
        r = as_user(rev).post("/api/v1/review-queue/q-1/answer", {"answer": {"answer": "a refund"}}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    task = Task.objects.get(request_id="q-1")
    assert task.result == {"answer": "a refund"}
    assert [e.to_status for e in task.events.all()][-1] == "succeeded"
    assert CallbackDelivery.objects.get(task=task).body["result"] == {"answer": "a refund"}
    assert RoutingFeedback.objects.get(task=task).source == "reviewer"
    # the caller sees it
    assert APIClient().get("/api/v1/tasks/q-1").status_code in (401, 403)


@pytest.mark.django_db
def test_reject_needs_a_reason_and_fails_the_task(django_user_model, user):
    Task.objects.create(request_id="q-2", caller=user, task_text="nonsense", status="manual_review", review_reason="low_score")
    rev = reviewer(django_user_model, "rev")
    as_user(rev).post("/api/v1/review-queue/q-2/claim")
    assert as_user(rev).post("/api/v1/review-queue/q-2/reject", {"reason": ""}, format="json").status_code == 400
    r = as_user(rev).post("/api/v1/review-queue/q-2/reject", {"reason": "not a request we serve"}, format="json")
    assert r.json()["status"] == "failed"
    assert Task.objects.get(request_id="q-2").error["code"] == "rejected_by_review"
    # a non-reviewer cannot claim
    Task.objects.create(request_id="q-3", caller=user, task_text="x", status="manual_review", review_reason="low_score")
    assert as_user(user).post("/api/v1/review-queue/q-3/claim").status_code == 403


@pytest.mark.django_db
def test_only_reviewers_read_the_queue(django_user_model, user, api):
    """Queue items hold callers' request texts (an IBAN here): a caller or a team member reads none of them."""
    Task.objects.create(request_id="q-iban", caller=user, task_text="pay DE89370400440532013000",
                        status="manual_review", review_reason="low_score")
    member = django_user_model.objects.create_user("member", is_staff=True)
    member.groups.add(Group.objects.get(name="agent team member"))
    for client in (api, as_user(member)):
        response = client.get("/api/v1/review-queue", {"status": "all"})
        assert response.status_code == 403 and response.json()["error"]["code"] == "not_a_reviewer"
        assert b"DE89" not in response.content
    listed = as_user(reviewer(django_user_model, "rev-q")).get("/api/v1/review-queue", {"status": "all"}).json()
    assert [i["request_id"] for i in listed["results"]] == ["q-iban"]
