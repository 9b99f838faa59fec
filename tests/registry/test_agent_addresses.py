"""Agents may register only addresses the guard allows, and a health check must answer 2xx (issue 12, item 7)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from registry.models import Instance
from registry.services import probe_health
from tests.factories import agent_client, allowlisted, registration
from tests.helpers import free_port

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("field, url", [
    ("url", "http://169.254.169.254/latest/meta-data/"),
    ("health_url", "http://169.254.169.254/health"),
    ("status_url", "http://10.1.2.3/status"),
    ("url", "http://[::ffff:a9fe:a9fe]/"),
])
def test_registration_refuses_internal_addresses(field, url):
    agent = agent_client(allowlisted("order-agent"))
    response = agent.post("/api/v1/agents/register", registration("order-agent", **{field: url}))
    assert response.status_code == 400 and response.json()["error"]["code"] == "agent_url_refused"
    assert not Instance.objects.exists()


def test_loopback_agents_register_only_where_allowed(settings):
    agent = agent_client(allowlisted("order-agent"))
    settings.REACH = {**settings.REACH, "AGENT_ALLOWED_NETWORKS": []}
    refused = agent.post("/api/v1/agents/register", registration("order-agent"))
    assert refused.status_code == 400 and "REACH_AGENT_ALLOWED_NETWORKS" in refused.json()["error"]["message"]
    settings.REACH = {**settings.REACH, "AGENT_ALLOWED_NETWORKS": ["127.0.0.0/8"]}
    assert agent.post("/api/v1/agents/register", registration("order-agent")).status_code == 201


@pytest.fixture
def health_server():
    state = {"status": 200}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            return

        def do_GET(self):
            self.send_response(state["status"])
            self.send_header("Location", "/admin/login/")
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/health", state
    httpd.shutdown()


def test_a_redirect_is_not_health(health_server, settings):
    url, state = health_server
    assert probe_health(url) is True
    state["status"] = 302
    assert probe_health(url) is False
    state["status"] = 200
    settings.REACH = {**settings.REACH, "AGENT_ALLOWED_NETWORKS": []}
    assert probe_health(url) is False  # the prober applies the guard too
