"""The MCP server at /mcp on a live gateway node, driven by the official mcp client."""

from __future__ import annotations

import asyncio
import json

import httpx
import httpx2
import mcp.types as types
import pytest
from mcp.client.client import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.subscriptions import ToolsListChanged
from rest_framework.authtoken.models import Token

from registry.choices import VersionState
from registry.models import CapabilityVersion
from registry.services import capability_version_activate
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


def _new_version_of(name: str) -> CapabilityVersion:
    """A DRAFT 1.1.0 of an ACTIVE capability, with a new description (what the tool list shows)."""
    active = CapabilityVersion.objects.get(capability__name=name, state=VersionState.ACTIVE)
    active.pk = None
    active.version, active.state, active.description = "1.1.0", VersionState.DRAFT, "Orders, now with refunds."
    active.save()
    return active


def test_list_changed_on_the_get_stream_of_a_2025_session(user, running_agents, gateway_nodes):
    """2025-11-25: the session that listed the tools hears notifications/tools/list_changed on its GET stream
    when a version is activated through the service layer (on this or any node)."""
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    draft = _new_version_of("order.query")

    async def scenario():
        stream_open, changed = asyncio.Event(), asyncio.Event()

        async def on_response(response):
            if response.request.method == "GET" and response.status_code == 200:
                stream_open.set()  # the standalone SSE stream the notification rides

        async def on_message(message):
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                    event_hooks={"response": [on_response]}, timeout=httpx2.Timeout(30, read=300))
        async with client, streamable_http_client(f"{node.url}/mcp", http_client=client) as (read, write, *_):
            async with ClientSession(read, write, message_handler=on_message) as session:
                init = await session.initialize()
                before = await session.list_tools()
                called = await session.call_tool("order.query", {"order_id": "3"})
                await asyncio.wait_for(stream_open.wait(), 15)
                await asyncio.to_thread(_activate, draft)
                await asyncio.wait_for(changed.wait(), 15)
                after = await session.list_tools()
        return init, before, called, after

    init, before, called, after = run_async(scenario())
    assert init.protocol_version == "2025-11-25" and init.capabilities.tools.list_changed is True
    assert not called.is_error
    describe = {t.name: t.description for t in before.tools}, {t.name: t.description for t in after.tools}
    assert describe[0]["order.query"] != "Orders, now with refunds."
    assert describe[1]["order.query"] == "Orders, now with refunds."


def _activate(version: CapabilityVersion) -> None:
    from django.db import connection

    try:
        capability_version_activate(version=version)
    finally:
        connection.close()  # this thread's connection, before the test database is flushed


def test_list_changed_on_a_2026_listen_stream(user, running_agents, gateway_nodes):
    """2026-07-28 (no session): list and call, then a subscriptions/listen stream gets the tools event when a
    version is activated, and the next list shows the new version."""
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    draft = _new_version_of("order.query")

    async def scenario():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(f"{node.url}/mcp", http_client=http),
                                mode="2026-07-28") as client:
            before = await client.list_tools()
            called = await client.call_tool("order.query", {"order_id": "4"})
            async with client.listen(tools_list_changed=True) as subscription:
                await asyncio.to_thread(_activate, draft)
                event = await asyncio.wait_for(anext(aiter(subscription)), 15)
            after = await client.list_tools()
            return client.protocol_version, before, called, event, after

    version, before, called, event, after = run_async(scenario())
    assert version == "2026-07-28"
    assert not called.is_error and called.structured_content["answer"].endswith('{"order_id": "4"}')
    assert isinstance(event, ToolsListChanged)
    assert {t.name: t.description for t in after.tools}["order.query"] == "Orders, now with refunds."
    assert {t.name: t.description for t in before.tools}["order.query"] != "Orders, now with refunds."


def test_a_session_belongs_to_the_caller_that_opened_it(user, django_user_model, running_agents, gateway_nodes):
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    mine = Token.objects.create(user=user).key
    other = Token.objects.create(user=django_user_model.objects.create_user(username="other", password="pw-o-1")).key
    opened = httpx.post(f"{node.url}/mcp", timeout=10, headers={
        "Authorization": f"Bearer {mine}", "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    session = opened.headers["mcp-session-id"]
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "mcp-session-id": session,
               "mcp-protocol-version": "2025-11-25"}
    stolen = httpx.post(f"{node.url}/mcp", json=body, timeout=10, headers={**headers, "Authorization": f"Bearer {other}"})
    assert stolen.status_code == 404
    own = httpx.post(f"{node.url}/mcp", json=body, timeout=10, headers={**headers, "Authorization": f"Bearer {mine}"})
    assert own.status_code == 200 and "order.query" in own.text


def _answer(response) -> dict:
    """A JSON-RPC answer: the JSON body, or the last event of an SSE answer (a call's notifications ride it)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return json.loads([line[5:] for line in response.text.splitlines() if line.startswith("data:")][-1])
    return response.json()


def test_bad_input_is_a_4xx_or_a_json_rpc_error(user, running_agents, gateway_nodes):
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    url = f"{node.url}/mcp"
    auth = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    session = httpx.post(url, json=init, headers=auth, timeout=10).headers["mcp-session-id"]
    in_session = {**auth, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    httpx.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=in_session, timeout=10)

    def rpc(body, headers=in_session, **kw):
        return httpx.post(url, headers=headers, timeout=10, **({"content": body} if isinstance(body, bytes)
                                                                else {"json": body}), **kw)

    answers = {
        "not json": rpc(b"{not json", headers={**in_session, "Content-Type": "application/json"}),
        "not json-rpc": rpc({"hello": "world"}),
        "wrong content type": rpc(b"x", headers={**in_session, "Content-Type": "text/plain"}),
        "no session": rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=auth),
        "unknown session": rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                               headers={**in_session, "mcp-session-id": "nope"}),
        "unknown method": rpc({"jsonrpc": "2.0", "id": 3, "method": "no/such/method"}),
        "arguments not an object": rpc({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                                        "params": {"name": "order.query", "arguments": [1, 2]}}),
        "no tool name": rpc({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {}}),
        "payload breaks the input schema": rpc({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                                                "params": {"name": "order.query", "arguments": {"order_id": 12}}}),
        "route without a task": rpc({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                     "params": {"name": "route", "arguments": {"payload": []}}}),
        "GET without a session": httpx.get(url, headers={**auth, "Accept": "text/event-stream"}, timeout=10),
        "DELETE of an unknown session": httpx.delete(url, headers={**in_session, "mcp-session-id": "nope"},
                                                     timeout=10),
        "unknown revision": rpc({"jsonrpc": "2.0", "id": 8, "method": "tools/list"},
                                headers={**auth, "mcp-protocol-version": "1999-01-01"}),
    }
    for what, response in answers.items():
        assert response.status_code < 500, (what, response.status_code, response.text)
        if response.status_code == 200:  # a JSON-RPC answer: an error, or a tool result with isError
            body = _answer(response)
            assert "error" in body or body["result"].get("isError") is True, (what, body)


def test_a_call_reports_its_steps_as_progress_and_log_notifications(user, running_agents, gateway_nodes):
    """2025-11-25: a call with a progress token hears 0, 50, 100 of 100; once the session set a logging level,
    each call logs its steps (received with its task, routed to the agent, the outcome) at that level and
    above; a call that asked for neither hears nothing."""
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    logs: list[types.LoggingMessageNotificationParams] = []
    progress: list[tuple] = []

    async def on_log(params):
        logs.append(params)

    async def on_progress(value, total, message):
        progress.append((value, total, message))

    async def scenario():
        seen = {}
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with client, streamable_http_client(f"{node.url}/mcp", http_client=client) as (read, write, *_):
            async with ClientSession(read, write, logging_callback=on_log) as session:
                init = await session.initialize()
                await session.call_tool("order.query", {"order_id": "1"})
                seen["quiet"] = (list(logs), list(progress))
                await session.call_tool("order.query", {"order_id": "2"}, progress_callback=on_progress)
                seen["progress"] = (list(logs), list(progress))
                await session.set_logging_level("info")
                await session.call_tool("order.query", {"order_id": "3"})
                seen["logged"] = (list(logs), list(progress))
                await session.set_logging_level("error")
                await session.call_tool("order.query", {"order_id": "4"})
                refused = await session.call_tool("no.such.capability", {})
                seen["errors only"] = (list(logs), list(progress))
        return init, refused, seen

    init, refused, seen = run_async(scenario())
    assert init.capabilities.logging is not None
    assert seen["quiet"] == ([], [])

    no_logs, steps = seen["progress"]
    assert no_logs == [] and [(v, t) for v, t, _ in steps] == [(0, 100), (50, 100), (100, 100)]
    task = Task.objects.get(caller=user, payload={"order_id": "2"})
    assert steps[0][2] == f"request received: task {task.key} (tool order.query)"
    assert steps[1][2] == "routed to order-agent (order.query@1.0.0); calling order-agent"
    assert steps[2][2].startswith("task succeeded in ") and steps[2][2].endswith(" ms")

    logged, steps_after = seen["logged"]
    assert steps_after == steps  # no progress token: no progress
    task = Task.objects.get(caller=user, payload={"order_id": "3"})
    assert [(entry.level, entry.logger) for entry in logged] == [("info", "agent-reach")] * 3
    assert [entry.data for entry in logged][:2] == [
        f"request received: task {task.key} (tool order.query)",
        "routed to order-agent (order.query@1.0.0); calling order-agent"]
    assert logged[2].data.startswith("task succeeded in ")

    # at "error" a succeeded call logs nothing; a refusal logs its one error
    errors = seen["errors only"][0][len(logged):]
    assert refused.is_error
    assert [(entry.level, entry.data.split(":")[0]) for entry in errors] == [("error", "refused")]
    assert "no.such.capability" in errors[0].data


def test_a_2026_call_reports_its_steps_when_the_request_asks(user, running_agents, gateway_nodes):
    """2026-07-28 (no setLevel, no session): the request's logLevel _meta opts in to the step logs, its
    progressToken to the progress; a call with neither is answered alone."""
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    logs: list[types.LoggingMessageNotificationParams] = []
    progress: list[float] = []

    async def on_log(params):
        logs.append(params)

    async def on_progress(value, total, message):
        progress.append(value)

    async def scenario():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http:
            async with Client(streamable_http_client(f"{node.url}/mcp", http_client=http), mode="2026-07-28",
                              logging_callback=on_log) as quiet:
                await quiet.call_tool("order.query", {"order_id": "5"})
                heard = (list(logs), list(progress))
            async with Client(streamable_http_client(f"{node.url}/mcp", http_client=http), mode="2026-07-28",
                              logging_callback=on_log, log_level="info") as client:
                called = await client.call_tool("order.query", {"order_id": "6"}, progress_callback=on_progress)
                return client.protocol_version, heard, called

    version, heard, called = run_async(scenario())
    assert version == "2026-07-28" and not called.is_error
    assert heard == ([], [])
    assert progress == [0, 50, 100]
    assert [entry.level for entry in logs] == ["info"] * 3
    assert logs[1].data == "routed to order-agent (order.query@1.0.0); calling order-agent"


# --- an A2A agent's questions, asked of the client (elicitation, sampling) -------------------------------------

USER_SCHEMA = {"type": "object", "properties": {"username": {"type": "string", "description": "Your username"},
                                               "email": {"type": "string", "description": "Your email address"}},
               "required": ["username", "email"]}


@pytest.fixture
def asking_agent(settings):
    """examples/a2a_agent.py with the MCP fixtures (examples/a2a/mcp-fixture-a2a-agent.yaml), registered from its
    card: test_elicitation asks for a username and an email, test_sampling asks the client's model."""
    from tests.helpers import MCP_FIXTURE_A2A, A2AAgentProcess, a2a_agent_registered_from_card

    settings.REACH = {**settings.REACH, "AGENT_ALLOWED_NETWORKS": ["127.0.0.0/8"]}
    proc = A2AAgentProcess(MCP_FIXTURE_A2A).start()
    try:
        assert sorted(a2a_agent_registered_from_card(proc.url)) == ["test_elicitation", "test_sampling"]
        yield proc
    finally:
        proc.stop()


def _text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def _asking_session(url: str, token: str, work, **callbacks):
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, streamable_http_client(f"{url}/mcp", http_client=client) as (read, write, *_):
        async with ClientSession(read, write, **callbacks) as session:
            await session.initialize()
            return await work(session)


def test_an_agents_question_is_elicited_and_the_answer_continues_the_task(user, asking_agent, gateway_nodes):
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    asked: list[types.ElicitRequestParams] = []

    async def elicit(context, params):
        asked.append(params)
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    result = run_async(_asking_session(node.url, token, lambda s: s.call_tool(
        "test_elicitation", {"message": "Who are you?"}), elicitation_callback=elicit))
    assert not result.is_error, result
    assert _text(result) == 'User response: accept, {"email": "ada@example.com", "username": "ada"}'
    (params,) = asked
    assert params.message == "Who are you?" and params.requested_schema == USER_SCHEMA  # the agent's own schema
    task = Task.objects.get(caller=user, payload={"message": "Who are you?"})
    assert task.status == "succeeded" and task.options["a2a"]["answer"] == {"username": "ada",
                                                                             "email": "ada@example.com"}
    assert [e.to_status for e in task.events.order_by("id")] == [
        "pending", "routed", "running", "input_required", "pending", "routed", "running", "succeeded"]
    # one A2A task, two turns: the question, then the answer as its next message
    stats = asking_agent.stats()
    assert list(stats["tasks"].values()) == [2] and len(stats["executions"]) == 2


def test_a_declined_question_cancels_the_task_and_the_agents_task(user, asking_agent, gateway_nodes):
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key

    async def decline(context, params):
        return types.ElicitResult(action="decline")

    result = run_async(_asking_session(node.url, token, lambda s: s.call_tool(
        "test_elicitation", {"message": "Your email?"}), elicitation_callback=decline))
    assert result.is_error and "is cancelled: the user chose decline" in _text(result)
    task = Task.objects.get(caller=user, payload={"message": "Your email?"})
    assert task.status == "cancelled"
    assert [e.to_status for e in task.events.order_by("id")][-2:] == ["input_required", "cancelled"]
    remote = httpx.post(asking_agent.url, headers={"A2A-Version": "1.0"}, timeout=5, json={
        "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task.options["a2a"]["task_id"]}}).json()
    assert remote["result"]["status"]["state"] == "TASK_STATE_CANCELED"


def test_an_agent_borrows_the_clients_model_through_sampling(user, asking_agent, gateway_nodes):
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    sampled: list[types.CreateMessageRequestParams] = []

    async def sample(context, params):
        sampled.append(params)
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text", text="Paris"))

    result = run_async(_asking_session(node.url, token, lambda s: s.call_tool(
        "test_sampling", {"prompt": "Capital of France?"}), sampling_callback=sample))
    assert not result.is_error, result
    assert _text(result) == "LLM response: Paris"
    (params,) = sampled
    assert params.max_tokens == 100
    assert [(m.role, m.content.text) for m in params.messages] == [("user", "Capital of France?")]
    task = Task.objects.get(caller=user, payload={"prompt": "Capital of France?"})
    assert task.status == "succeeded"
    assert task.options["a2a"]["answer"]["model"] == "test-model"  # the CreateMessageResult is the answer


def test_a_client_without_the_capabilities_gets_the_question_as_an_error(user, asking_agent, gateway_nodes):
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key

    async def calls(session):
        return (await session.call_tool("test_elicitation", {"message": "Who are you?"}),
                await session.call_tool("test_sampling", {"prompt": "Capital of France?"}))

    asked, sampling = run_async(_asking_session(node.url, token, calls))
    assert asked.is_error and _text(asked).endswith("is input_required: the agent asks: Who are you?")
    assert sampling.is_error and "declared no sampling capability" in _text(sampling)
    # nothing answered, nothing cancelled: the tasks still ask (answerable through the invoke API)
    assert set(Task.objects.filter(caller=user).values_list("status", flat=True)) == {"input_required"}
    assert Task.objects.get(caller=user, payload={"message": "Who are you?"}).result == {
        "question": "Who are you?", "data": {"requestedSchema": USER_SCHEMA}}
