"""The MCP server at ``/mcp`` (Streamable HTTP, the official ``mcp`` SDK), for callers with a caller token.

``tools/list`` lists every ACTIVE capability as a tool (its name, description, ``input_schema`` as
``inputSchema``, ``output_schema`` as ``outputSchema``) and one ``route`` tool (``{task, payload}``: the semantic
resolver picks the capability). ``tools/call`` is a sync invoke through the one invoke path
(``routing.invoke.invoke``): the caller's quota, idempotency, the gateway's rules and the task timeline hold as
for ``POST /api/v1/invoke``. A succeeded task answers its result as structured content; anything else answers
``isError`` with the task's error (or the refusal) as text.

Stateless and JSON-answering: any gateway node serves any request, with no session to pin. The token is
``Authorization: Bearer <token>`` (or ``Token <token>``, as the REST API takes it).
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from reach_platform import engine
from reach_platform.errors import ApplicationError, error_body

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


async def list_tools(ctx, params) -> types.ListToolsResult:
    rows = await engine.db(_active_tools)
    route = types.Tool(name=ROUTE_TOOL, input_schema=ROUTE_SCHEMA,
                       description="Describe the task in words: the semantic router picks the capability and the "
                                   "gateway runs it.")
    return types.ListToolsResult(tools=[*[_tool(row) for row in rows], route])


def _error(message: str, details: Any = None) -> types.CallToolResult:
    text = message + (f" {json.dumps(details, default=str)}" if details else "")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    from routing.api.serializers import task_output
    from routing.invoke import invoke

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
    try:
        task = await invoke(caller=caller, payload=payload, mode="sync", **options)
    except ApplicationError as exc:
        return _error(exc.message, exc.details)
    body = task_output(task)
    if task.status != "succeeded":
        reason = (task.error or {}).get("message") if isinstance(task.error, dict) else task.error
        return _error(f"Task {task.request_id} is {task.status}: {reason or 'no result'}", body.get("candidates"))
    result = task.result
    structured = result if isinstance(result, dict) else {"result": result}
    if params.name == ROUTE_TOOL:
        structured = {k: body[k] for k in ("request_id", "agent", "capability_version", "result")}
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(result, default=str))],
                                structured_content=structured)


server = Server("agent-reach", version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool,
                instructions="Every ACTIVE capability of the Agent-Reach registry as a tool, and `route` to let "
                             "the semantic router choose.")
_manager: StreamableHTTPSessionManager | None = None


@contextlib.asynccontextmanager
async def running():
    """Enter in the server's lifespan: the session manager's task group lives as long as the server."""
    global _manager
    _manager = StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)
    async with _manager.run():
        yield
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
    scope = {**scope, SCOPE_CALLER: caller}
    await _manager.handle_request(scope, receive, send)
