"""The inbound A2A door on a live gateway node: a registered (plain HTTP) agent served as an A2A agent."""

from __future__ import annotations

import httpx
import pytest
from rest_framework.authtoken.models import Token

from routing.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


def _rpc(url: str, token: str, method: str, params: dict) -> dict:
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, timeout=30,
                   headers={"Authorization": f"Bearer {token}", "A2A-Version": "1.0"})
    assert r.status_code == 200, r.text
    return r.json()


def test_agent_card_send_message_and_get_task(user, running_agents, gateway_nodes):
    agents = running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    card = httpx.get(f"{node.url}/a2a/order-agent/.well-known/agent-card.json", timeout=10).json()
    url = f"{node.url}/a2a/order-agent"
    assert card["supportedInterfaces"][0]["url"] == url
    assert [s["id"] for s in card["skills"]] == ["order.query"]
    message = {"role": "ROLE_USER", "messageId": "a2a-in-1", "contextId": "ctx-9",
               "parts": [{"text": "where is my order"}, {"data": {"order_id": "5"}}]}
    sent = _rpc(url, token, "SendMessage", {"message": message})["result"]["task"]
    assert sent["id"] == "a2a-in-1" and sent["status"]["state"] == "TASK_STATE_COMPLETED"
    assert sent["artifacts"][0]["parts"][0]["data"]["answer"].endswith('{"order_id": "5"}')
    # the same message again is the same task, not a second execution
    assert _rpc(url, token, "SendMessage", {"message": message})["result"]["task"]["id"] == "a2a-in-1"
    assert agents.stats("order-agent")["executions"]["a2a-in-1"] == 1
    task = Task.objects.get(request_id="a2a-in-1")
    assert task.caller == user and task.user_key == "ctx-9" and task.status == "succeeded"
    got = _rpc(url, token, "GetTask", {"id": "a2a-in-1"})["result"]
    assert got["status"]["state"] == "TASK_STATE_COMPLETED"
    assert _rpc(url, token, "GetTask", {"id": "nope"})["error"]["code"] == -32001
    # a completed task cannot be cancelled
    assert _rpc(url, token, "CancelTask", {"id": "a2a-in-1"})["error"]["code"] == -32002
    second = {**message, "messageId": "a2a-in-2"}
    _rpc(url, token, "SendMessage", {"message": second})
    page = _rpc(url, token, "ListTasks", {"pageSize": 1})["result"]
    assert [t["id"] for t in page["tasks"]] == ["a2a-in-2"] and page["totalSize"] == 2
    rest = _rpc(url, token, "ListTasks", {"pageSize": 1, "pageToken": page["nextPageToken"]})["result"]
    assert [t["id"] for t in rest["tasks"]] == ["a2a-in-1"] and rest["nextPageToken"] == ""
    assert _rpc(url, token, "ListTasks", {"pageSize": 500})["error"]["code"] == -32602
    assert _rpc(url, token, "SendStreamingMessage", {"message": message})["error"]["code"] == -32004
    assert _rpc(url, token, "NoSuchMethod", {})["error"]["code"] == -32601
    assert httpx.post(url, json={}, timeout=10).status_code == 401
    assert httpx.get(f"{node.url}/a2a/nobody/.well-known/agent-card.json", timeout=10).status_code == 404
