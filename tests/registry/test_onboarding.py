"""The onboarding page: an agent registered end to end without YAML through the registry's services (audited),
its key shown once on the page and never in the messages cookie, team rules, and the try-routing box."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from registry.models import Agent, AllowlistEntry, AuditLog, CapabilityVersion, Team, hash_key
from routing import snapshot
from tests.factories import InstanceFactory, TeamFactory, agent_client, registration
from tests.reviews.conftest import person
from tests.routing.conftest import registry_ready  # noqa: F401  (shared fixture)

pytestmark = pytest.mark.django_db
URL = "/admin/registry/agent/onboard/"


def form(**overrides) -> dict:
    body = {"endpoint_id": "parcel-agent", "display_name": "Parcel tracker", "description": "Tracks parcels.",
            "team": Team.objects.get_or_create(slug="commerce")[0].pk, "environment": "dev",
            "capability": "parcel.track", "action": "query", "capability_description": "Where a parcel is.",
            "examples": "\n".join(f"where is parcel {n}" for n in range(10)),
            "negative_cases": "write a poem about parcels", "input_schema": '{"type": "object"}',
            "idempotent": "on"}
    body.update(overrides)
    return body


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_admin_onboards_an_agent_and_sees_its_key_once(admin_user):
    client = logged_in(admin_user)
    assert client.get(URL).status_code == 200
    response = client.post(URL, form())
    html = response.content.decode()
    assert response.status_code == 200 and 'id="agent-key"' in html
    key = html.split('<code id="agent-key">')[1].split("</code>")[0]
    entry = AllowlistEntry.objects.get(endpoint_id="parcel-agent")
    assert entry.key_hash == hash_key(key) and key not in entry.key_prefix
    assert key not in str(response.cookies.get("messages", "")) and "no-store" in response["Cache-Control"]
    draft = CapabilityVersion.objects.get(capability__name="parcel.track")
    assert draft.state == "draft" and draft.version == "1.0.0" and len(draft.examples) == 10
    assert draft.capability.agent.team.slug == "commerce" and draft.idempotent
    actions = set(AuditLog.objects.values_list("action", flat=True))
    assert {"allowlist.key_issued", "agent.created", "capability.created", "version.drafted"} <= actions
    # the key works: the agent registers its first instance
    assert agent_client(key).post("/api/v1/agents/register", registration("parcel-agent"),
                                  format="json").status_code == 201


def test_team_member_onboards_for_their_own_team_only(django_user_model):
    TeamFactory(slug="platform")
    member = person(django_user_model, "mia", team="platform", group="agent team member")
    client = logged_in(member)
    commerce = Team.objects.get_or_create(slug="commerce")[0]
    refused = client.post(URL, form(team=commerce.pk))
    assert refused.status_code == 200 and "team" in json.dumps(refused.context["form"].errors)
    assert client.post(URL, form(environment="prod", team=Team.objects.get(slug="platform").pk)).context[
        "form"].errors["environment"]
    assert not Agent.objects.exists()
    done = client.post(URL, form(team=Team.objects.get(slug="platform").pk))
    assert 'id="agent-key"' in done.content.decode()
    assert Agent.objects.get(endpoint_id="parcel-agent").team.slug == "platform"


def test_a_taken_name_is_refused_on_the_page(admin_user):
    client = logged_in(admin_user)
    client.post(URL, form())
    again = client.post(URL, form(capability="parcel.locate"))
    assert "exists already" in again.content.decode() and AllowlistEntry.objects.count() == 1


def test_people_without_a_team_may_not_onboard(django_user_model):
    reviewer = person(django_user_model, "rex", group="reviewer")
    assert logged_in(reviewer).get(URL).status_code == 403


@pytest.mark.usefixtures("registry_ready")
def test_try_routing_answers_with_the_resolvers_dry_run(admin_user):
    InstanceFactory(agent=Agent.objects.get(endpoint_id="order-agent"))  # a live instance: routable (not called)
    snapshot.bump_generation()
    client = logged_in(admin_user)
    answer = client.get(URL + "try/", {"q": "where is my order 12345"}).json()
    assert answer["candidates"][0]["capability"] == "order.query" and answer["candidates"][0]["reasons"]
    assert answer["decision"] in {"execute", "confirm"}
    assert client.get(URL + "try/", {"q": " "}).status_code == 400
