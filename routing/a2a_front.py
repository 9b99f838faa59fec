"""The inbound A2A door (first part): every registered agent served by the gateway as an A2A v1.0 agent.

``GET /a2a/<endpoint_id>/.well-known/agent-card.json``: a card whose skills are the agent's ACTIVE capabilities,
whose JSON-RPC interface is the gateway (``/a2a/<endpoint_id>``) and whose security scheme is our caller token.
``POST /a2a/<endpoint_id>`` (JSON-RPC, caller token as ``Authorization: Bearer``): ``SendMessage`` (blocking) is
an invoke through the one invoke path, the message id being the request_id (so a repeated message never runs
twice) and the contextId the user_key; ``GetTask`` reads our task, ``ListTasks`` the caller's tasks (newest first, cursor paging), ``CancelTask``
cancels one that waits on the caller. An A2A task is a normal task of ours (the admin, the ledger, the review
queue). Not yet: streaming, push configs, the router card.
"""

from __future__ import annotations

import json
import re

from reach_platform import engine
from reach_platform.errors import ApplicationError

PREFIX = "/a2a/"
CARD = "/.well-known/agent-card.json"
_PATH = re.compile(r"^/a2a/(?P<agent>[-a-zA-Z0-9_]+)(?P<card>/\.well-known/agent-card\.json)?/?$")
STATE = {"pending": "TASK_STATE_SUBMITTED", "routed": "TASK_STATE_WORKING", "running": "TASK_STATE_WORKING",
         "accepted": "TASK_STATE_WORKING", "succeeded": "TASK_STATE_COMPLETED", "failed": "TASK_STATE_FAILED",
         "cancelled": "TASK_STATE_CANCELED", "dead_lettered": "TASK_STATE_FAILED",
         "needs_confirmation": "TASK_STATE_INPUT_REQUIRED", "input_required": "TASK_STATE_INPUT_REQUIRED",
         "manual_review": "TASK_STATE_SUBMITTED"}


def wants(scope) -> bool:
    return scope["type"] == "http" and scope["path"].startswith(PREFIX)


def _agent_capabilities(endpoint_id: str) -> dict | None:
    from registry.choices import VersionState
    from registry.models import Agent, CapabilityVersion

    agent = Agent.objects.filter(endpoint_id=endpoint_id).values("display_name", "description").first()
    if agent is None:
        return None
    rows = (CapabilityVersion.objects.filter(capability__agent__endpoint_id=endpoint_id, state=VersionState.ACTIVE,
                                             is_canary=False)
            .values("capability__name", "description", "tags", "examples", "input_modes", "output_modes"))
    return {**agent, "skills": list(rows)}


def agent_card(endpoint_id: str, info: dict, base_url: str) -> dict:
    url = f"{base_url}{PREFIX}{endpoint_id}"
    modes = ["application/json", "text/plain"]
    return {
        "name": info["display_name"] or endpoint_id, "description": info["description"] or endpoint_id,
        "version": "1.0.0",
        "supportedInterfaces": [{"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": False, "pushNotifications": False},
        "securitySchemes": {"reach_token": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}},
        "securityRequirements": [{"schemes": {"reach_token": {"list": []}}}],
        "defaultInputModes": modes, "defaultOutputModes": modes,
        "skills": [{"id": s["capability__name"], "name": s["capability__name"],
                    "description": s["description"] or s["capability__name"], "tags": s["tags"] or ["reach"],
                    "examples": s["examples"][:5], **({"inputModes": s["input_modes"]} if s["input_modes"] else {}),
                    **({"outputModes": s["output_modes"]} if s["output_modes"] else {})} for s in info["skills"]],
    }


def a2a_task(task) -> dict:
    """Our task as an A2A Task (id = our request_id)."""
    out = {"id": task.request_id, "contextId": task.user_key or task.request_id,
           "status": {"state": STATE.get(task.status, "TASK_STATE_WORKING")}}
    if task.status == "succeeded":
        result = task.result
        part = {"data": result} if isinstance(result, dict) else {"text": json.dumps(result)}
        out["artifacts"] = [{"artifactId": f"{task.request_id}-result", "name": "result", "parts": [part]}]
    elif task.status in ("failed", "input_required", "needs_confirmation") and (task.error or task.result):
        said = (task.error or {}).get("message") if task.status == "failed" else json.dumps(task.result or
                                                                                             task.decision)
        out["status"]["message"] = {"role": "ROLE_AGENT", "messageId": f"{task.request_id}-status",
                                    "parts": [{"text": str(said)}]}
    return out


def _rpc_error(rid, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


async def _send_message(caller, endpoint_id: str, info: dict, params: dict, rid):
    from routing.invoke import invoke

    message = params.get("message") or {}
    message_id = message.get("messageId")
    if not isinstance(message_id, str) or not message_id or not message.get("parts"):
        return _rpc_error(rid, -32602, "message.messageId and message.parts are required")
    texts = [p["text"] for p in message["parts"] if isinstance(p, dict) and isinstance(p.get("text"), str)]
    payload: dict = {}
    for part in message["parts"]:
        if isinstance(part, dict) and isinstance(part.get("data"), dict):
            payload.update(part["data"])
    skills = [s["capability__name"] for s in info["skills"]]
    wanted = (message.get("metadata") or {}).get("skill") or (skills[0] if len(skills) == 1 else None)
    if wanted not in skills:
        return _rpc_error(rid, -32602, f"name one of this agent's skills in message.metadata.skill: {skills}")
    try:
        task = await invoke(caller=caller, payload=payload, capability=wanted, task=" ".join(texts) or None,
                            request_id=message_id[:100], user_key=(message.get("contextId") or "")[:200])
    except ApplicationError as exc:
        return _rpc_error(rid, -32602 if exc.status_code < 500 else -32603, exc.message)
    return {"jsonrpc": "2.0", "id": rid, "result": {"task": a2a_task(task)}}


async def _get_task(caller, params: dict, rid):
    from routing.models import Task

    task = await engine.db(lambda: Task.objects.filter(request_id=str(params.get("id", "")),
                                                       caller=caller).first())
    if task is None:
        return _rpc_error(rid, -32001, "Task not found")
    return {"jsonrpc": "2.0", "id": rid, "result": a2a_task(task)}


MAX_PAGE = 100


def _list_tasks(caller, params: dict) -> dict:
    """The caller's tasks, newest first; ``pageToken`` is the id of the last task of the previous page."""
    from routing.models import Task

    size = params.get("pageSize") or 50
    if not isinstance(size, int) or not 1 <= size <= MAX_PAGE:
        raise ValueError(f"pageSize must be an integer from 1 to {MAX_PAGE}")
    rows = Task.objects.filter(caller=caller).order_by("-id")
    if params.get("contextId"):
        rows = rows.filter(user_key=params["contextId"])
    token = params.get("pageToken") or ""
    if token:
        if not str(token).isdigit():
            raise ValueError("pageToken is not one this server gave")
        rows = rows.filter(id__lt=int(token))
    page = list(rows[: size + 1])
    more = len(page) > size
    page = page[:size]
    return {"tasks": [a2a_task(t) for t in page], "nextPageToken": str(page[-1].id) if more else "",
            "pageSize": size, "totalSize": Task.objects.filter(caller=caller).count()}


def _cancel_task(caller, task_id: str) -> dict | tuple[int, str]:
    """Cancel a task that waits on the caller (a question, a confirmation) or is still queued."""
    from routing.choices import TaskStatus
    from routing.models import Task
    from routing.reaper import _cancel_a2a_task
    from routing.transitions import Timeline

    task = Task.objects.filter(request_id=task_id, caller=caller).first()
    if task is None:
        return -32001, "Task not found"
    cancellable = (TaskStatus.PENDING, TaskStatus.NEEDS_CONFIRMATION, TaskStatus.INPUT_REQUIRED)
    if task.status not in cancellable:
        return -32002, f"Task is {task.status}: it cannot be cancelled"
    was = task.status
    timeline = Timeline(task)
    timeline.move(TaskStatus.CANCELLED, reason="A2A CancelTask")
    if not timeline.commit():
        return -32002, "Task moved meanwhile: it cannot be cancelled"
    if was == TaskStatus.INPUT_REQUIRED:
        _cancel_a2a_task(task)  # the agent that asked stops waiting too
    return a2a_task(task)


async def serve(scope, receive, send) -> None:
    from routing.api.fastlane import _caller, _read_body, _respond
    from routing.mcp_server import _token

    match = _PATH.match(scope["path"])
    if match is None:
        return await _respond(send, 404, {"error": {"code": "not_found", "message": "No such A2A endpoint."}})
    endpoint_id = match["agent"]
    info = await engine.db(_agent_capabilities, endpoint_id)
    if info is None:
        return await _respond(send, 404, {"error": {"code": "not_found", "message": f"No agent '{endpoint_id}'."}})
    if match["card"]:
        host = dict(scope["headers"]).get(b"host", b"127.0.0.1").decode("latin-1")
        return await _respond(send, 200, agent_card(endpoint_id, info, f"{scope.get('scheme', 'http')}://{host}"))
    if scope["method"] != "POST":
        return await _respond(send, 405, {"error": {"code": "method_not_allowed", "message": "POST JSON-RPC."}})
    caller = await _caller(_token(scope)) if _token(scope) else None
    if caller is None:
        return await _respond(send, 401, {"error": {"code": "authentication_failed",
                                                    "message": "Authorization: Bearer <caller token>"}},
                              {"WWW-Authenticate": "Bearer"})
    raw = await _read_body(receive, 1_000_000)
    if raw is None:
        return
    try:
        body = json.loads(raw or b"")
    except (ValueError, TypeError):
        return await _respond(send, 200, _rpc_error(None, -32700, "Parse error"))
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        return await _respond(send, 200, _rpc_error(None, -32600, "Invalid Request"))
    rid, method, params = body.get("id"), body["method"], body.get("params") or {}
    if method == "SendMessage":
        answer = await _send_message(caller, endpoint_id, info, params, rid)
    elif method == "GetTask":
        answer = await _get_task(caller, params, rid)
    elif method == "ListTasks":
        try:
            answer = {"jsonrpc": "2.0", "id": rid, "result": await engine.db(_list_tasks, caller, params)}
        except ValueError as exc:
            answer = _rpc_error(rid, -32602, str(exc))
    elif method == "CancelTask":
        done = await engine.db(_cancel_task, caller, str(params.get("id", "")))
        answer = _rpc_error(rid, *done) if isinstance(done, tuple) else {"jsonrpc": "2.0", "id": rid,
                                                                           "result": done}
    elif method in ("SendStreamingMessage", "SubscribeToTask"):
        answer = _rpc_error(rid, -32004, "Streaming is not supported by this agent card.")
    elif method.endswith("TaskPushNotificationConfig") or method.endswith("TaskPushNotificationConfigs"):
        answer = _rpc_error(rid, -32003, "Push notifications are not supported.")
    else:
        answer = _rpc_error(rid, -32601, f"Method {method} not found")
    await _respond(send, 200, answer)
