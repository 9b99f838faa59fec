"""API reads follow the teams (issue 12, item 4): callers read ACTIVE capability versions, not agents, instance
URLs or drafts; team members read their own teams' registry; reviewers every team's. The admin reads through
the same selectors."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from rest_framework.test import APIClient

from registry.choices import VersionState
from registry.models import CapabilityVersion, Team
from tests.factories import agent_client, allowlisted, registration

pytestmark = pytest.mark.django_db


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def world(django_user_model):
    """The example registry: order.query ACTIVE, every other version a draft; order-agent has an instance."""
    call_command("reach_import", "examples/descriptors", verbosity=0)
    CapabilityVersion.objects.filter(capability__name="order.query").update(state=VersionState.ACTIVE)
    agent_client(allowlisted("order-agent")).post("/api/v1/agents/register", registration("order-agent"))
    member = django_user_model.objects.create_user("member", password="pw-member-123", is_staff=True)
    member.groups.add(Group.objects.get(name="agent team member"))
    Team.objects.get(slug="platform").members.add(member)
    reviewer = django_user_model.objects.create_user("rev", password="pw-rev-12345", is_staff=True)
    reviewer.groups.add(Group.objects.get(name="reviewer"))
    return {"member": member, "reviewer": reviewer}


def _names(client, path, **params) -> set[str]:
    response = client.get(path, params)
    assert response.status_code == 200
    return {row.get("endpoint_id") or row.get("capability") or row.get("agent") for row in response.json()["results"]}


def test_a_plain_caller_reads_active_capabilities_only(api, world):
    assert _names(api, "/api/v1/capability-versions/") == {"order.query"}
    assert _names(api, "/api/v1/capability-versions/", status="draft") == set()
    assert _names(api, "/api/v1/agents/") == set()
    assert api.get("/api/v1/agents/order-agent/").status_code == 404
    assert _names(api, "/api/v1/instances/") == set()
    draft = CapabilityVersion.objects.get(capability__name="notify.send")
    assert api.get(f"/api/v1/capability-versions/{draft.pk}/").status_code == 404


def test_a_team_member_reads_its_own_team_and_active_capabilities(world):
    member = _client(world["member"])
    assert _names(member, "/api/v1/agents/") == {"notify-agent"}
    assert _names(member, "/api/v1/instances/") == set()  # order-agent's instance belongs to commerce
    assert _names(member, "/api/v1/capability-versions/") == {"order.query", "notify.send"}
    assert _names(member, "/api/v1/capability-versions/", status="draft") == {"notify.send"}


def test_a_reviewer_reads_every_team(world):
    reviewer = _client(world["reviewer"])
    assert len(_names(reviewer, "/api/v1/agents/")) == 6
    assert _names(reviewer, "/api/v1/instances/") == {"order-agent"}
    assert len(_names(reviewer, "/api/v1/capability-versions/", status="draft")) == 5


def test_the_admin_lists_through_the_same_selectors(client, world):
    """The admin is a team's workspace: its version list holds the team's own versions only (the ACTIVE
    catalogue of every team is read through the API)."""
    client.force_login(world["member"])
    page = client.get("/admin/registry/capabilityversion/").content.decode()
    assert "notify.send" in page and "order.query" not in page and "code.generate" not in page
    teams = client.get("/admin/registry/team/").content.decode()
    assert "platform" in teams and "commerce" not in teams
