"""Roles: a team member edits its own team's agents and drafts only, through the API and the admin alike."""

from __future__ import annotations

import pytest
from django.test import Client

from registry.choices import VersionState
from registry.models import Agent, AuditLog, CapabilityVersion
from tests.reviews.conftest import as_user

pytestmark = pytest.mark.django_db


def admin_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_member_edits_own_agent_but_not_another_teams_via_api(people):
    member = as_user(people["member"])
    r = member.patch("/api/v1/agents/order-agent/", {"description": "orders, shipments"}, format="json")
    assert r.status_code == 200 and r.json()["description"] == "orders, shipments"
    assert AuditLog.objects.filter(action="agent.changed", actor=people["member"]).exists()
    # another team's agent is not even readable: 404, as for one that does not exist
    r = member.patch("/api/v1/agents/notify-agent/", {"description": "hijacked"}, format="json")
    assert r.status_code == 404
    assert Agent.objects.get(endpoint_id="notify-agent").description != "hijacked"
    # bad input is a 4xx with a message
    r = member.patch("/api/v1/agents/order-agent/", {"status": "exploded"}, format="json")
    assert r.status_code == 400


def test_member_edits_own_agent_but_not_another_teams_via_admin(people):
    client = admin_client(people["member"])
    own = Agent.objects.get(endpoint_id="order-agent")
    other = Agent.objects.get(endpoint_id="notify-agent")
    # another team's agent is not even listed, and its change page is refused
    listing = client.get("/admin/registry/agent/")
    assert listing.status_code == 200
    assert b"order-agent" in listing.content and b"notify-agent" not in listing.content
    r = client.post(f"/admin/registry/agent/{other.pk}/change/", {"display_name": "x", "description": "hijacked",
                                                                  "status": "active"})
    assert r.status_code in (302, 403, 404)
    other.refresh_from_db()
    assert other.description != "hijacked"
    # its own agent: the description changes, with an audit row
    page = client.get(f"/admin/registry/agent/{own.pk}/change/")
    assert page.status_code == 200 and b'name="description"' in page.content
    assert b'name="team"' not in page.content  # a member cannot move the agent to another team
    r = client.post(f"/admin/registry/agent/{own.pk}/change/", {
        "display_name": "Orders", "description": "edited in the admin", "status": "active",
        "instances-TOTAL_FORMS": 0, "instances-INITIAL_FORMS": 0, "capabilities-TOTAL_FORMS": 0,
        "capabilities-INITIAL_FORMS": 0})
    assert r.status_code == 302, r.content[:2000]
    own.refresh_from_db()
    assert own.description == "edited in the admin"
    assert AuditLog.objects.filter(action="agent.changed", target_id=str(own.pk)).exists()


def test_drafts_are_team_scoped_and_only_drafts_are_editable(people):
    member, outsider = as_user(people["member"]), as_user(people["outsider"])
    r = member.post("/api/v1/capability-versions/", {"capability": "order.query",
                                                    "examples": ["where is my parcel 42"]}, format="json")
    assert r.status_code == 201 and r.json()["state"] == "draft" and r.json()["version"] != "1.0.0"
    draft_id = r.json()["id"]
    r = outsider.post("/api/v1/capability-versions/", {"capability": "order.query"}, format="json")
    assert r.status_code == 403
    r = outsider.patch(f"/api/v1/capability-versions/{draft_id}/", {"examples": ["x"]}, format="json")
    assert r.status_code == 404  # another team's draft is not readable
    r = member.patch(f"/api/v1/capability-versions/{draft_id}/", {"timeout_ms": 1234}, format="json")
    assert r.status_code == 200 and r.json()["timeout_ms"] == 1234
    # the state is not the member's to write, and an active version is immutable
    r = member.patch(f"/api/v1/capability-versions/{draft_id}/", {"state": "active"}, format="json")
    assert CapabilityVersion.objects.get(pk=draft_id).state == VersionState.DRAFT
    active = CapabilityVersion.objects.exclude(pk=draft_id).get(capability__name="order.query")
    CapabilityVersion.objects.filter(pk=active.pk).update(state=VersionState.ACTIVE)
    r = member.patch(f"/api/v1/capability-versions/{active.pk}/", {"timeout_ms": 1}, format="json")
    assert r.status_code == 409
    r = member.post("/api/v1/capability-versions/", {"capability": "no.such"}, format="json")
    assert r.status_code == 404


def test_admin_version_pages_follow_the_same_rules(people):
    client = admin_client(people["member"])
    own = CapabilityVersion.objects.get(capability__name="order.query")
    other = CapabilityVersion.objects.get(capability__name="notify.send")
    listing = client.get("/admin/registry/capabilityversion/")
    assert b"order.query" in listing.content and b"notify.send" not in listing.content
    assert client.get(f"/admin/registry/capabilityversion/{other.pk}/review/").status_code == 302
    # the add form offers the member's own capabilities only
    add = client.get("/admin/registry/capabilityversion/add/")
    assert add.status_code == 200
    assert b"order.query" in add.content and b"notify.send" not in add.content
    # finance sees no registry write page at all
    assert admin_client(people["finance"]).get(f"/admin/registry/capabilityversion/{own.pk}/review/").status_code \
        in (302, 403)


def test_member_adds_a_draft_in_the_admin_and_cannot_pick_another_teams_capability(people):
    client = admin_client(people["member"])
    own = CapabilityVersion.objects.get(capability__name="order.query")
    other = CapabilityVersion.objects.get(capability__name="notify.send")
    form = {"version": "9.0.0", "description": "drafted in the admin", "action": "query", "domains": "orders",
            "tags": "", "keywords": "", "languages": "en", "examples": '["where is parcel 9"]',
            "negative_cases": "[]", "reject_conditions": "[]", "input_schema": "{}", "output_schema": "{}",
            "idempotent": "on", "timeout_ms": 3000, "max_retries": 1, "avg_latency_ms": 0, "p95_latency_ms": 0,
            "avg_tokens_per_call": 0, "cost_per_call": 0, "price_per_1k_input_tokens": 0,
            "price_per_1k_output_tokens": 0, "model_name": ""}
    r = client.post("/admin/registry/capabilityversion/add/", {**form, "capability": other.capability_id})
    assert r.status_code == 200 and not CapabilityVersion.objects.filter(version="9.0.0").exists()  # form error
    r = client.post("/admin/registry/capabilityversion/add/", {**form, "capability": own.capability_id})
    draft = CapabilityVersion.objects.get(version="9.0.0")
    assert r.status_code == 302 and r.url.endswith(f"/{draft.pk}/review/")
    assert draft.state == VersionState.DRAFT and draft.examples == ["where is parcel 9"]
    assert AuditLog.objects.filter(action="version.drafted", target_id=str(draft.pk), actor=people["member"]).exists()


def _task_of(caller, request_id: str):
    from routing.models import Task

    return Task.objects.create(request_id=request_id, caller=caller, status="succeeded",
                               task_text="pay IBAN DE89370400440532013000", review_reason="low_score")


def test_the_staff_flag_grants_no_reads(people, user, client):
    """Every admin user is staff: a team member must not read another caller's task, the ledger or metrics."""
    _task_of(user, "theirs-1")
    member = as_user(people["member"])  # is_staff=True, like every admin user
    assert member.get("/api/v1/tasks/theirs-1").status_code == 404  # request_ids are per caller
    assert member.post("/api/v1/tasks/theirs-1/feedback", {"correct": False}, format="json").status_code == 404
    assert member.get("/api/v1/ledger/weekly").status_code == 403
    client.force_login(people["member"])
    assert client.get("/metrics").status_code == 403
    assert as_user(people["reviewer"]).get("/api/v1/tasks/theirs-1").status_code == 200
    assert as_user(people["finance"]).get("/api/v1/ledger/weekly").status_code == 200
