"""Registering an A2A agent from its card (reach_import_card, the admin) against the example A2A agent as a real
server; a card that changes later is flagged, not followed."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from registry.choices import Transport, VersionState
from registry.models import AgentCard, AllowlistEntry, AuditLog, CapabilityVersion, Instance

pytestmark = pytest.mark.django_db


@pytest.fixture
def loopback_allowed(settings):
    settings.REACH = {**settings.REACH, "AGENT_ALLOWED_NETWORKS": ["127.0.0.0/8"]}


def test_import_creates_agent_allowlist_instance_and_one_draft_per_skill(fresh_a2a_agent, loopback_allowed):
    call_command("reach_import_card", fresh_a2a_agent.url, "--team", "commerce", "--environment", "dev",
                 verbosity=0)
    record = AgentCard.objects.get()
    agent = record.agent
    assert (agent.endpoint_id, agent.team.slug, agent.environment.name) == ("order-service-agent", "commerce", "dev")
    assert AllowlistEntry.objects.filter(endpoint_id=agent.endpoint_id, environment__name="dev").exists()
    instance = Instance.objects.get(agent=agent)
    assert (instance.url, instance.transport) == (fresh_a2a_agent.url, Transport.A2A)
    version = CapabilityVersion.objects.get(capability__agent=agent)
    assert (version.capability.name, version.state, version.action) == ("order.query", VersionState.DRAFT, "query")
    assert version.tags == ["order", "shipping"] and version.examples[0] == "where is my order 12345"
    assert version.input_modes == ["text/plain", "application/json"]
    assert record.card["name"] == "Order service agent" and record.rpc_url == fresh_a2a_agent.url
    actions = set(AuditLog.objects.values_list("action", flat=True))
    assert {"agent.created", "allowlist.created", "instance.registered", "version.drafted",
            "a2a_card.registered"} <= actions
    with pytest.raises(CommandError, match="exists already"):  # not imported twice
        call_command("reach_import_card", fresh_a2a_agent.url, "--team", "commerce", verbosity=0)


def test_the_address_guard_refuses_a_private_card_url(fresh_a2a_agent, settings):
    settings.REACH = {**settings.REACH, "AGENT_ALLOWED_NETWORKS": []}
    with pytest.raises(CommandError, match="card URL resolves to non-public address 127.0.0.1"):
        call_command("reach_import_card", fresh_a2a_agent.url, verbosity=0)
    assert not AgentCard.objects.exists()


def test_a_changed_card_is_flagged_not_followed(fresh_a2a_agent, loopback_allowed, capsys):
    call_command("reach_import_card", fresh_a2a_agent.url, "--team", "commerce", verbosity=0)
    call_command("reach_import_card", "--check")
    assert "as registered" in capsys.readouterr().out
    assert not AgentCard.objects.get().flagged

    fresh_a2a_agent.set_faults(card_url="http://127.0.0.1:1", extra_skill="order.refund")
    call_command("reach_import_card", "--check")
    record = AgentCard.objects.get()
    assert record.flagged and "http://127.0.0.1:1" in record.flag_reason and "order.refund" in record.flag_reason
    assert AuditLog.objects.filter(action="a2a_card.changed", target_id=str(record.pk)).count() == 1
    # nothing followed: the instance keeps the registered URL, no capability for the new skill
    assert Instance.objects.get(agent=record.agent).url == fresh_a2a_agent.url
    assert list(CapabilityVersion.objects.values_list("capability__name", flat=True)) == ["order.query"]
    call_command("reach_import_card", "--check")  # the same change is recorded once
    assert AuditLog.objects.filter(action="a2a_card.changed").count() == 1


def test_admin_imports_from_a_card_and_shows_flagged_cards(fresh_a2a_agent, loopback_allowed, admin_client):
    from registry.models import Team

    team = Team.objects.create(slug="commerce", name="Commerce")
    page = admin_client.get("/admin/registry/agentcard/add/")
    assert page.status_code == 200 and "Agent URL" in page.content.decode()
    response = admin_client.post("/admin/registry/agentcard/add/",
                                 {"url": fresh_a2a_agent.url, "team": team.pk, "environment": "dev"})
    assert response.status_code == 302, response.content.decode()[:2000]
    record = AgentCard.objects.get()
    assert record.agent.team == team

    bad = admin_client.post("/admin/registry/agentcard/add/",
                            {"url": "http://127.0.0.1:1", "team": team.pk, "environment": "dev"})
    assert bad.status_code == 200 and "Could not fetch the agent card" in bad.content.decode()

    fresh_a2a_agent.set_faults(card_name="Someone else")
    admin_client.post("/admin/registry/agentcard/", {"action": "check_cards", "_selected_action": [record.pk]})
    listing = admin_client.get("/admin/registry/agentcard/").content.decode()
    assert "serves a card that differs from the registered one" in listing and "Someone else" in listing


def test_a_team_member_may_not_import_into_another_team(fresh_a2a_agent, loopback_allowed, django_user_model):
    from reach_platform.errors import PermissionDenied
    from registry.a2a_cards import agent_card_import
    from registry.models import Team

    Team.objects.create(slug="commerce", name="Commerce")
    outsider = django_user_model.objects.create_user(username="outsider", password="pw-outsider-1")
    with pytest.raises(PermissionDenied):
        agent_card_import(url=fresh_a2a_agent.url, team="commerce", environment="dev", actor=outsider)
    assert not AgentCard.objects.exists()
