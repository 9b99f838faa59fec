"""The example A2A agent (examples/a2a_agent.py) as a real server, driven by the a2a-sdk client."""

from __future__ import annotations

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import Message, Part, Role, SendMessageRequest, TaskState
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Value

from tests.helpers import run_async


async def _send(url: str, message: Message) -> list:
    client = await create_client(url, client_config=ClientConfig(streaming=False))
    try:
        return [event async for event in client.send_message(SendMessageRequest(message=message))]
    finally:
        await client.close()


def _message(message_id: str, text: str, data: dict | None = None, **ids) -> Message:
    parts = [Part(text=text)]
    if data is not None:
        parts.append(Part(data=json_format.ParseDict(data, Value())))
    return Message(role=Role.ROLE_USER, message_id=message_id, parts=parts, **ids)


def test_card_lists_the_descriptor_capabilities_as_skills(fresh_a2a_agent):
    card = httpx.get(f"{fresh_a2a_agent.url}/.well-known/agent-card.json", timeout=5).json()
    assert card["name"] == "Order service agent"
    assert [s["id"] for s in card["skills"]] == ["order.query"]
    assert card["skills"][0]["examples"][0] == "where is my order 12345"
    assert card["supportedInterfaces"][0] == {"url": fresh_a2a_agent.url, "protocolBinding": "JSONRPC",
                                              "protocolVersion": "1.0"}


def test_send_message_completes_with_the_answer_as_a_data_artifact(fresh_a2a_agent):
    events = run_async(_send(fresh_a2a_agent.url, _message("req-1", "where is my order", {"order_id": "12"})))
    task = events[-1].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    answer = json_format.MessageToDict(task.artifacts[0].parts[0].data)
    assert answer["answer"] == 'order-agent handled order.query: {"order_id": "12"}'
    assert fresh_a2a_agent.stats()["executions"] == {"req-1": 1}


def test_tck_prefixes_message_response_and_multi_turn(fresh_a2a_agent):
    events = run_async(_send(fresh_a2a_agent.url, _message("tck-message-response-1", "hi")))
    assert events[-1].message.parts[0].text == "Direct message response"

    first = run_async(_send(fresh_a2a_agent.url, _message("tck-input-required-1", "where is it"))).pop().task
    assert first.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    # the caller answers on the same task: the agent completes it
    second = run_async(_send(fresh_a2a_agent.url, _message("tck-input-required-2", "order 12", {"order_id": "12"},
                                                             task_id=first.id, context_id=first.context_id)))
    task = second[-1].task
    assert task.id == first.id and task.status.state == TaskState.TASK_STATE_COMPLETED
    assert json_format.MessageToDict(task.artifacts[0].parts[0].data)["follow_up"] is True


def test_unsupported_media_type_and_non_json_body_are_typed_errors(fresh_a2a_agent):
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "role": "ROLE_USER", "messageId": "m-bad", "parts": [{"raw": "dGNr", "mediaType": "application/x-nope"}]}}}
    r = httpx.post(fresh_a2a_agent.url, json=body, headers={"A2A-Version": "1.0"}, timeout=5)
    assert r.json()["error"]["code"] == -32005
    r = httpx.post(fresh_a2a_agent.url, content=b"{not json", timeout=5,
                   headers={"A2A-Version": "1.0", "Content-Type": "text/plain"})
    assert r.json()["error"]["code"] == -32005
    r = httpx.get(f"{fresh_a2a_agent.url}/rest/tasks/nope", headers={"A2A-Version": "1.0"}, timeout=5)
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
