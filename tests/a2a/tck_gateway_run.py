"""The A2A TCK (vendored, --level must) against the gateway's A2A door: the card of the example A2A agent
registered from its own card (``reach_import_card``, its versions activated), and the router card.

Not collected by the normal run (its name does not start with ``test_``); ``.ci/a2a-tck`` runs it with
``A2A_TCK_DIR`` pointing at a copy of the TCK with its own venv: ``pytest -s tests/a2a/tck_gateway_run.py``.

The TCK sends no credentials, so it talks to a small proxy that adds a caller token (and streams answers through,
server-sent events included); the proxy passes its own Host on, so the cards the gateway serves point at it.
The gateway node and its worker run with the decision bands at 0 (``REACH_EXECUTE_AT``/``REACH_CONFIRM_AT``): with the example
agent the only registered agent, every TCK text routes to it (a registry "where the TCK's requests route to that
agent"). The TCK's message ids reach the agent unchanged (our request_id is the A2A message id both ways), so
its prefix behaviours are the agent's. Writes ``reports/compatibility-<door>.json`` in ``A2A_TCK_DIR`` and
fails on a MUST failure other than the TCK's own defect CORE-SEND-003 (see README "A2A and MCP").
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import uvicorn
from django.core.management import call_command
from rest_framework.authtoken.models import Token

from registry.embedding import get_embedder
from registry.embedding_service import capability_version_embed
from registry.models import CapabilityVersion
from registry.services import capability_version_activate
from routing import snapshot
from routing.calibration_service import calibration_refresh
from tests.helpers import A2AAgentProcess, WorkerProcess, free_port, token_proxy, wait_http_ok

pytestmark = pytest.mark.django_db(transaction=True)
KNOWN_TCK_DEFECTS = {"CORE-SEND-003"}


def _register_example_agent(url: str) -> str:
    """reach_import_card, then activate and embed its capability versions (the router finds it)."""
    call_command("reach_import_card", url, "--team", "commerce", "--environment", "dev", verbosity=0)
    embedder = get_embedder()
    for version in CapabilityVersion.objects.all():
        capability_version_activate(version=version)
        capability_version_embed(version=CapabilityVersion.objects.get(pk=version.pk), embedder=embedder)
    calibration_refresh()
    snapshot.bump_generation()
    return CapabilityVersion.objects.values_list("capability__agent__endpoint_id", flat=True).first()


def _run_tck(tck: Path, sut: str, door: str) -> dict:
    reports = tck / "reports"
    shutil.rmtree(reports, ignore_errors=True)
    out = subprocess.run([str(tck / ".venv/bin/python"), "run_tck.py", "--sut-host", sut, "--level", "must"], cwd=tck, capture_output=True, text=True, timeout=1800)
    print(f"===== TCK against {door} ({sut})\n{out.stdout[-6000:]}\n{out.stderr[-2000:]}")
    report = json.loads((reports / "compatibility.json").read_text())
    shutil.copy(reports / "compatibility.json", tck / f"compatibility-{door}.json")
    return report["per_requirement"]


def _summary(door: str, reqs: dict) -> list[str]:
    counts = collections.Counter((v["level"], v["status"]) for v in reqs.values())
    print(f"----- {door}: per requirement")
    for level in ("MUST", "SHOULD", "MAY"):
        print(level, {s: n for (lv, s), n in sorted(counts.items()) if lv == level})
    for rid, v in sorted(reqs.items()):
        print(f"  {rid:28} {v['level']:6} {v['status']}")
    failed = sorted(k for k, v in reqs.items() if v["level"] == "MUST" and v["status"] == "FAIL")
    print(f"{door}: MUST failed: {failed}")
    return failed


# every TCK text routes to the one registered agent: on the gateway node and on the worker (async tasks)
ROUTE_EVERYTHING = {"REACH_EXECUTE_AT": "0", "REACH_CONFIRM_AT": "0"}


def test_tck_against_the_gateway(user, gateway_nodes, monkeypatch):
    tck = Path(os.environ.get("A2A_TCK_DIR", ""))
    if not (tck / "run_tck.py").exists() or not (tck / ".venv/bin/python").exists():
        pytest.fail("set A2A_TCK_DIR to a copy of the TCK with its .venv (see .ci/a2a-tck)")
    for name, value in ROUTE_EVERYTHING.items():
        monkeypatch.setenv(name, value)
    agent = A2AAgentProcess().start()
    worker = WorkerProcess().start()
    try:
        endpoint_id = _register_example_agent(agent.url)
        (node,) = gateway_nodes(1)
        token = Token.objects.create(user=user).key
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(token_proxy(node.url, token), host="127.0.0.1", port=port,
                                               log_level="error"))
        threading.Thread(target=server.run, daemon=True).start()
        proxy = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{proxy}/a2a/router/.well-known/agent-card.json", timeout=30, message="the token proxy")
        failures = {}
        for door in (endpoint_id, "router"):
            reqs = _run_tck(tck, f"{proxy}/a2a/{door}", door)
            failures[door] = set(_summary(door, reqs)) - KNOWN_TCK_DEFECTS
        server.should_exit = True
    finally:
        worker.stop()
        agent.stop()
    assert not any(failures.values()), failures
