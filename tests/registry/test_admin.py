from __future__ import annotations

import pytest
from django.core.management import call_command

from registry.models import Agent, CapabilityVersion, Instance
from tests.factories import agent_client, allowlisted, registration

pytestmark = pytest.mark.django_db


@pytest.fixture
def populated():
    call_command("reach_import", "examples/descriptors", verbosity=0)
    agent_client(allowlisted("order-agent")).post("/api/v1/agents/register", registration("order-agent"),
                                                  format="json")


def test_admin_pages_load_for_a_superuser(admin_client, populated):
    agent = Agent.objects.get(endpoint_id="order-agent")
    version = CapabilityVersion.objects.get(capability__name="order.query")
    instance = Instance.objects.get()
    pages = ["/admin/", "/admin/registry/agent/", f"/admin/registry/agent/{agent.pk}/change/",
             "/admin/registry/instance/", f"/admin/registry/instance/{instance.pk}/change/",
             "/admin/registry/capabilityversion/", f"/admin/registry/capabilityversion/{version.pk}/change/",
             "/admin/registry/auditlog/", "/admin/registry/allowlistentry/", "/admin/registry/capability/",
             "/admin/registry/agent/?environment__id__exact=1", "/admin/registry/agent/?q=order"]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page
    listing = admin_client.get("/admin/registry/agent/").content.decode()
    assert "order-agent" in listing and "ONLINE" in listing


def test_admin_refuses_anonymous(client):
    response = client.get("/admin/registry/agent/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_audit_log_is_read_only(admin_client, populated):
    assert admin_client.get("/admin/registry/auditlog/add/").status_code == 403
