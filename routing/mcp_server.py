"""The MCP server at ``/mcp`` (Streamable HTTP, the official ``mcp`` SDK), for callers with a caller token.

``tools/list`` lists every ACTIVE capability as a tool (its name, description, ``input_schema`` as
``inputSchema``, ``output_schema`` as ``outputSchema``) and one ``route`` tool (``{task, payload}``: the semantic
resolver picks the capability). ``tools/call`` is a sync invoke through the one invoke path
(``routing.invoke.invoke``): the caller's quota, idempotency, the gateway's rules and the task timeline hold as
for ``POST /api/v1/invoke``. A succeeded task answers its result as structured content, and as content either the
MCP content blocks the result carries under ``content`` (text, image, audio, resource: an agent that answers
``{"content": [{"type": "image", ...}]}`` is shown as an image) or the result as JSON text; anything else
answers ``isError`` with the task's error (or the refusal) as text.

Every ``tools/call`` reports its task's steps while it runs (``Steps``): request received (task <request_id>),
routed to <agent> (<capability@version>) and calling it (``on_step`` of the invoke path: after the plan, before
the agent call), and the outcome (task <status> in <ms> ms, or the refusal). As log notifications
(``notifications/message``, logger ``agent-reach``) when the client asked for them: ``logging/setLevel`` on the
2025 revisions (the ``logging`` capability; the level holds for the session), the request's
``io.modelcontextprotocol/logLevel`` ``_meta`` on 2026-07-28; at that level and above (a step is ``info``, a
failure or refusal ``error``). As progress (``notifications/progress``, 0, 50 and 100 of 100, with the step as
its message) when the request carries ``_meta.progressToken``. Without either nothing is sent. They ride the
call's own response stream, so requests are answered as SSE streams on the 2025 revisions (on 2026-07-28 as
JSON unless a notification is sent).

An agent's question (the task came back ``input_required``: an A2A agent's ``input-required``) is asked of the
client on the call's stream (``ask_client``): ``elicitation/create`` (the question's text, the JSON schema it gave
in a data part or ``{answer: string}``) when the client declared ``elicitation``; ``sampling/createMessage`` when
the question carries ``{"sampling": {...}}`` (the agent borrows the client's model) and the client declared
``sampling``. The answer goes back through the one invoke path (a repeat of the request_id with ``answer``) and
the call goes on (at most MAX_QUESTIONS questions); a declined or cancelled elicitation cancels the task through
the state machine (and the agent's A2A task). Without the capability the question is the ``isError`` text.

List changes (``tools.listChanged``): when capability versions change (activation, retirement, promotion,
rollback; ``registry.generation.announce_versions_changed``) every gateway node hears it on Redis
(``TOOLS_CHANNEL``) and tells its clients: on the 2025 revisions the sessions that listed or called tools get
``notifications/tools/list_changed`` on their GET stream (sessions are stateful for that stream, and live on the
node that opened them: a client sent to another node gets 404 and initializes again, as the spec says); on
2026-07-28 (stateless, no session) the ``subscriptions/listen`` streams get the ``tools`` event.

The token is ``Authorization: Bearer <token>`` (or ``Token <token>``,
as the REST API takes it), checked on every request, and a session belongs to the caller that opened it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import warnings
import weakref
from typing import Any

import mcp.types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.shared.message import ServerMessageMetadata
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from reach_platform import engine
from reach_platform.errors import ApplicationError, error_body
from registry.generation import TOOLS_CHANNEL
from routing.choices import TaskStatus

logger = logging.getLogger(__name__)
PATH = "/mcp"
ROUTE_TOOL = "route"
ROUTE_SCHEMA = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "The request in words; the router picks the agent."},
                   "payload": {"type": "object", "description": "Structured input for the chosen capability."}},
    "required": ["task"],
}
SCOPE_CALLER = "reach.caller"
_CONTENT = TypeAdapter(list[types.ContentBlock])


def wants(scope) -> bool:
    return scope["type"] == "http" and (scope["path"] == PATH or scope["path"].startswith(PATH + "/"))


def _active_tools() -> list[dict]:
    from registry.choices import VersionState
    from registry.models import CapabilityVersion

    rows = (CapabilityVersion.objects.filter(state=VersionState.ACTIVE, is_canary=False)
            .order_by("capability__name")
            .values("capability__name", "description", "input_schema", "output_schema"))
    return [dict(row) for row in rows]


def _tool(row: dict) -> types.Tool:
    schema = row["input_schema"] or {}
    if schema.get("type") != "object":
        schema = {"type": "object", **({"properties": {"payload": schema}} if schema else {})}
    output = row["output_schema"] or None
    if output is not None and output.get("type") != "object":
        output = None  # MCP wants an object at the root of outputSchema
    return types.Tool(name=row["capability__name"], description=row["description"] or row["capability__name"],
                      input_schema=schema, output_schema=output)


# --- list changes ----------------------------------------------------------------------------------------

class ListChanges:
    """This node's clients to tell when the tool list changes: the 2025-revision connections that listed or
    called tools (held weakly: a closed session drops out) and the 2026-07-28 listen streams (the SDK's bus)."""

    def __init__(self):
        self.connections: weakref.WeakSet = weakref.WeakSet()
        self.bus = InMemorySubscriptionBus()
        self.listening: asyncio.Task | None = None

    def hold(self, ctx) -> None:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            # the connection, not the per-request ServerSession: its standalone channel is the GET stream
            self.connections.add(ctx.session._connection)

    async def tell(self) -> int:
        """Tell every client of this node; returns how many 2025-revision connections were told."""
        connections = list(self.connections)
        for connection in connections:
            await connection.send_tool_list_changed()  # best effort: never raises
        await self.bus.publish(ToolsListChanged())
        return len(connections)

    async def listen(self) -> None:
        """Hear every node's announcements (Redis) for as long as the server runs."""
        while True:
            pubsub = engine.redis().pubsub()
            try:
                await pubsub.subscribe(TOOLS_CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        await self.tell()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("MCP list-change listener lost its subscription; resubscribing", exc_info=True)
                await asyncio.sleep(1)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


changes = ListChanges()


# --- a call's steps: log and progress notifications --------------------------------------------------------

LOG_LEVEL_STATE = "reach.log_level"  # the level a 2025 session set (logging/setLevel), in its connection's state
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")  # RFC 5424, ascending
LOGGER = "agent-reach"


async def set_logging_level(ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
    ctx.session._connection.state[LOG_LEVEL_STATE] = params.level
    return types.EmptyResult()


class Steps:
    """What one ``tools/call`` tells its client while its task runs: each step as a log notification (if the
    client asked for logs, at its level and above) and as progress (if the request has a progress token).
    Best effort: a client gone mid-call never fails its task."""

    def __init__(self, ctx, request_id: str):
        self.ctx = ctx
        self.request_id = request_id
        self.started = time.monotonic()
        meta = ctx.meta or {}
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            level = meta.get(LOG_LEVEL_META_KEY)
        else:
            level = ctx.session._connection.state.get(LOG_LEVEL_STATE)
        self.level = LEVELS.index(level) if level in LEVELS else None

    async def tell(self, progress: int, message: str, level: types.LoggingLevel = "info") -> None:
        try:
            if self.level is not None and LEVELS.index(level) >= self.level:
                await self.ctx.session.send_notification(types.LoggingMessageNotification(
                    params=types.LoggingMessageNotificationParams(level=level, data=message, logger=LOGGER)),
                    related_request_id=self.ctx.request_id)
            await self.ctx.session.report_progress(progress, 100, message)  # a no-op without a progress token
        except Exception:
            logger.debug("MCP step not delivered", extra={"request_id": self.request_id}, exc_info=True)

    async def received(self, tool: str) -> None:
        await self.tell(0, f"request received: task {self.request_id} (tool {tool})")

    async def routed(self, row, version) -> None:
        """The invoke path's ``on_step``: routed, the agent about to be called."""
        await self.tell(50, f"routed to {version.agent} ({version.capability}@{version.version}); "
                            f"calling {version.agent}")

    async def finished(self, status: str, reason: str = "") -> None:
        ms = round((time.monotonic() - self.started) * 1000)
        await self.tell(100, f"task {status} in {ms} ms" + (f": {reason}" if reason else ""),
                        "info" if status == "succeeded" else "error")

    async def refused(self, message: str) -> None:
        await self.tell(100, f"refused: {message}", "error")


# --- handlers --------------------------------------------------------------------------------------------

async def list_tools(ctx, params) -> types.ListToolsResult:
    changes.hold(ctx)
    rows = await engine.db(_active_tools)
    route = types.Tool(name=ROUTE_TOOL, input_schema=ROUTE_SCHEMA,
                       description="Describe the task in words: the semantic router picks the capability and the "
                                   "gateway runs it.")
    return types.ListToolsResult(tools=[*[_tool(row) for row in rows], route])


def _error(message: str, details: Any = None) -> types.CallToolResult:
    text = message + (f" {json.dumps(details, default=str)}" if details else "")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def content_of(result: Any) -> list:
    """The MCP content of a result: the content blocks it carries under ``content``, else its JSON as text."""
    if isinstance(result, dict) and isinstance(result.get("content"), list) and result["content"]:
        try:
            return _CONTENT.validate_python(result["content"])
        except ValidationError:
            pass  # not MCP content: shown as JSON like any other result
    return [types.TextContent(type="text", text=json.dumps(result, default=str, ensure_ascii=False))]


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    from routing.api.serializers import task_output
    from routing.invoke import invoke, random_id

    changes.hold(ctx)
    caller = ctx.request.scope.get(SCOPE_CALLER) if ctx.request is not None else None
    if caller is None:
        return _error("Not authenticated.")
    arguments = dict(params.arguments or {})
    if params.name == ROUTE_TOOL:
        task_text = arguments.get("task")
        payload = arguments.get("payload") or {}
        if not isinstance(task_text, str) or not task_text.strip() or not isinstance(payload, dict):
            return _error("route takes {task: string, payload: object}.")
        options = {"task": task_text}
    else:
        payload, options = arguments, {"capability": params.name}
    steps = Steps(ctx, request_id=random_id())  # the invoke path's own default, made here to name it at once
    await steps.received(params.name)
    try:
        task = await invoke(caller=caller, payload=payload, mode="sync", request_id=steps.request_id,
                            on_step=steps.routed, **options)
        for _ in range(MAX_QUESTIONS):  # the agent asks: the client answers (elicitation, sampling), bounded
            if task.status != "input_required":
                break
            answer, refusal = await ask_client(ctx, task, steps)
            if refusal is not None:
                return refusal
            task = await invoke(caller=caller, payload=payload, mode="sync", request_id=steps.request_id,
                                answer=answer, **options)
    except ApplicationError as exc:
        await steps.refused(exc.message)
        return _error(exc.message, exc.details)
    body = task_output(task)
    reason = (task.error or {}).get("message") if isinstance(task.error, dict) else task.error
    await steps.finished(task.status, "" if task.status == "succeeded" else str(reason or ""))
    if task.status != "succeeded":
        return _error(f"Task {task.request_id} is {task.status}: {reason or 'no result'}", body.get("candidates"))
    result = task.result
    structured = result if isinstance(result, dict) else {"result": result}
    if params.name == ROUTE_TOOL:
        structured = {k: body[k] for k in ("request_id", "agent", "capability_version", "result")}
    return types.CallToolResult(content=content_of(result), structured_content=structured)


# --- an agent's question (input_required): asked of the client --------------------------------------------

MAX_QUESTIONS = 5  # questions relayed in one tools/call; one more leaves the task input_required (isError)
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def _can(ctx, capability: str) -> bool:
    """The client declared ``elicitation``/``sampling`` and this request can carry a server request (the 2025
    revisions' SSE answer; 2026-07-28 has no back channel)."""
    declared = ctx.session.client_capabilities
    with contextlib.suppress(Exception):
        return declared is not None and getattr(declared, capability) is not None and ctx.session.can_send_request
    return False


def requested_schema(data: dict) -> dict | None:
    """The JSON schema an agent's question gives for its answer (a data part's ``requestedSchema`` or
    ``schema``: an object schema), else None."""
    for key in ("requestedSchema", "schema"):
        schema = data.get(key)
        if isinstance(schema, dict) and schema.get("type") == "object" and isinstance(schema.get("properties"), dict):
            return schema
    return None


def _declined(task_pk: int, action: str) -> bool:
    """The client declined (or cancelled) the agent's question: the task is cancelled through the state machine
    and the agent's A2A task too (it stops waiting), as the A2A door's CancelTask does."""
    from routing.models import Task
    from routing.reaper import _cancel_a2a_task
    from routing.transitions import Timeline

    task = Task.objects.select_related("instance").get(pk=task_pk)
    timeline = Timeline(task)
    timeline.move(TaskStatus.CANCELLED, reason=f"MCP client: elicitation {action}")
    if not timeline.commit(expect=[TaskStatus.INPUT_REQUIRED]):
        return False
    _cancel_a2a_task(task)
    return True


async def ask_client(ctx, task, steps: Steps) -> tuple[Any, types.CallToolResult | None]:
    """Relay the task's question to the MCP client: a question carrying ``{"sampling": {...}}`` (an agent
    borrowing the client's model) as ``sampling/createMessage``, the model's answer (the CreateMessageResult)
    being the task's answer; any other as ``elicitation/create`` (the question's text, the schema it gave or
    ``{answer: string}``), the accepted content being the answer (``answer``'s string for the default schema).
    Returns (answer, None) or (None, the tool's error result): no capability, declined, cancelled."""
    question = task.result or {}
    text = str(question.get("question") or "")
    data: dict = question["data"] if isinstance(question.get("data"), dict) else {}
    asks = f"Task {task.request_id} is input_required: the agent asks: {text or '(no text)'}"
    meta = ServerMessageMetadata(related_request_id=ctx.request_id)
    try:
        if isinstance(data.get("sampling"), dict):
            if not _can(ctx, "sampling"):
                return None, _error(f"{asks} (it asks to sample the client's model; this client declared no "
                                    "sampling capability)")
            await steps.tell(50, f"task {task.request_id} input_required: the agent asks the client's model")
            sampling = types.CreateMessageRequestParams.model_validate(data["sampling"], by_name=False)
            sampled = await ctx.session.send_request(types.CreateMessageRequest(params=sampling),
                                                     types.CreateMessageResult, metadata=meta)
            return sampled.model_dump(by_alias=True, mode="json", exclude_none=True), None
        if not _can(ctx, "elicitation"):
            return None, _error(asks)
        schema = requested_schema(data)
        await steps.tell(50, f"task {task.request_id} input_required: asking the client (elicitation)")
        elicited = await ctx.session.send_request(types.ElicitRequest(params=types.ElicitRequestFormParams(
            message=text or "The agent needs an answer.", requested_schema=schema or ANSWER_SCHEMA)),
            types.ElicitResult, metadata=meta)
    except ValidationError as exc:
        return None, _error(f"{asks} (its sampling request is not valid: {exc.errors()[0].get('msg')})")
    except Exception as exc:  # the client answered an error (MCPError) or is gone: the task still asks
        logger.info("MCP client did not answer the agent's question", extra={"request_id": task.request_id},
                    exc_info=True)
        return None, _error(f"{asks} (the client did not answer: {exc})")
    if elicited.action != "accept":
        cancelled = await engine.db(_declined, task.pk, elicited.action)
        await steps.finished("cancelled" if cancelled else task.status, f"the client's user chose {elicited.action}")
        return None, _error(f"Task {task.request_id} {'is cancelled' if cancelled else 'was not answered'}: the "
                            f"user chose {elicited.action} when the agent asked: {text}")
    content = dict(elicited.content or {})
    return (content.get("answer") if schema is None and isinstance(content.get("answer"), str) else content), None


class _Server(Server):
    """Declares ``tools.listChanged`` on the 2025 revisions too (the SDK derives it from the listen handler on
    2026-07-28 and from NotificationOptions before)."""

    def create_initialization_options(self, notification_options=None, experimental_capabilities=None,
                                      extensions=None):
        return super().create_initialization_options(notification_options or NotificationOptions(tools_changed=True),
                                                     experimental_capabilities, extensions)


with warnings.catch_warnings():  # logging is deprecated on 2026-07-28, where the request's _meta asks instead
    warnings.simplefilter("ignore", MCPDeprecationWarning)
    server = _Server("agent-reach", version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool,
                     on_set_logging_level=set_logging_level, on_subscriptions_listen=ListenHandler(changes.bus),
                     instructions="Every ACTIVE capability of the Agent-Reach registry as a tool, and `route` to "
                                  "let the semantic router choose.")
_manager: StreamableHTTPSessionManager | None = None


@contextlib.asynccontextmanager
async def running():
    """Enter in the server's lifespan: the session manager's task group and the list-change listener live as
    long as the server."""
    global _manager
    _manager = StreamableHTTPSessionManager(app=server)  # SSE: a call's notifications ride its answer
    changes.listening = asyncio.get_running_loop().create_task(changes.listen())
    try:
        async with _manager.run():
            yield
    finally:
        changes.listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await changes.listening
        _manager = None


def _token(scope) -> str:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            return key.strip() if scheme.lower() in ("bearer", "token") else ""
    return ""


async def serve(scope, receive, send) -> None:
    from routing.api.fastlane import _caller, _respond

    caller = await _caller(_token(scope)) if _token(scope) else None
    if caller is None:
        return await _respond(send, 401, error_body("authentication_failed", "A caller token is required: "
                                               "Authorization: Bearer <token>."), {"WWW-Authenticate": "Bearer"})
    if _manager is None:
        return await _respond(send, 503, error_body("unavailable", "The MCP server is not running (lifespan off?)."))
    # the SDK binds a session to the principal that opened it: another caller's token gets 404 for it
    principal = AuthenticatedUser(AccessToken(token="", client_id=f"caller:{caller.pk}", scopes=[]))
    scope = {**scope, SCOPE_CALLER: caller, "user": principal}
    await _manager.handle_request(scope, receive, send)
