from __future__ import annotations

import pytest
from django.core.management import call_command

from registry.choices import VersionState
from registry.embedding import get_embedder
from registry.embedding_service import capability_version_embed
from registry.models import CapabilityVersion, Instance
from routing import snapshot
from routing.calibration_service import calibration_refresh
from tests.factories import agent_client, allowlisted


@pytest.fixture
def registry_ready(db, settings):
    """The example descriptors imported, ACTIVE, embedded with the default embedder and calibrated."""
    settings.REACH = {**settings.REACH, "RECALIBRATE_INLINE": True}
    # Activated here rather than with --activate: activation enqueues the embedding for a worker, and a worker
    # left running by another test would re-embed and recalibrate while this test runs.
    call_command("reach_import", "examples/descriptors", verbosity=0)
    CapabilityVersion.objects.update(state=VersionState.ACTIVE)
    embedder = get_embedder()
    for version in CapabilityVersion.objects.all():
        capability_version_embed(version=version, embedder=embedder)
    calibration_refresh()
    snapshot.clear_caches()
    return CapabilityVersion.objects.all()


def register_agents(proc, agents: list[str], keys: dict | None = None) -> None:
    """Register one instance of each of ``proc``'s agents through the agent API (in-process)."""
    for endpoint_id in agents:
        base = proc.url(endpoint_id)
        body = {"endpoint_id": endpoint_id, "environment": "dev", "instance_id": base, "url": f"{base}/invoke",
                "health_url": f"{base}/health", "reg_version": 1, "max_concurrency": 8, "max_qps": 1000}
        body["transport"] = "http-async" if endpoint_id == "ocr-agent" else "http"
        key = (keys or {}).get(endpoint_id) or allowlisted(endpoint_id, team=_team(endpoint_id))
        response = agent_client(key).post("/api/v1/agents/register", body, format="json")
        assert response.status_code == 201, response.json()
    snapshot.bump_generation()


@pytest.fixture
def running_agents(registry_ready, agent_procs):
    """Start example agents and register their instances (through the agent API, in-process)."""

    def start(agents: list[str], **kwargs):
        proc = agent_procs(agents, **kwargs)
        register_agents(proc, agents, kwargs.get("keys"))
        return proc

    return start


def _team(endpoint_id: str) -> str:
    return {"order-agent": "commerce", "doc-summary-agent": "knowledge", "weekly-report-agent": "analytics",
            "ocr-agent": "vision", "codegen-agent": "devtools", "notify-agent": "platform"}[endpoint_id]


def instance_of(endpoint_id: str) -> Instance:
    return Instance.objects.get(agent__endpoint_id=endpoint_id, deregistered_at__isnull=True)
