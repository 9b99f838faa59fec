"""Canary releases against real agent processes: a canary doing worse than the stable version is rolled back by
real traffic; promoting one retires the old version."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from registry.choices import VersionState
from registry.embedding import get_embedder
from registry.embedding_service import capability_version_embed
from registry.models import AuditLog, CapabilityVersion
from registry.services import capability_version_draft_create
from reviews import services
from routing import snapshot
from routing.models import Attempt
from tests.factories import agent_client, allowlisted
from tests.reviews.conftest import as_user, person

pytestmark = pytest.mark.django_db(transaction=True)
ORDER = {"capability": "order.query", "payload": {"order_id": "1"}}


def canary_of_order_query(people, share: float) -> CapabilityVersion:
    stable = CapabilityVersion.objects.get(capability__name="order.query", state=VersionState.ACTIVE)
    draft = capability_version_draft_create(capability=stable.capability, actor=people["member"], version="2.0.0")
    services.capability_version_submit(version=draft, actor=people["member"])
    canary = services.capability_version_approve(version=draft, actor=people["reviewer"], confidence_weight=1.0,
                                                 canary_share=share)
    capability_version_embed(version=canary, embedder=get_embedder())  # inline, not through a worker
    snapshot.bump_generation()
    return canary


def register(proc, key: str, versions: list[str]) -> None:
    base = proc.url("order-agent")
    body = {"endpoint_id": "order-agent", "environment": "dev", "instance_id": base, "url": f"{base}/invoke",
            "health_url": f"{base}/health", "reg_version": 1, "max_concurrency": 8, "max_qps": 1000,
            "versions": versions}
    response = agent_client(key).post("/api/v1/agents/register", body, format="json")
    assert response.status_code == 201, response.json()


def test_failing_canary_is_rolled_back_by_real_traffic(people, registry_ready, agent_procs, api, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.001, "BACKOFF_JITTER_S": 0.001,
                      "BREAKER_MIN_REQUESTS": 10_000, "BREAKER_CONSECUTIVE_FAILURES": 10_000, "CANARY_MIN_SAMPLE": 20}
    key = allowlisted("order-agent", team="commerce")
    stable_proc, canary_proc = agent_procs(["order-agent"]), agent_procs(["order-agent"])
    canary_proc.set_faults("order-agent", fail_rate=1.0, fail_status=500)
    register(stable_proc, key, ["1.0.0"])
    register(canary_proc, key, ["2.0.0"])
    canary = canary_of_order_query(people, share=0.5)

    outcomes = []
    deadline = time.time() + 60
    while time.time() < deadline:
        outcomes.append(api.post("/api/v1/invoke", ORDER, format="json").json()["status"])
        canary.refresh_from_db()
        if canary.rolled_back:
            break
    assert canary.rolled_back and canary.state == VersionState.RETIRED, outcomes
    assert "failed" in outcomes and "succeeded" in outcomes  # both versions really took traffic
    assert Attempt.objects.filter(version=canary).count() >= 20
    row = AuditLog.objects.get(action="version.rolled_back", target_id=str(canary.pk))
    assert row.actor_label == "system:canary" and "success rate" in row.after["reason"]
    stable = CapabilityVersion.objects.get(capability__name="order.query", version="1.0.0")
    assert stable.state == VersionState.ACTIVE

    # after the rollback every request goes to the stable version and the failing copy gets nothing
    before = sum(canary_proc.stats("order-agent")["by_capability"].values())
    assert all(api.post("/api/v1/invoke", ORDER, format="json").json()["status"] == "succeeded" for _ in range(10))
    assert sum(canary_proc.stats("order-agent")["by_capability"].values()) == before

    # the team is told: the admin index shows the rollback to the owning team's members
    client = Client()
    client.force_login(people["member"])
    page = client.get("/admin/").content.decode()
    assert "Canary rolled back" in page and "order.query@2.0.0" in page


def test_healthy_canary_is_kept_and_promotion_retires_the_old_version(people, registry_ready, agent_procs, api,
                                                                      settings):
    settings.REACH = {**settings.REACH, "CANARY_MIN_SAMPLE": 10}
    key = allowlisted("order-agent", team="commerce")
    register(agent_procs(["order-agent"]), key, [])  # one copy serving every version
    canary = canary_of_order_query(people, share=0.5)
    for _ in range(30):
        assert api.post("/api/v1/invoke", ORDER, format="json").json()["status"] == "succeeded"
    assert Attempt.objects.filter(version=canary).count() >= 5  # it took its share
    assert services.canary_evaluate(canary.pk) is False
    stats = as_user(people["reviewer"]).get(f"/api/v1/capability-versions/{canary.pk}/canary").json()
    assert stats["canary"]["success_rate"] == 1.0 and stats["verdict"] is None

    # only a reviewer promotes
    assert as_user(people["member"]).post(f"/api/v1/capability-versions/{canary.pk}/promote").status_code == 403
    r = as_user(people["reviewer"]).post(f"/api/v1/capability-versions/{canary.pk}/promote")
    assert r.status_code == 200 and r.json()["is_canary"] is False and r.json()["state"] == "active"
    old = CapabilityVersion.objects.get(capability__name="order.query", version="1.0.0")
    assert old.state == VersionState.RETIRED
    assert AuditLog.objects.filter(action="version.promoted", target_id=str(canary.pk)).exists()
    # a canary needs a stable version to be compared with
    draft = capability_version_draft_create(capability=canary.capability, actor=people["member"], version="3.0.0")
    services.capability_version_submit(version=draft, actor=people["member"])
    CapabilityVersion.objects.filter(pk=canary.pk).update(state=VersionState.RETIRED)
    other = person(type(people["member"]), "rev2", group="reviewer")
    r = as_user(other).post(f"/api/v1/capability-versions/{draft.pk}/approve",
                            {"confidence_weight": 1, "canary_share": 0.2}, format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_stable_version"
