"""Feedback into routing (promotion into a draft that goes through review), and the admin governance pages:
the version review page with its diff and buttons, the triage page, the agent detail page."""

from __future__ import annotations

import pytest
from django.test import Client

from registry.choices import VersionState
from registry.models import CapabilityVersion
from reviews.models import RoutingFeedback
from routing.models import Task
from tests.reviews.conftest import as_user

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_feedback_is_promoted_into_the_next_version_through_review(people, user):
    stable = CapabilityVersion.objects.get(capability__name="order.query")
    CapabilityVersion.objects.filter(pk=stable.pk).update(state=VersionState.ACTIVE)
    Task.objects.create(request_id="fb-1", caller=user, task_text="has my parcel left the warehouse",
                               capability_label="order.query@1.0.0", status="succeeded")
    Task.objects.create(request_id="fb-2", caller=user, task_text="write me a poem about parcels",
                                capability_label="order.query@1.0.0", status="succeeded")
    caller = as_user(user)
    assert caller.post("/api/v1/tasks/fb-1/feedback", {"correct": True}, format="json").status_code == 201
    assert caller.post("/api/v1/tasks/fb-2/feedback", {"correct": False, "comment": "not an order question"},
                       format="json").status_code == 201
    ids = list(RoutingFeedback.objects.order_by("pk").values_list("pk", flat=True))
    # only reviewers promote
    assert as_user(people["member"]).post("/api/v1/routing-feedback/promote",
                                          {"capability": "order.query", "feedback_ids": ids},
                                          format="json").status_code == 403
    reviewer = as_user(people["reviewer"])
    listed = reviewer.get("/api/v1/routing-feedback", {"capability": "order.query", "promoted": "false"}).json()
    assert listed["count"] == 2
    assert reviewer.post("/api/v1/routing-feedback/promote", {"capability": "document.summarize", "feedback_ids": ids},
                         format="json").status_code == 400
    r = reviewer.post("/api/v1/routing-feedback/promote", {"capability": "order.query", "feedback_ids": ids},
                      format="json")
    assert r.status_code == 201, r.json()
    draft = CapabilityVersion.objects.get(pk=r.json()["id"])
    assert draft.state == VersionState.DRAFT and draft.capability_id == stable.capability_id
    assert "has my parcel left the warehouse" in draft.examples
    assert "write me a poem about parcels" in draft.negative_cases
    assert set(stable.examples) < set(draft.examples)
    # promoted once only
    assert reviewer.post("/api/v1/routing-feedback/promote", {"capability": "order.query", "feedback_ids": ids},
                         format="json").status_code == 409
    # then the normal workflow: the owning team submits, a reviewer outside it approves
    assert as_user(people["member"]).post(f"/api/v1/capability-versions/{draft.pk}/submit").status_code == 200
    r = reviewer.post(f"/api/v1/capability-versions/{draft.pk}/approve", {"confidence_weight": 0.9}, format="json")
    assert r.status_code == 200 and r.json()["state"] == "active"
    stable.refresh_from_db()
    assert stable.state == VersionState.RETIRED


def test_review_page_shows_the_diff_and_drives_the_workflow(people):
    stable = CapabilityVersion.objects.get(capability__name="order.query")
    CapabilityVersion.objects.filter(pk=stable.pk).update(state=VersionState.ACTIVE)
    member = logged_in(people["member"])
    # the team drafts a new version from the active one, in the admin
    r = member.post(f"/admin/registry/capabilityversion/{stable.pk}/review/", {"action": "new_draft"})
    draft = CapabilityVersion.objects.get(capability=stable.capability, state=VersionState.DRAFT)
    assert r.status_code == 302 and r.url.endswith(f"/{draft.pk}/change/")
    CapabilityVersion.objects.filter(pk=draft.pk).update(
        examples=[*stable.examples[1:], "track parcel 77 for me"], timeout_ms=stable.timeout_ms + 500,
        input_schema={**stable.input_schema, "required": ["order_id", "customer"]})
    page = member.get(f"/admin/registry/capabilityversion/{draft.pk}/review/").content.decode()
    assert "+ track parcel 77 for me" in page and f"− {stable.examples[0]}" in page
    assert "timeout_ms" in page and "&quot;customer&quot;" in page
    assert 'name="submit-version"' in page and 'name="approve-version"' not in page
    member.post(f"/admin/registry/capabilityversion/{draft.pk}/review/", {"action": "submit"})
    draft.refresh_from_db()
    assert draft.state == VersionState.SUBMITTED
    # a reviewer of the same team sees no approve button, and the service refuses a forged post
    own = logged_in(people["own_reviewer"])
    assert 'name="approve-version"' not in own.get(f"/admin/registry/capabilityversion/{draft.pk}/review/")\
        .content.decode()
    own.post(f"/admin/registry/capabilityversion/{draft.pk}/review/", {"action": "approve", "confidence_weight": 1})
    draft.refresh_from_db()
    assert draft.state == VersionState.SUBMITTED
    # a reviewer outside the team: reject needs a comment; approve as a 10 % canary
    reviewer = logged_in(people["reviewer"])
    r = reviewer.post(f"/admin/registry/capabilityversion/{draft.pk}/review/", {"action": "reject", "comment": ""},
                      follow=True)
    assert "needs a comment" in r.content.decode()
    reviewer.post(f"/admin/registry/capabilityversion/{draft.pk}/review/",
                  {"action": "approve", "confidence_weight": "0.7", "canary_percent": "10"})
    draft.refresh_from_db()
    assert (draft.state, draft.is_canary, draft.canary_share, draft.confidence_weight) == (VersionState.ACTIVE, True,
                                                                                        0.1, 0.7)
    page = reviewer.get(f"/admin/registry/capabilityversion/{draft.pk}/review/").content.decode()
    assert "Promote canary" in page and "version.approved" in page and "version.submitted" in page


def test_triage_page_claims_and_answers(people, user):
    Task.objects.create(request_id="tr-1", caller=user, task_text="an odd question", status="manual_review",
                        review_reason="low_score")
    item = Task.objects.get(request_id="tr-1")
    reviewer = logged_in(people["reviewer"])
    url = f"/admin/reviews/reviewitem/{item.pk}/change/"
    assert 'name="claim-item"' in reviewer.get(url).content.decode()
    reviewer.post(url, {"action": "claim"})
    page = reviewer.get(url).content.decode()
    assert 'name="answer-item"' in page and 'name="redispatch-item"' in page
    other = logged_in(people["own_reviewer"])
    assert "Held by reviewer" in other.get(url).content.decode()
    reviewer.post(url, {"action": "answer", "answer": '{"text": "42"}'})
    item.refresh_from_db()
    assert item.status == "succeeded" and item.result == {"text": "42"}


def test_agent_detail_page(people, registry_ready, running_agents, api):
    running_agents(["order-agent"])
    for i in range(3):
        api.post("/api/v1/invoke", {"capability": "order.query", "payload": {"order_id": "1"},
                                    "request_id": f"ad-{i}"}, format="json")
    from registry.models import Agent

    agent = Agent.objects.get(endpoint_id="order-agent")
    page = logged_in(people["member"]).get(f"/admin/registry/agent/{agent.pk}/change/").content.decode()
    assert "agent-instances" in page and "ONLINE" in page and "CLOSED" in page  # liveness and breaker
    assert "3 attempts, success rate <b>100.0%</b>" in page
    assert "ad-2" in page and "order.query@1.0.0" in page
