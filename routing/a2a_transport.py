"""The ``a2a`` transport: one gateway attempt as an A2A v1.0 JSON-RPC ``SendMessage``.

The message carries the task text as a text part, the payload as a data part, our request_id as its message id
(so an agent that keys behaviour or idempotency on message ids sees ours unchanged) and, for a caller with a
``user_key``, a contextId derived from it (one A2A context per caller session and agent). The answer (a Message, or
a Task and its artifacts) becomes the attempt's result; a Task still submitted or working is followed by
``GetTask`` polling until it ends or the attempt's timeout passes, when it is cancelled with ``CancelTask``.

Push: for an async task (nobody holds a connection open for it) to an agent whose registered card declares
``pushNotifications``, when the gateway knows its public URL (``REACH_PUBLIC_URL``), the message goes with
``returnImmediately`` and a push config: ``<PUBLIC_URL>/a2a-push/<task>/<instance>`` and a token only the gateway
can make for that task and instance (``push_token``). A task the agent has not finished then ends the attempt as
ACCEPTED; its updates come to ``routing.lifecycle.task_a2a_push`` and go through the one state machine there.
A sync caller is waiting on this coroutine anyway: its task is polled as before.

Before a call the agent's card is checked against the one registered (registry.a2a_cards): a flagged card, or a
served card whose name or JSON-RPC URL differs, is a fingerprint mismatch and nothing is sent. Returns the
gateway's ``(outcome, status, result, error, usage)``; the gateway keeps its rules (retries, breaker, fallback,
output_schema, idempotency) on top.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
from django.conf import settings
from django.utils.crypto import salted_hmac

from reach_platform import engine
from routing.choices import AttemptOutcome

A2A_VERSION = "1.0"
CARD_TTL_S = 30.0
TERMINAL = {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"}
INTERRUPTED = {"TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"}
# JSON-RPC errors that say the request is wrong (no retry, no fallback); anything else counts as the agent's fault
CLIENT_CODES = {-32700, -32600, -32601, -32602, -32001, -32002, -32003, -32004, -32005, -32007, -32008, -32009}
CONTEXT_NAMESPACE = uuid.UUID("5b0c2a8e-0d0e-4a39-9a55-7a2a2a000001")

_registered: dict[int, tuple[float, dict | None]] = {}  # agent id -> (fetched at, registered card fingerprint)
_served: dict[str, tuple[float, dict | None, str]] = {}  # card url -> (fetched at, served card, error)


def context_id(agent: str, user_key: str) -> str:
    return str(uuid.uuid5(CONTEXT_NAMESPACE, f"{agent}\n{user_key}")) if user_key else ""


def build_message(ctx, payload: dict, agent: str) -> dict:
    turn = ctx.a2a_turn
    if turn:  # the caller's answer to the agent's question, on the agent's task
        answer = turn["answer"]
        part = {"data": answer, "mediaType": "application/json"} if isinstance(answer, dict) \
            else {"text": str(answer), "mediaType": "text/plain"}
        return {"role": "ROLE_USER", "messageId": f"{ctx.request_id}:{turn['turn']}", "parts": [part],
                "taskId": turn.get("task_id") or "", "contextId": turn.get("context_id") or ""}
    parts: list[dict] = []
    if ctx.task_text:
        parts.append({"text": ctx.task_text, "mediaType": "text/plain"})
    parts.append({"data": payload, "mediaType": "application/json"})
    message = {"role": "ROLE_USER", "messageId": ctx.request_id, "parts": parts}
    if context_id(agent, ctx.user_key):
        message["contextId"] = context_id(agent, ctx.user_key)
    return message


def result_of(parts: list[dict]) -> Any:
    """A lone data part is the result as is (our agents answer JSON); else the texts joined as ``answer`` with
    every part kept (and ``kind: message`` when the agent answered with a Message)."""
    data = [p["data"] for p in parts if "data" in p]
    if len(data) == 1 and len(parts) == 1:
        return data[0]
    texts = [p["text"] for p in parts if "text" in p]
    return {"answer": "\n".join(texts), "parts": parts}


def outcome_of_task(task: dict) -> tuple[str, Any, str]:
    state = (task.get("status") or {}).get("state", "")
    message_parts = ((task.get("status") or {}).get("message") or {}).get("parts") or []
    if state == "TASK_STATE_COMPLETED":
        parts = [p for artifact in task.get("artifacts") or [] for p in artifact.get("parts") or []]
        return AttemptOutcome.SUCCESS, result_of(parts or message_parts), ""
    said = " ".join(p.get("text", "") for p in message_parts).strip()
    if state == "TASK_STATE_REJECTED":
        return AttemptOutcome.CLIENT_ERROR, None, f"the agent rejected the task{': ' + said if said else ''}"
    if state == "TASK_STATE_INPUT_REQUIRED":
        # the question's data parts (a JSON schema for the answer, a sampling request: see the MCP door) ride along
        data = {k: v for p in message_parts if isinstance(p.get("data"), dict) for k, v in p["data"].items()}
        return AttemptOutcome.INPUT_REQUIRED, {"question": said, "task_id": task.get("id", ""),
                                               "context_id": task.get("contextId", ""),
                                               **({"data": data} if data else {})}, ""
    if state in INTERRUPTED:
        return AttemptOutcome.CLIENT_ERROR, None, f"the agent asks for {state}{': ' + said if said else ''}"
    return AttemptOutcome.SERVER_ERROR, None, f"A2A task ended {state}{': ' + said if said else ''}"


PUSH_PATH = "/a2a-push/"


def push_token(task_pk: int, instance_pk: int) -> str:
    """The token a push for our task ``task_pk``, sent to instance ``instance_pk``, must carry (an HMAC under the
    gateway's secret key: nothing stored, and useless for any other task or instance)."""
    return salted_hmac("reach.a2a-push", f"{task_pk}:{instance_pk}", algorithm="sha256").hexdigest()


def push_config(ctx, instance, registered: dict) -> dict | None:
    base = settings.REACH.get("PUBLIC_URL") or ""
    if ctx.mode != "async" or ctx.task_pk is None or not base or not registered.get("push"):
        return None
    return {"url": f"{base}{PUSH_PATH}{ctx.task_pk}/{instance.id}", "token": push_token(ctx.task_pk, instance.id)}


async def _registered_card(agent_id: int) -> dict | None:
    cached = _registered.get(agent_id)
    if cached and time.monotonic() - cached[0] < CARD_TTL_S:
        return cached[1]

    def read():
        from registry.models import AgentCard

        row = AgentCard.objects.filter(agent_id=agent_id).values("card_url", "name", "rpc_url", "flagged",
                                                                 "flag_reason", "card").first()
        if not row:
            return None
        card = row.pop("card") or {}
        return {**row, "push": bool((card.get("capabilities") or {}).get("pushNotifications"))}

    value = await engine.db(read)
    _registered[agent_id] = (time.monotonic(), value)
    return value


async def _served_card(card_url: str) -> tuple[dict | None, str]:
    cached = _served.get(card_url)
    if cached and time.monotonic() - cached[0] < CARD_TTL_S:
        return cached[1], cached[2]
    card, error = None, ""
    try:
        response = await engine.http().get(card_url, timeout=5.0, headers={"A2A-Version": A2A_VERSION})
        card = response.json() if response.status_code == 200 else None
        error = "" if card is not None else f"card answered {response.status_code}"
    except (httpx.HTTPError, ValueError) as exc:
        error = f"card unreachable: {type(exc).__name__}"
    _served[card_url] = (time.monotonic(), card, error)
    return card, error


async def check_fingerprint(version, instance) -> str:
    """"" when the agent is the one registered; else why not."""
    from registry.a2a_cards import rpc_interface

    registered = await _registered_card(version.agent_id)
    if registered is None:
        return f"'{version.agent}' has no registered A2A card"
    if registered["flagged"]:
        return f"the card of '{version.agent}' changed since it was registered ({registered['flag_reason']})"
    if instance.url != registered["rpc_url"]:
        return f"instance URL {instance.url} is not the registered {registered['rpc_url']}"
    served, error = await _served_card(registered["card_url"])
    if served is None:
        return ""  # an unreachable card is not a different agent: the call itself will tell
    if served.get("name") != registered["name"] or rpc_interface(served) != registered["rpc_url"]:
        return (f"the agent serves a card named '{served.get('name')}' at {rpc_interface(served) or '?'}, "
                f"registered '{registered['name']}' at {registered['rpc_url']}")
    return ""


async def _rpc(url: str, method: str, params: dict, headers: dict, timeout: float) -> tuple[int, dict]:
    body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}
    response = await engine.http().post(url, json=body, headers={**headers, "A2A-Version": A2A_VERSION},
                                        timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)))
    try:
        data = response.json()
    except ValueError:
        data = {}
    return response.status_code, data if isinstance(data, dict) else {}


def _error(status: int, data: dict) -> tuple[str, int, None, str, None]:
    err = data.get("error") or {}
    code = err.get("code")
    message = f"A2A error {code}: {err.get('message', '')}"[:300] if err else f"HTTP {status}"
    if status >= 500 or (err and code not in CLIENT_CODES):
        return AttemptOutcome.SERVER_ERROR, status, None, message, None
    return AttemptOutcome.CLIENT_ERROR, status, None, message, None


async def call(instance, version, payload: dict, ctx, headers: dict, timeout: float):
    """One attempt (see the module doc). Transport exceptions propagate to the gateway, which maps them."""
    mismatch = await check_fingerprint(version, instance)
    if mismatch:
        return AttemptOutcome.FINGERPRINT, None, None, mismatch, None
    deadline = time.monotonic() + timeout
    params: dict = {"message": build_message(ctx, payload, version.agent)}
    push = push_config(ctx, instance, await _registered_card(version.agent_id) or {})
    if push:
        params["configuration"] = {"taskPushNotificationConfig": push, "returnImmediately": True}
    status, data = await _rpc(instance.url, "SendMessage", params, headers, timeout)
    if status >= 400 or "error" in data or not isinstance(data.get("result"), dict):
        return _error(status, data)
    result = data["result"]
    if "message" in result:
        value = result_of(result["message"].get("parts") or [])
        if isinstance(value, dict) and "parts" in value:
            value["kind"] = "message"  # the agent answered with a Message, not a task: the A2A door says so too
        return AttemptOutcome.SUCCESS, status, value, "", None
    task = result.get("task") or {}
    if push and (task.get("status") or {}).get("state") not in TERMINAL | INTERRUPTED:
        return AttemptOutcome.ACCEPTED, status, {"task_id": task.get("id", ""), "context_id": task.get("contextId", ""),
                                                 "push": True}, "", None
    delay = 0.05
    while (task.get("status") or {}).get("state") not in TERMINAL | INTERRUPTED:
        left = deadline - time.monotonic()
        if left <= 0:
            await _cancel(instance.url, task.get("id", ""), headers)
            return AttemptOutcome.TIMEOUT, status, None, f"A2A task not done within {timeout:.1f}s (cancelled)", None
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, 1.0)
        status, data = await _rpc(instance.url, "GetTask", {"id": task.get("id", "")}, headers,
                                  max(0.5, deadline - time.monotonic()))
        if status >= 400 or "error" in data:
            return _error(status, data)
        task = data.get("result") or {}
    if (task.get("status") or {}).get("state") == "TASK_STATE_AUTH_REQUIRED":
        await _cancel(instance.url, task.get("id", ""), headers)
    outcome, value, error = outcome_of_task(task)
    return outcome, status, value, error, None


async def get_task(url: str, task_id: str) -> dict | None:
    """The agent's task (``GetTask``), or None when it cannot be read."""
    try:
        status, data = await _rpc(url, "GetTask", {"id": task_id}, {}, 5.0)
    except httpx.HTTPError:
        return None
    result = data.get("result")
    return result if status == 200 and isinstance(result, dict) else None


def get_task_sync(url: str, task_id: str) -> dict | None:
    """``GetTask`` from sync code (the push endpoint)."""
    body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": "GetTask", "params": {"id": task_id}}
    try:
        response = httpx.post(url, json=body, headers={"A2A-Version": A2A_VERSION}, timeout=5.0)
        result = response.json().get("result")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return result if response.status_code == 200 and isinstance(result, dict) else None


def cancel_sync(url: str, task_id: str) -> bool:
    """CancelTask from sync code (the reaper), best effort. Returns whether the agent took it."""
    body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": "CancelTask", "params": {"id": task_id}}
    try:
        response = httpx.post(url, json=body, headers={"A2A-Version": A2A_VERSION}, timeout=5.0)
        return response.status_code == 200 and "result" in response.json()
    except (httpx.HTTPError, ValueError):
        return False


async def _cancel(url: str, task_id: str, headers: dict) -> None:
    """Best effort: the agent stops work nobody waits for."""
    if not task_id:
        return
    try:
        await asyncio.shield(_rpc(url, "CancelTask", {"id": task_id}, headers, 2.0))
    except httpx.HTTPError:
        pass
