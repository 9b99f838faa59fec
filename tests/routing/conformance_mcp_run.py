"""One-off: the MCP conformance suite against a live gateway node, through a proxy that adds the caller token
(the suite's client sends no credentials). Run: pytest -s tests/routing/conformance_mcp_run.py"""

from __future__ import annotations

import subprocess
import threading
import time

import httpx
import pytest
import uvicorn
from rest_framework.authtoken.models import Token

from tests.helpers import free_port

pytestmark = pytest.mark.django_db(transaction=True)
SCENARIOS = ["server-initialize", "tools-list", "ping", "tools-call-error", "tools-call-simple-text"]


def _proxy(target: str, token: str):
    client = httpx.AsyncClient(timeout=60)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k not in (b"host", b"authorization")]
        r = await client.request(scope["method"], target + scope["path"], content=body,
                                 headers=[*headers, ("authorization", f"Bearer {token}")])
        await send({"type": "http.response.start", "status": r.status_code,
                    "headers": [(k.encode(), v.encode()) for k, v in r.headers.items()
                                if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")]
                    + [(b"content-length", str(len(r.content)).encode())]})
        await send({"type": "http.response.body", "body": r.content})

    return app


def test_conformance(user, running_agents, gateway_nodes):
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_proxy(node.url, token), host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    time.sleep(1.5)
    for scenario in SCENARIOS:
        out = subprocess.run(["npx", "-y", "@modelcontextprotocol/conformance@0.1.10", "server", "--url",
                              f"http://127.0.0.1:{port}/mcp", "--scenario", scenario, "-o", f"/tmp/mcpconf/{scenario}"],
                             capture_output=True, text=True, timeout=180)
        print(f"===== {scenario}\n{out.stdout[-3000:]}\n{out.stderr[-1500:]}")
    server.should_exit = True
