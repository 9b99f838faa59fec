"""The governance flows in a real browser: a team member submits a version, a reviewer approves it and sees it
ACTIVE; another reviewer claims and answers a manual review item. Screenshots go to docs/screenshots/."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from registry.choices import VersionState
from registry.models import CapabilityVersion
from routing.models import Task
from tests.browser.conftest import shot
from tests.reviews.conftest import person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_member_submits_reviewer_approves_and_sees_it_active(login, live_server, django_user_model):
    call_command("reach_import", "examples/descriptors", verbosity=0)
    CapabilityVersion.objects.update(state=VersionState.ACTIVE)
    person(django_user_model, "mia", team="commerce", group="agent team member")
    person(django_user_model, "rex", group="reviewer")

    # the team member drafts the next version of its capability from the active one, adds an example, submits
    member = login("mia", "pw-mia-123")
    member.goto(f"{live_server.url}/admin/registry/capabilityversion/")
    assert member.locator("text=notify.send").count() == 0  # another team's versions are not listed
    member.click("text=diff & workflow")
    member.click("input[value='New draft from this version']")
    member.wait_for_selector("#id_examples")
    examples = json.loads(member.input_value("#id_examples"))
    member.fill("#id_examples", json.dumps([*examples, "has parcel 31 left the warehouse yet"]))
    member.click("input[name=_save]")
    member.wait_for_selector("#version-diff")
    assert member.inner_text("#version-state") == "DRAFT"
    assert "+ has parcel 31 left the warehouse yet" in member.inner_text("#version-diff")
    shot(member, "version-review-draft")
    member.click("input[name=submit-version]")
    member.wait_for_selector("text=submitted for review")
    assert member.inner_text("#version-state") == "SUBMITTED"
    assert member.locator("input[name=approve-version]").count() == 0  # no approving your own team's work

    # a reviewer finds it from the admin index, reads the diff and approves it
    reviewer = login("rex", "pw-rex-123")
    reviewer.click("text=Versions waiting for review")
    reviewer.click("text=diff & workflow")
    reviewer.fill("input[name=confidence_weight]", "0.8")
    shot(reviewer, "version-review-submitted")
    reviewer.click("input[name=approve-version]")
    reviewer.wait_for_selector("text=approved and active")
    assert reviewer.inner_text("#version-state") == "ACTIVE"
    assert "version.approved" in reviewer.inner_text("#review-history")
    shot(reviewer, "version-review-active")
    new = CapabilityVersion.objects.get(capability__name="order.query", state=VersionState.ACTIVE)
    assert new.version == "1.1.0" and new.confidence_weight == 0.8
    assert CapabilityVersion.objects.get(capability__name="order.query", version="1.0.0").state == \
        VersionState.RETIRED


def test_reviewer_claims_and_answers_a_manual_review_item(login, live_server, django_user_model, user):
    call_command("reach_import", "examples/descriptors", verbosity=0)
    CapabilityVersion.objects.update(state=VersionState.ACTIVE)  # the re-dispatch choices
    Task.objects.create(request_id="browser-q1", caller=user, task_text="can you translate this contract clause?",
                        status="manual_review", review_reason="low_score",
                        decision={"score": 0.31, "candidates": [{"capability": "document.summarize", "agent":
                                                                 "doc-summary-agent", "score": 0.31,
                                                                 "reasons": ["semantic 0.42"]}]})
    person(django_user_model, "ada", group="reviewer")
    page = login("ada", "pw-ada-123")
    assert page.inner_text("#queue-waiting-count") == "1 waiting"
    shot(page, "admin-index-governance")
    page.click("#governance-notices >> text=Manual review queue")
    page.click("text=browser-q1")
    shot(page, "review-item-unclaimed")
    page.click("input[name=claim-item]")
    page.wait_for_selector("text=You hold browser-q1")
    page.fill("#answer-form textarea[name=answer]", '{"translation": "Die Klausel gilt ab Lieferung."}')
    shot(page, "review-item-claimed")
    page.click("input[name=answer-item]")
    page.wait_for_selector("text=the caller's task is complete")
    assert page.inner_text("#task-status") == "SUCCEEDED"
    task = Task.objects.get(request_id="browser-q1")
    assert task.status == "succeeded" and task.result == {"translation": "Die Klausel gilt ab Lieferung."}
    page.goto(f"{live_server.url}/admin/")
    assert page.inner_text("#queue-waiting-count") == "0 waiting"
