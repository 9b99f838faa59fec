from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.factories import agent_client, allowlisted, registration

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader(django_user_model):
    """A reviewer: reads every team's registry (plain callers see ACTIVE versions only, see test_read_scopes)."""
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user("reader", password="pw-reader-123")
    user.groups.add(Group.objects.get(name="reviewer"))
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def imported():
    from django.core.management import call_command

    call_command("reach_import", "examples/descriptors", verbosity=0)


@pytest.mark.parametrize("path", ["/api/v1/agents/", "/api/v1/instances/", "/api/v1/capability-versions/"])
def test_read_api_refuses_anonymous_calls(path):
    response = APIClient().get(path)
    assert response.status_code in (401, 403)
    assert "error" in response.json()


def test_agents_filter_by_team_and_environment(reader, imported):
    response = reader.get("/api/v1/agents/", {"team": "commerce", "environment": "dev"})
    assert response.status_code == 200
    assert [a["endpoint_id"] for a in response.json()["results"]] == ["order-agent"]
    assert reader.get("/api/v1/agents/", {"environment": "prod"}).json()["count"] == 0


def test_capability_versions_filter_by_action_domain_and_text(reader, imported):
    by_action = reader.get("/api/v1/capability-versions/", {"action": "generate"}).json()
    assert {v["capability"] for v in by_action["results"]} == {"report.weekly", "code.generate"}
    by_domain = reader.get("/api/v1/capability-versions/", {"domain": "vision"}).json()
    assert [v["capability"] for v in by_domain["results"]] == ["ocr.extract"]
    by_text = reader.get("/api/v1/capability-versions/", {"q": "notif"}).json()
    assert [v["capability"] for v in by_text["results"]] == ["notify.send"]


def test_instances_filter_by_liveness(reader):
    agent_client(allowlisted("order-agent")).post("/api/v1/agents/register", registration("order-agent"),
                                                  format="json")
    assert reader.get("/api/v1/instances/", {"liveness": "online"}).json()["count"] == 1
    assert reader.get("/api/v1/instances/", {"liveness": "offline"}).json()["count"] == 0


def test_agent_detail_by_endpoint_id(reader, imported):
    response = reader.get("/api/v1/agents/notify-agent/")
    assert response.status_code == 200 and response.json()["team"] == "platform"
    assert reader.get("/api/v1/agents/missing-agent/").status_code == 404


def test_openapi_schema_and_docs(api, admin_client):
    schema = api.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/agents/register" in schema.content
    docs = admin_client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
