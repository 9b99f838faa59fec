"""The MCP conformance suite (``npx @modelcontextprotocol/conformance@0.1.10 server``) against a live gateway node:
run by ``.ci/mcp-conformance`` (not collected by ``make test``: the file name does not start with ``test_``).

Set-up, all real: the fixture agent ``examples/conformance/mcp-fixture-agent.yaml`` (its capabilities are the
tools the suite's tools-call scenarios call by name) imported, activated and embedded, served by
``examples/agents/server.py`` and registered through the agent API; one gateway node (uvicorn, as production
serves it) on the test database; a caller token. The suite's client sends no credentials, so it talks to a small
streaming proxy that adds ``Authorization: Bearer <token>`` and notes the protocol revision each initialize
negotiated. Prints every check and fails on any FAILURE.

The elicitation and sampling scenarios' tools are the skills of an A2A agent (``examples/a2a_agent.py`` with
``examples/a2a/mcp-fixture-a2a-agent.yaml``) registered from its agent card (``registry.a2a_cards``): its
input-required questions are relayed to the suite's client as ``elicitation/create`` / ``sampling/createMessage``.

Revisions: suite 0.1.10 speaks the 2025-11-25 revision (its client's latest); it has no 2026-07-28 scenarios
(its later releases need Node 22). The 2026-07-28 wire is checked with the official Python client in
tests/routing/test_mcp.py (list, call, subscriptions/listen).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
import uvicorn
from django.core.management import call_command
from rest_framework.authtoken.models import Token

from registry.choices import VersionState
from registry.embedding import get_embedder
from registry.embedding_service import capability_version_embed
from registry.models import CapabilityVersion
from routing import snapshot
from routing.calibration_service import calibration_refresh
from tests.factories import agent_client, allowlisted
from tests.helpers import (
    BASE,
    MCP_FIXTURE_A2A,
    A2AAgentProcess,
    AgentProcess,
    GatewayProcess,
    a2a_agent_registered_from_card,
    free_port,
    token_proxy,
    wait_http_ok,
)

pytestmark = pytest.mark.django_db(transaction=True)
SUITE = "@modelcontextprotocol/conformance@0.1.10"
FIXTURES = BASE / "examples" / "conformance"
AGENT = "mcp-fixture-agent"
SCENARIOS = ["server-initialize", "ping", "tools-list", "tools-call-simple-text", "tools-call-image",
             "tools-call-audio", "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-error",
             # the gateway's own step notifications of every call (routing.mcp_server.Steps)
             "tools-call-with-logging", "tools-call-with-progress",
             # an A2A agent's input-required question relayed to the client (routing.mcp_server.ask_client)
             "tools-call-elicitation", "tools-call-sampling"]
# tools-call scenarios not run, and why (printed with the report)
NOT_RUN: dict[str, str] = {}


def _revision_of(revisions: list[str]):
    """The proxy's ``on_answer``: the protocol revision an initialize answer negotiated (JSON or SSE)."""

    def seen(request: bytes, answer: bytes) -> None:
        if b'"initialize"' not in request or not answer:
            return
        text = answer.decode("utf-8", "replace")
        payload = text[text.find("{"):] if "data:" in text else text
        try:
            revisions.append(json.loads(payload.splitlines()[0] if "data:" in text else payload)
                             ["result"]["protocolVersion"])
        except (ValueError, KeyError, TypeError):
            pass

    return seen


def _fixture_agent_ready(tmp: Path) -> AgentProcess:
    call_command("reach_import", str(FIXTURES), verbosity=0)
    CapabilityVersion.objects.filter(capability__agent__endpoint_id=AGENT).update(state=VersionState.ACTIVE)
    embedder = get_embedder()
    for version in CapabilityVersion.objects.filter(capability__agent__endpoint_id=AGENT):
        capability_version_embed(version=version, embedder=embedder)
    calibration_refresh()
    proc = AgentProcess([AGENT], descriptors=FIXTURES, tmp=tmp).start()
    base = proc.url(AGENT)
    response = agent_client(allowlisted(AGENT, team="conformance")).post("/api/v1/agents/register", {
        "endpoint_id": AGENT, "environment": "dev", "instance_id": base, "url": f"{base}/invoke",
        "health_url": f"{base}/health", "reg_version": 1, "max_concurrency": 8, "max_qps": 1000}, format="json")
    assert response.status_code == 201, response.json()
    snapshot.bump_generation()
    return proc


def _checks(out: Path) -> list[dict]:
    found = sorted(out.rglob("checks.json"))
    return json.loads(found[-1].read_text()) if found else []


def test_mcp_conformance(user, tmp_path):
    agent = _fixture_agent_ready(tmp_path)
    asking = A2AAgentProcess(MCP_FIXTURE_A2A).start()  # test_elicitation, test_sampling: registered from its card
    assert sorted(a2a_agent_registered_from_card(asking.url)) == ["test_elicitation", "test_sampling"]
    node = GatewayProcess(LOG_LEVEL="WARNING").start()
    token = Token.objects.create(user=user).key
    revisions: list[str] = []
    port = free_port()
    proxy = uvicorn.Server(uvicorn.Config(token_proxy(node.url, token, keep_host=False,
                                                      on_answer=_revision_of(revisions)), host="127.0.0.1", port=port,
                                          log_level="error", lifespan="off"))
    threading.Thread(target=proxy.run, daemon=True).start()
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/admin/login/", timeout=30, message="the auth proxy")
        rows, failed = [], []
        for scenario in SCENARIOS:
            out = Path(tempfile.mkdtemp(prefix=f"mcpconf-{scenario}-", dir=tmp_path))
            run = subprocess.run(["npx", "-y", SUITE, "server", "--url", f"http://127.0.0.1:{port}/mcp",
                                  "--scenario", scenario, "-o", str(out)],
                                 capture_output=True, text=True, timeout=300)
            checks = _checks(out)
            if not checks:
                failed.append(f"{scenario}: no checks (exit {run.returncode}): {run.stdout[-800:]} {run.stderr[-800:]}")
            for check in checks:
                if check.get("status") in ("INFO",):
                    continue
                rows.append((scenario, check.get("id", "?"), check.get("status", "?"), check.get("errorMessage") or ""))
                if check.get("status") == "FAILURE":
                    failed.append(f"{scenario}/{check.get('id')}: {check.get('errorMessage')}")
            if run.returncode != 0 and not any(r[0] == scenario and r[2] == "FAILURE" for r in rows):
                failed.append(f"{scenario}: the suite exited {run.returncode}: {run.stdout[-800:]}")
    finally:
        proxy.should_exit = True
        node.stop()
        agent.stop()
        asking.stop()
    print(f"\nMCP conformance ({SUITE}), protocol revision negotiated: {sorted(set(revisions)) or '?'}")
    for scenario, check, status, error in rows:
        print(f"  {status:8} {scenario:32} {check}{'  ' + error if error else ''}")
    counts: dict[str, int] = {}
    for _, _, status, _ in rows:
        counts[status] = counts.get(status, 0) + 1
    print(f"  checks: {counts}")
    for scenario, why in NOT_RUN.items():
        print(f"  not run  {scenario:32} {why}")
    assert not failed, "\n".join(failed)
    assert set(revisions) == {"2025-11-25"}
