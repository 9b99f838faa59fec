"""The MCP server at /mcp on a live gateway node, driven by the official mcp client."""

from __future__ import annotations

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from rest_framework.authtoken.models import Token

from registry.choices import VersionState
from registry.models import CapabilityVersion
from routing.models import Task
from tests.helpers import run_async

pytestmark = pytest.mark.django_db(transaction=True)


async def _session(url: str, token: str, work):
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, streamable_http_client(f"{url}/mcp", http_client=client) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)


def test_tools_list_is_the_active_capabilities_and_route(user, running_agents, gateway_nodes):
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    result = run_async(_session(node.url, token, lambda s: s.list_tools()))
    tools = {tool.name: tool for tool in result.tools}
    active = set(CapabilityVersion.objects.filter(state=VersionState.ACTIVE).values_list("capability__name",
                                                                                           flat=True))
    assert set(tools) == active | {"route"}
    order = tools["order.query"]
    version = CapabilityVersion.objects.get(capability__name="order.query", state=VersionState.ACTIVE)
    assert order.description == version.description
    assert order.input_schema == version.input_schema and order.output_schema == version.output_schema
    assert tools["route"].input_schema["required"] == ["task"]


def test_tools_call_is_a_sync_invoke_with_structured_content(user, running_agents, gateway_nodes):
    agents = running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key

    async def calls(session):
        return (await session.call_tool("order.query", {"order_id": "12"}),
                await session.call_tool("route", {"task": "where is my order 12345", "payload": {"order_id": "7"}}),
                await session.call_tool("no.such.capability", {}))

    direct, routed, unknown = run_async(_session(node.url, token, calls))
    assert not direct.is_error
    assert direct.structured_content["answer"] == 'order-agent handled order.query: {"order_id": "12"}'
    assert not routed.is_error and routed.structured_content["agent"] == "order-agent"
    assert routed.structured_content["result"]["answer"].endswith('{"order_id": "7"}')
    assert unknown.is_error and "no.such.capability" in unknown.content[0].text
    # the calls are normal tasks of the caller, executed once each
    assert Task.objects.filter(caller=user, status="succeeded").count() == 2
    assert sum(agents.stats("order-agent")["executions"].values()) == 2

    agents.set_faults("order-agent", fail_rate=1.0, fail_status=400)
    failed = run_async(_session(node.url, token, lambda s: s.call_tool("order.query", {"order_id": "1"})))
    assert failed.is_error and "failed" in failed.content[0].text


def test_mcp_needs_a_caller_token(user, running_agents, gateway_nodes):
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        r = httpx.post(f"{node.url}/mcp", json=body, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "authentication_failed"
