"""Agent self-service API: every registration rule, each refusal a clear 4xx."""

from __future__ import annotations

import pytest

from registry.choices import Liveness
from registry.models import AuditLog, Instance
from tests.factories import agent_client, allowlisted, registration

pytestmark = pytest.mark.django_db

REGISTER = "/api/v1/agents/register"


def test_register_creates_agent_and_instance_with_audit():
    # given an endpoint allowlisted in dev
    client = agent_client(allowlisted("order-agent"))
    # when it registers
    response = client.post(REGISTER, registration("order-agent"), format="json")
    # then the instance is ONLINE and the change is audited
    assert response.status_code == 201, response.json()
    instance = Instance.objects.get(agent__endpoint_id="order-agent")
    assert instance.liveness == Liveness.ONLINE
    assert AuditLog.objects.filter(action="instance.registered", target_id=str(instance.pk)).exists()


def test_unknown_key_is_refused():
    response = agent_client("ar_not-a-key").post(REGISTER, registration("order-agent"), format="json")
    assert response.status_code in (401, 403)
    assert "agent key" in response.json()["error"]["message"].lower()


def test_caller_token_cannot_register(api):
    response = api.post(REGISTER, registration("order-agent"), format="json")
    assert response.status_code == 401
    assert "Agent" in response["WWW-Authenticate"]


def test_endpoint_not_allowlisted_for_environment_is_refused():
    # given a key allowlisted only for dev
    client = agent_client(allowlisted("order-agent", environment="dev"))
    # when it tries to register into prod
    response = client.post(REGISTER, registration("order-agent", environment="prod"), format="json")
    # then it is refused with a clear reason
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "not_allowlisted"
    assert "prod" in response.json()["error"]["message"]
    assert not Instance.objects.exists()


def test_other_endpoint_id_with_my_key_is_refused():
    client = agent_client(allowlisted("order-agent"))
    response = client.post(REGISTER, registration("billing-agent"), format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "not_allowlisted"


def test_registration_may_not_overwrite_another_environments_agent():
    # given order-agent registered in prod
    prod = agent_client(allowlisted("order-agent", environment="prod"))
    assert prod.post(REGISTER, registration("order-agent", environment="prod"), format="json").status_code == 201
    # when a dev registration of the same endpoint id arrives (seed incident: dev agent took prod traffic)
    dev = agent_client(allowlisted("order-agent", environment="dev"))
    response = dev.post(REGISTER, registration("order-agent", environment="dev", port=9998), format="json")
    # then it is refused and prod is untouched
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "environment_conflict"
    assert Instance.objects.get().agent.environment.name == "prod"


def test_address_of_another_environment_is_refused():
    prod = agent_client(allowlisted("order-agent", environment="prod"))
    prod.post(REGISTER, registration("order-agent", environment="prod", port=9000), format="json")
    dev = agent_client(allowlisted("ocr-agent", environment="dev"))
    response = dev.post(REGISTER, registration("ocr-agent", environment="dev", port=9000), format="json")
    assert response.status_code == 409
    assert "prod" in response.json()["error"]["message"]


def test_older_reg_version_is_refused():
    client = agent_client(allowlisted("order-agent"))
    assert client.post(REGISTER, registration("order-agent", reg_version=5), format="json").status_code == 201
    response = client.post(REGISTER, registration("order-agent", reg_version=4, url="http://127.0.0.1:1/x"),
                           format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale_registration"
    assert Instance.objects.get().url == "http://127.0.0.1:9999/invoke"


def test_newer_start_replaces_stale_address_on_port_drift():
    client = agent_client(allowlisted("order-agent"))
    # given instance A holding port 9100
    client.post(REGISTER, registration("order-agent", instance_id="a", port=9100,
                                       started_at="2026-11-29T10:00:00Z"), format="json")
    # when instance B, started later, comes up on the same address
    response = client.post(REGISTER, registration("order-agent", instance_id="b", port=9100,
                                                  started_at="2026-11-29T11:00:00Z"), format="json")
    # then B wins and A is taken out
    assert response.status_code == 201
    a = Instance.objects.get(instance_id="a")
    assert a.deregistered_at is not None and a.liveness == Liveness.OFFLINE
    assert AuditLog.objects.filter(action="instance.replaced", target_id=str(a.pk)).exists()


def test_older_start_cannot_take_a_newer_instances_address():
    client = agent_client(allowlisted("order-agent"))
    client.post(REGISTER, registration("order-agent", instance_id="b", port=9100,
                                       started_at="2026-11-29T11:00:00Z"), format="json")
    response = client.post(REGISTER, registration("order-agent", instance_id="a", port=9100,
                                                  started_at="2026-11-29T10:00:00Z"), format="json")
    assert response.status_code == 409
    assert Instance.objects.get(instance_id="b").deregistered_at is None


def test_bad_body_is_a_400_with_field_details():
    client = agent_client(allowlisted("order-agent"))
    response = client.post(REGISTER, {"endpoint_id": "order-agent", "url": "not a url"}, format="json")
    assert response.status_code == 400
    details = response.json()["error"]["details"]
    assert "url" in details and "reg_version" in details


def test_malformed_json_is_a_400():
    client = agent_client(allowlisted("order-agent"))
    response = client.post(REGISTER, data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_json"


def test_heartbeat_records_load_and_deregister_takes_instance_out():
    client = agent_client(allowlisted("order-agent"))
    client.post(REGISTER, registration("order-agent"), format="json")
    Instance.objects.update(liveness=Liveness.SUSPECT)
    response = client.post("/api/v1/agents/heartbeat", {"instance_id": "127.0.0.1:9999", "in_flight": 3,
                                                        "load": 0.4}, format="json")
    assert response.status_code == 200
    instance = Instance.objects.get()
    assert (instance.in_flight, instance.load, instance.liveness) == (3, 0.4, Liveness.ONLINE)
    response = client.post("/api/v1/agents/deregister", {"instance_id": "127.0.0.1:9999"}, format="json")
    assert response.status_code == 200
    instance.refresh_from_db()
    assert instance.deregistered_at is not None and instance.liveness == Liveness.OFFLINE
    # a heartbeat after deregistration asks the agent to register again
    response = client.post("/api/v1/agents/heartbeat", {"instance_id": "127.0.0.1:9999"}, format="json")
    assert response.status_code == 409


def test_heartbeat_for_unknown_instance_is_404():
    client = agent_client(allowlisted("order-agent"))
    response = client.post("/api/v1/agents/heartbeat", {"instance_id": "nope"}, format="json")
    assert response.status_code == 404
