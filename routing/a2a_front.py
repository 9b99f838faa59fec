"""The inbound A2A v1.0 door: every registered agent, and the semantic router, served by the gateway as A2A agents.

``GET /a2a/<endpoint_id>/.well-known/agent-card.json``: a card whose skills are the agent's ACTIVE capabilities,
whose JSON-RPC interface is the gateway (``/a2a/<endpoint_id>``) and whose security scheme is our caller token.
``GET /a2a/router/.well-known/agent-card.json``: the router's card, whose skills are every ACTIVE capability (in
this gateway every caller may use every ACTIVE capability, and A2A discovery is anonymous, so the list is the
same for every caller); a message to it is routed by the semantic resolver across all registered agents, as
``task`` in ``POST /api/v1/invoke`` (a ``metadata.skill`` names the capability instead).

``POST /a2a/<endpoint_id>`` and ``POST /a2a/router`` (JSON-RPC, caller token as ``Authorization: Bearer``):

- ``SendMessage``: an invoke through the one invoke path, the contextId being the user_key and the request_id
  (the A2A task id) the message id or ``metadata.requestId`` (see ``_request_id``). Blocking by default (the
  answer comes at a terminal or interrupted state); ``configuration.returnImmediately`` makes it an async task
  of ours, answered at once as submitted and run by a worker. A message with the ``taskId`` of a task that asks for input (an agent's
  question, or the router's confirmation) answers it, as ``answer`` / ``confirm`` do on the REST API.
- ``SendStreamingMessage`` (an async task) and ``SubscribeToTask``: server-sent events from the task's changes
  (``routing.a2a_stream``).
- ``GetTask``, ``ListTasks`` (the caller's tasks, newest change first, cursor paging), ``CancelTask``.
- ``Create/Get/List/DeleteTaskPushNotificationConfig`` (``routing.a2a_push``: through the callback outbox).

An A2A task is a normal task of ours (the admin, the ledger, the review queue); every lookup is by the caller and
the request_id. Bad input is a JSON-RPC error, never an HTTP 500.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import parse_qs

from reach_platform import engine
from reach_platform.errors import ApplicationError, InvalidInput
from registry.choices import VersionState
from registry.models import Agent, CapabilityVersion
from routing import a2a_push, a2a_stream, waiting
from routing.a2a_shapes import STATE, a2a_message, a2a_task, answered_by_message, context_of
from routing.api.serializers import REQUEST_ID
from routing.choices import IN_FLIGHT, SETTLED, TERMINAL, TaskStatus
from routing.invoke import invoke
from routing.models import Task
from routing.reaper import _cancel_a2a_task
from routing.transitions import Timeline, pushes

logger = logging.getLogger(__name__)
PREFIX = "/a2a/"
ROUTER = "router"
CARD = "/.well-known/agent-card.json"
_PATH = re.compile(r"^/a2a/(?P<agent>[-a-zA-Z0-9_.]+)(?P<card>/\.well-known/agent-card\.json)?/?$")
MAX_PAGE = 100
MAX_ID = 100  # our request_id column
MAX_CONTEXT = 200  # our user_key column
BLOCKING_WAIT_S = 900.0  # a blocking SendMessage whose agent answers later (accepted) waits this long at most
INPUT_MODES = ["application/json", "text/plain"]
REQUEST_ID_RE = re.compile(REQUEST_ID)
# A2A error codes (A2A 5.4)
TASK_NOT_FOUND, NOT_CANCELABLE, PUSH_NOT_SUPPORTED, UNSUPPORTED, CONTENT_TYPE = -32001, -32002, -32003, -32004, -32005
VERSION_NOT_SUPPORTED, INVALID_PARAMS, INTERNAL = -32009, -32602, -32603


class RpcError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class Door:
    """What a card serves: one agent's ACTIVE capabilities, or (the router) every ACTIVE capability."""

    endpoint_id: str
    name: str
    description: str
    skills: list[dict]

    @property
    def routes(self) -> bool:
        return self.endpoint_id == ROUTER


def wants(scope) -> bool:
    return scope["type"] == "http" and scope["path"].startswith(PREFIX)


def _door(endpoint_id: str) -> Door | None:
    rows = CapabilityVersion.objects.filter(state=VersionState.ACTIVE, is_canary=False)
    if endpoint_id == ROUTER:
        name, description = "Agent-Reach router", ("Routes a natural-language request to the best registered "
                                                   "agent (semantic resolver), then calls it through the gateway.")
    else:
        agent = Agent.objects.filter(endpoint_id=endpoint_id).values("display_name", "description").first()
        if agent is None:
            return None
        name, description = agent["display_name"] or endpoint_id, agent["description"] or endpoint_id
        rows = rows.filter(capability__agent__endpoint_id=endpoint_id)
    skills = list(rows.order_by("capability__name").values("capability__name", "capability__agent__endpoint_id",
                                                           "description", "tags", "examples", "input_modes",
                                                           "output_modes"))
    unique: dict[str, dict] = {}
    for skill in skills:  # one skill per capability (its versions, canaries aside, say the same)
        unique.setdefault(skill["capability__name"], dict(skill))
    return Door(endpoint_id, name, description, list(unique.values()))


def agent_card(door: Door, base_url: str) -> dict:
    url = f"{base_url}{PREFIX}{door.endpoint_id}"
    return {
        "name": door.name, "description": door.description, "version": "1.0.0",
        "supportedInterfaces": [{"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": True, "pushNotifications": True},
        "securitySchemes": {"reach_token": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}},
        "securityRequirements": [{"schemes": {"reach_token": {"list": []}}}],
        "defaultInputModes": INPUT_MODES, "defaultOutputModes": INPUT_MODES,
        "skills": [{"id": s["capability__name"], "name": s["capability__name"],
                    "description": s["description"] or s["capability__name"],
                    "tags": s["tags"] or [s["capability__agent__endpoint_id"]],
                    "examples": s["examples"][:5], **({"inputModes": s["input_modes"]} if s["input_modes"] else {}),
                    **({"outputModes": s["output_modes"]} if s["output_modes"] else {})} for s in door.skills],
    }


# A2A errors carry a google.rpc.ErrorInfo in error.data (A2A 9.5); its reason is the error's name
REASONS = {-32001: "TASK_NOT_FOUND", -32002: "TASK_NOT_CANCELABLE", -32003: "PUSH_NOTIFICATION_NOT_SUPPORTED",
           -32004: "UNSUPPORTED_OPERATION", -32005: "CONTENT_TYPE_NOT_SUPPORTED", -32006: "INVALID_AGENT_RESPONSE",
           -32007: "EXTENDED_AGENT_CARD_NOT_CONFIGURED", -32008: "EXTENSION_SUPPORT_REQUIRED",
           -32009: "VERSION_NOT_SUPPORTED"}


def _rpc_error(rid, code: int, message: str) -> dict:
    error: dict = {"code": code, "message": message}
    if code in REASONS:
        error["data"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": REASONS[code],
                          "domain": "a2a-protocol.org", "metadata": {}}]
    return {"jsonrpc": "2.0", "id": rid, "error": error}


def _camel(value, *, free: bool = False):
    """Request params with ProtoJSON's other spelling (``task_id``) read as ``taskId``, as a ProtoJSON parser
    does; a data part's value and metadata are the caller's own and left as sent."""
    if isinstance(value, list):
        return [_camel(v) for v in value]
    if not isinstance(value, dict) or free:
        return value
    out = {}
    for key, item in value.items():
        name = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), key) if isinstance(key, str) else key
        out[name] = _camel(item, free=name in ("data", "metadata"))
    return out


def _ok(rid, result) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _str(params: dict, name: str, *, required: bool = True, limit: int = MAX_ID) -> str:
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise RpcError(INVALID_PARAMS, f"'{name}' is required")
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise RpcError(INVALID_PARAMS, f"'{name}' must be a string of at most {limit} characters")
    return value


def _history_length(params: dict) -> None:
    value = params.get("historyLength")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise RpcError(INVALID_PARAMS, "historyLength must be a non-negative integer")


def _find(caller, task_id: str) -> Task:
    task = Task.objects.filter(request_id=task_id, caller=caller).first()
    if task is None:
        raise RpcError(TASK_NOT_FOUND, f"Task {task_id} not found")
    return task


# --- messages -------------------------------------------------------------------------------------------

@dataclass
class Incoming:
    request_id: str  # metadata.requestId: an idempotency key as on the REST API
    message_id: str
    text: str
    payload: dict
    task_id: str
    context_id: str
    skill: str | None
    return_immediately: bool
    push: dict | None


def _parse_message(params: dict, door: Door) -> Incoming:
    message = params.get("message")
    if not isinstance(message, dict):
        raise RpcError(INVALID_PARAMS, "'message' is required (an A2A Message)")
    message_id = _str(message, "messageId")
    if not REQUEST_ID_RE.match(message_id):
        raise RpcError(INVALID_PARAMS, "messageId may hold only ASCII letters, digits and . _ : @ ~ + = - (it is "
                                       "the task's request_id)")
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
        raise RpcError(INVALID_PARAMS, "message.parts must be a non-empty list of parts")
    texts, payload = [], {}
    for part in parts:
        kinds = [k for k in ("text", "data", "raw", "url") if k in part]
        if len(kinds) != 1:
            raise RpcError(INVALID_PARAMS, "each part has exactly one of text, data, raw, url")
        media = part.get("mediaType")
        if media is not None and not isinstance(media, str):
            raise RpcError(INVALID_PARAMS, "part.mediaType must be a string")
        if kinds[0] in ("raw", "url") or (media and media not in INPUT_MODES):
            raise RpcError(CONTENT_TYPE, f"media type {media or kinds[0]} is not supported: send "
                                         f"{' or '.join(INPUT_MODES)}")
        if kinds[0] == "text":
            if not isinstance(part["text"], str):
                raise RpcError(INVALID_PARAMS, "part.text must be a string")
            texts.append(part["text"])
        elif isinstance(part["data"], dict):
            payload.update(part["data"])
        else:
            raise RpcError(INVALID_PARAMS, "a data part carries a JSON object (the payload)")
    if message.get("role") not in (None, "ROLE_USER", "user"):
        raise RpcError(INVALID_PARAMS, "message.role must be ROLE_USER")
    metadata = {} if message.get("metadata") is None else message["metadata"]
    configuration = {} if params.get("configuration") is None else params["configuration"]
    if not isinstance(metadata, dict) or not isinstance(configuration, dict):
        raise RpcError(INVALID_PARAMS, "message.metadata and configuration must be objects")
    immediately = configuration.get("returnImmediately", False)
    push = configuration.get("taskPushNotificationConfig")
    if not isinstance(immediately, bool) or (push is not None and not isinstance(push, dict)):
        raise RpcError(INVALID_PARAMS, "configuration.returnImmediately is a boolean, "
                                       "configuration.taskPushNotificationConfig an object")
    _history_length(configuration)
    request_id = _str(metadata, "requestId", required=False)
    if request_id and not REQUEST_ID_RE.match(request_id):
        raise RpcError(INVALID_PARAMS, "metadata.requestId may hold only ASCII letters, digits and . _ : @ ~ + = -")
    skill = metadata.get("skill")
    names = [s["capability__name"] for s in door.skills]
    if skill is not None and skill not in names:
        raise RpcError(INVALID_PARAMS, f"metadata.skill names none of this card's skills: {names}")
    if skill is None and not door.routes:
        if len(names) != 1:
            raise RpcError(INVALID_PARAMS, f"name one of this agent's skills in message.metadata.skill: {names}")
        skill = names[0]
    return Incoming(request_id=request_id, message_id=message_id, text=" ".join(texts), payload=payload,
                    task_id=_str(message, "taskId", required=False),
                    context_id=_str(message, "contextId", required=False, limit=MAX_CONTEXT), skill=skill,
                    return_immediately=immediately, push=push)


def _request_id(caller, msg: Incoming) -> str:
    """The new task's request_id (its A2A task id). ``metadata.requestId`` is an idempotency key as on the REST
    API. Else the message id: a repeat of it while its task is in flight joins that task (a retry never runs
    twice at once); once that task has settled, a message with the same id is a new message (A2A 3.3.1 makes
    de-duplication by messageId a MAY, and clients such as the TCK reuse ids for distinct messages), whose
    task id is the message id with a suffix, so that an agent keying behaviour on the id's prefix sees it."""
    if msg.request_id:
        return msg.request_id
    seen = Task.objects.filter(caller=caller, request_id=msg.message_id).values_list("status", flat=True).first()
    if seen is None or seen in IN_FLIGHT:
        return msg.message_id
    return f"{msg.message_id[:MAX_ID - 9]}-{uuid.uuid4().hex[:8]}"


async def _new_task(caller, door: Door, msg: Incoming, *, background: bool) -> Task:
    if not msg.skill and not msg.text.strip():
        raise RpcError(INVALID_PARAMS, "the router needs a text part saying what to do (or metadata.skill)")
    request_id = await engine.db(_request_id, caller, msg)
    if msg.push is not None:
        await engine.db(a2a_push.push_config_create, caller=caller, task_request_id=request_id,
                        config={**msg.push, "taskId": request_id})
    task = await invoke(caller=caller, payload=msg.payload, capability=msg.skill, task=msg.text or None,
                        request_id=request_id, user_key=msg.context_id, mode="async" if background else "sync",
                        door="a2a")
    if not background and task.status not in SETTLED:
        task = await waiting.until_settled(task, timeout=BLOCKING_WAIT_S)  # an agent that answers later
    return task


async def _follow_up(caller, msg: Incoming) -> Task:
    """A message on an existing task: the answer to its question (an agent's, or the router's confirmation)."""
    task = await engine.db(_find, caller, msg.task_id)
    if msg.context_id and msg.context_id != context_of(task):
        raise RpcError(INVALID_PARAMS, f"contextId {msg.context_id} is not the context of task {msg.task_id}")
    if task.status in TERMINAL:
        raise RpcError(UNSUPPORTED, f"Task {msg.task_id} is {task.status}: it takes no more messages")
    if msg.push is not None:
        await engine.db(a2a_push.push_config_create, caller=caller, task_request_id=task.request_id,
                        config={**msg.push, "taskId": task.request_id})
    if task.status == TaskStatus.NEEDS_CONFIRMATION:
        choice = msg.skill or msg.text.strip()
        return await invoke(caller=caller, payload=task.payload, request_id=task.request_id, confirm=choice,
                            door="a2a")
    if task.status == TaskStatus.INPUT_REQUIRED:
        answer = msg.payload if msg.payload else msg.text
        return await invoke(caller=caller, payload=task.payload, request_id=task.request_id, answer=answer,
                            door="a2a")
    raise RpcError(UNSUPPORTED, f"Task {msg.task_id} is {task.status}: it takes a message only when it asks for "
                                "input")


async def _send(caller, door: Door, params: dict, *, stream: bool) -> Task:
    msg = _parse_message(params, door)
    try:
        if msg.task_id:
            return await _follow_up(caller, msg)
        return await _new_task(caller, door, msg, background=stream or msg.return_immediately)
    except ApplicationError as exc:
        raise RpcError(INVALID_PARAMS if exc.status_code < 500 else INTERNAL, exc.message) from exc


# --- tasks ----------------------------------------------------------------------------------------------

_STATUSES = {state: [ours for ours, theirs in STATE.items() if theirs == state] for state in set(STATE.values())}


def _timestamp(value) -> datetime:
    if not isinstance(value, str):
        raise RpcError(INVALID_PARAMS, "statusTimestampAfter must be an RFC 3339 timestamp")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, "statusTimestampAfter must be an RFC 3339 timestamp") from exc


def _list_tasks(caller, params: dict) -> dict:
    """The caller's tasks, newest status change first; ``pageToken`` is ``<updated_at>|<id>`` of the last task
    of the previous page."""
    size = params.get("pageSize") or 50
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_PAGE:
        raise RpcError(INVALID_PARAMS, f"pageSize must be an integer from 1 to {MAX_PAGE}")
    _history_length(params)
    include = params.get("includeArtifacts", False)
    if not isinstance(include, bool):
        raise RpcError(INVALID_PARAMS, "includeArtifacts must be a boolean")
    rows = Task.objects.filter(caller=caller)
    if params.get("contextId"):
        rows = rows.filter(user_key=_str(params, "contextId", limit=MAX_CONTEXT))
    if params.get("status"):
        if params["status"] not in _STATUSES:
            raise RpcError(INVALID_PARAMS, f"status must be one of {sorted(_STATUSES)}")
        rows = rows.filter(status__in=_STATUSES[params["status"]])
    if params.get("statusTimestampAfter"):
        rows = rows.filter(updated_at__gt=_timestamp(params["statusTimestampAfter"]))
    total = rows.count()
    token = params.get("pageToken") or ""
    if token:
        at, _, pk = str(token).partition("|")
        if not pk.isdigit():
            raise RpcError(INVALID_PARAMS, "pageToken is not one this server gave")
        after = _timestamp(at)
        rows = rows.filter(updated_at__lte=after).exclude(updated_at=after, id__gte=int(pk))
    page = list(rows.order_by("-updated_at", "-id")[: size + 1])
    more = len(page) > size
    page = page[:size]
    token = f"{page[-1].updated_at.isoformat()}|{page[-1].id}" if more else ""
    return {"tasks": [a2a_task(t, artifacts=include) for t in page], "nextPageToken": token, "pageSize": size,
            "totalSize": total}


def _cancel_task(caller, task_id: str) -> dict:
    """Cancel a task that waits on the caller (a question, a confirmation), on a person (manual review) or is
    still queued; a task an agent is working on runs to its end (its agent may not be able to stop)."""
    task = _find(caller, task_id)
    cancellable = (TaskStatus.PENDING, TaskStatus.NEEDS_CONFIRMATION, TaskStatus.INPUT_REQUIRED,
                   TaskStatus.MANUAL_REVIEW)
    if task.status not in cancellable:
        raise RpcError(NOT_CANCELABLE, f"Task is {task.status}: it cannot be cancelled")
    was = task.status
    timeline = Timeline(task)
    timeline.move(TaskStatus.CANCELLED, reason="A2A CancelTask")
    if not timeline.commit():
        raise RpcError(NOT_CANCELABLE, "Task moved meanwhile: it cannot be cancelled")
    if was == TaskStatus.INPUT_REQUIRED:
        _cancel_a2a_task(task)  # the agent that asked stops waiting too
    return a2a_task(task)


def _subscribable(caller, task_id: str) -> Task:
    task = _find(caller, task_id)
    if task.status in TERMINAL:
        raise RpcError(UNSUPPORTED, f"Task {task_id} is {task.status}: there is nothing to subscribe to")
    return task


# --- push notification configs --------------------------------------------------------------------------

def _push(caller, method: str, params: dict):
    task_id = _str(params, "taskId")
    task = _find(caller, task_id)  # the caller's own task, or TaskNotFoundError
    if method == "CreateTaskPushNotificationConfig" and not pushes(task):
        raise RpcError(PUSH_NOT_SUPPORTED, f"Task {task_id} was not created through the A2A door: its changes "
                                           "are not pushed (use callback_url on the REST API)")
    try:
        if method == "CreateTaskPushNotificationConfig":
            return a2a_push.config_as_a2a(a2a_push.push_config_create(caller=caller, task_request_id=task_id,
                                                                      config=params))
        if method == "GetTaskPushNotificationConfig":
            return a2a_push.config_as_a2a(a2a_push.push_config_get(caller=caller, task_request_id=task_id,
                                                                   config_id=_str(params, "id")))
        if method == "DeleteTaskPushNotificationConfig":
            a2a_push.push_config_delete(caller=caller, task_request_id=task_id, config_id=_str(params, "id"))
            return {}
        size = params.get("pageSize") or 50
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_PAGE:
            raise RpcError(INVALID_PARAMS, f"pageSize must be an integer from 1 to {MAX_PAGE}")
        rows, token = a2a_push.push_config_list(caller=caller, task_request_id=task_id, page_size=size,
                                                page_token=_str(params, "pageToken", required=False))
        return {"configs": [a2a_push.config_as_a2a(r) for r in rows], "nextPageToken": token}
    except a2a_push.ConfigNotFound as exc:
        raise RpcError(TASK_NOT_FOUND, f"No push notification config {exc} for task {task_id}") from exc
    except InvalidInput as exc:
        raise RpcError(INVALID_PARAMS, exc.message) from exc


PUSH_METHODS = ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig",
                "ListTaskPushNotificationConfigs", "DeleteTaskPushNotificationConfig")


# --- the ASGI entry -------------------------------------------------------------------------------------

async def _call(caller, door: Door, method: str, params: dict, rid, send, receive) -> dict | None:
    """The JSON-RPC answer, or None when a stream was served."""
    if method == "SendMessage":
        task = await _send(caller, door, params, stream=False)
        return _ok(rid, {"message": a2a_message(task)} if answered_by_message(task) else {"task": a2a_task(task)})
    if method == "SendStreamingMessage":
        task = await _send(caller, door, params, stream=True)
        fresh = task.status == TaskStatus.PENDING and task.mode == "async"  # just created: all its states
        await a2a_stream.serve_sse(send, receive, rid, a2a_stream.follow(task, from_start=fresh))
        return None
    if method == "SubscribeToTask":
        task = await engine.db(_subscribable, caller, _str(params, "id"))
        await a2a_stream.serve_sse(send, receive, rid, a2a_stream.follow(task, subscribed=True))
        return None
    if method == "GetTask":
        _history_length(params)
        return _ok(rid, a2a_task(await engine.db(_find, caller, _str(params, "id"))))
    if method == "ListTasks":
        return _ok(rid, await engine.db(_list_tasks, caller, params))
    if method == "CancelTask":
        return _ok(rid, await engine.db(_cancel_task, caller, _str(params, "id")))
    if method in PUSH_METHODS:
        return _ok(rid, await engine.db(_push, caller, method, params))
    if method == "GetExtendedAgentCard":
        raise RpcError(UNSUPPORTED, "This agent declares no extended agent card.")
    raise RpcError(-32601, f"Method {method} not found")


def _version(scope) -> str:
    """The A2A-Version the client speaks (header, or query parameter). A request without one is served as 1.0
    (A2A says 0.3, which no client of this gateway speaks: refusing would only break curl)."""
    for name, value in scope["headers"]:
        if name == b"a2a-version":
            return value.decode("latin-1").strip()
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return (query.get("A2A-Version") or [""])[0].strip()


async def serve(scope, receive, send) -> None:
    from routing.api.fastlane import _caller, _read_body, _respond
    from routing.mcp_server import _token

    match = _PATH.match(scope["path"])
    if match is None:
        return await _respond(send, 404, {"error": {"code": "not_found", "message": "No such A2A endpoint."}})
    door = await engine.db(_door, match["agent"])
    if door is None:
        return await _respond(send, 404, {"error": {"code": "not_found", "message": f"No agent '{match['agent']}'."}})
    if match["card"]:
        host = dict(scope["headers"]).get(b"host", b"127.0.0.1").decode("latin-1")
        return await _respond(send, 200, agent_card(door, f"{scope.get('scheme', 'http')}://{host}"))
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
    kind = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    if kind and kind not in ("application/json", "application/a2a+json"):
        return await _respond(send, 200, _rpc_error(None, CONTENT_TYPE, f"Content-Type {kind} is not supported: "
                                                                         "send application/json"))
    try:
        body = json.loads(raw or b"")
    except (ValueError, TypeError):
        return await _respond(send, 200, _rpc_error(None, -32700, "Parse error"))
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str) \
            or not isinstance(body.get("id", 0), str | int | None) or isinstance(body.get("id"), bool):
        return await _respond(send, 200, _rpc_error(None, -32600, "Invalid Request"))
    rid, params = body.get("id"), {} if body.get("params") is None else body["params"]
    if not isinstance(params, dict):
        return await _respond(send, 200, _rpc_error(rid, INVALID_PARAMS, "params must be an object"))
    version = _version(scope)
    if version and version.split(".")[:2] != ["1", "0"]:
        return await _respond(send, 200, _rpc_error(rid, VERSION_NOT_SUPPORTED, f"A2A-Version {version} is not "
                                                                                 "supported: this agent speaks 1.0"))
    params = _camel(params)
    try:
        answer = await _call(caller, door, body["method"], params, rid, send, receive)
    except RpcError as exc:
        answer = _rpc_error(rid, exc.code, exc.message)
    except (TypeError, ValueError, AttributeError):  # a shape no check above foresaw: the caller's, not a 500
        logger.warning("A2A request not understood", exc_info=True, extra={"method": body["method"]})
        answer = _rpc_error(rid, INVALID_PARAMS, "Invalid params")
    if answer is not None:
        await _respond(send, 200, answer)
