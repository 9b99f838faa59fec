"""An example agent served as a real A2A v1.0 server (a2a-sdk), from one of the example descriptors.

The agent's capabilities become the skills of its agent card (``/.well-known/agent-card.json``); it speaks
JSON-RPC at ``/`` and HTTP+JSON at ``/rest``. A message is answered like the plain example agent answers
``POST /invoke`` (``{"answer": ...}``, as a data artifact), except that a message id starting with one of the A2A
TCK's prefixes (``scenarios/*.feature`` of the vendored TCK) gets the behaviour the TCK expects: a direct message,
text/file/data artifacts, ``input-required``, a rejection, streamed status updates, a long task.

MCP fixtures (a descriptor capability with ``fixture: elicitation`` or ``fixture: sampling``, as
``examples/a2a/mcp-fixture-a2a-agent.yaml``; the MCP conformance run's ``test_elicitation`` and ``test_sampling``):
a first turn whose data has ``message`` (elicitation) or ``prompt`` (sampling) is answered ``input-required``: the
message as text with a data part ``{"requestedSchema": {username, email}}``, or a data part ``{"sampling":
{"messages": [...], "maxTokens": 100}}`` (the agent borrows its caller's model: see README *A2A and MCP*); the next
turn completes with MCP text content ``User response: ...`` / ``LLM response: <the model's text>``.

Test hooks (not part of A2A): ``GET /stats`` (executions per message id and task id) and ``POST /faults``
(``{"card_url": "...", "card_name": "...", "extra_skill": "...", "reset": true}`` change the card it serves, as an
agent that rewrites its own card would; ``latency_ms`` delays every answer).

Push notifications (``--push``): the card declares ``pushNotifications`` and the agent delivers each task event
to the push config a client sends (a2a-sdk's push sender; the config's token as ``X-A2A-Notification-Token``).
Off by default, as in the TCK's own reference agent.

Usage: python examples/a2a_agent.py [--descriptor examples/descriptors/order-agent.yaml] [--host H] [--port P]
       [--push]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

import httpx
import uvicorn
import yaml
from a2a.helpers.proto_helpers import new_task
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks.base_push_notification_sender import BasePushNotificationSender
from a2a.server.tasks.inmemory_push_notification_config_store import InMemoryPushNotificationConfigStore
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentProvider, AgentSkill, Part, TaskState
from a2a.utils.errors import A2AError
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Value
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

DEFAULT_DESCRIPTOR = Path(__file__).resolve().parent / "descriptors" / "order-agent.yaml"
MODES = ["text/plain", "application/json"]
STREAMING_WAIT_S = 4  # "wait for 2x streaming timeout" (the TCK's streaming timeout is 2 s)


def _data_part(value: dict) -> Part:
    return Part(data=json_format.ParseDict(value, Value()), media_type="application/json")


USER_SCHEMA = {"type": "object", "properties": {"username": {"type": "string", "description": "Your username"},
                                               "email": {"type": "string", "description": "Your email address"}},
               "required": ["username", "email"]}


def message_input(message) -> tuple[str, dict]:
    """The text and the data (our payload) of an A2A message."""
    texts, data = [], {}
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            value = json_format.MessageToDict(part.data)
            if isinstance(value, dict):
                data.update(value)
    return " ".join(texts), data


class ExampleState:
    def __init__(self, descriptor: dict, base_url: str, push: bool = False):
        self.descriptor = descriptor
        self.push = push
        self.base_url = base_url.rstrip("/")
        self.executions: Counter = Counter()
        self.tasks: Counter = Counter()
        self.contexts: dict[str, str] = {}  # message id -> context id
        self.texts: dict[str, str] = {}  # message id -> its text parts
        self.faults: dict = {}
        self.fixtures = {c["fixture"] for c in descriptor["capabilities"] if c.get("fixture")}
        self.asked: dict[str, str] = {}  # task id -> the fixture question it asked (elicitation, sampling)

    @property
    def endpoint_id(self) -> str:
        return self.descriptor["agent"]["endpoint_id"]

    def card(self) -> AgentCard:
        agent = self.descriptor["agent"]
        url = self.faults.get("card_url") or self.base_url
        skills = [AgentSkill(id=c["name"], name=c["name"], description=c.get("description", ""),
                             tags=list(c.get("tags") or []), examples=list(c.get("examples") or []),
                             input_modes=MODES, output_modes=MODES)
                  for c in self.descriptor["capabilities"]]
        if self.faults.get("extra_skill"):
            name = self.faults["extra_skill"]
            skills.append(AgentSkill(id=name, name=name, description=f"{name} (added later)", tags=["added"]))
        return AgentCard(
            name=self.faults.get("card_name") or agent.get("display_name") or self.endpoint_id,
            description=agent.get("description", ""),
            version="1.0.0",
            provider=AgentProvider(organization=agent.get("team", "example"), url="https://example.com"),
            supported_interfaces=[
                AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
                AgentInterface(url=f"{url}/rest", protocol_binding="HTTP+JSON", protocol_version="1.0"),
            ],
            capabilities=AgentCapabilities(streaming=True, push_notifications=self.push),
            default_input_modes=MODES, default_output_modes=MODES, skills=skills,
        )

    def answer(self, text: str, data: dict) -> dict:
        cap = self.descriptor["capabilities"][0]
        shown = json.dumps(data, ensure_ascii=False)[:200] if data else text[:200]
        return {"answer": f"{self.endpoint_id} handled {cap['name']}: {shown}", "capability": cap["name"]}


class ExampleExecutor(AgentExecutor):
    """The TCK's message-id-prefix behaviours (its reference agent ``sut/a2a-python``), else the example answer."""

    def __init__(self, state: ExampleState):
        self.state = state

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:  # noqa: C901, PLR0911, PLR0912
        task_id, context_id, message = context.task_id, context.context_id, context.message
        if task_id is None or context_id is None:
            return
        updater = TaskUpdater(event_queue, task_id, context_id)
        if message is None:
            await updater.complete(updater.new_agent_message([Part(text="No message provided")]))
            return
        mid = message.message_id
        self.state.executions[mid] += 1
        self.state.tasks[task_id] += 1
        self.state.contexts[mid] = context_id
        self.state.texts[mid] = message_input(message)[0]
        follow_up = context.current_task is not None  # the answer to an input-required turn
        text_file = Part(raw=b"tck", media_type="text/plain", filename="output.txt")
        created = context.current_task is None and not mid.startswith(("tck-message-response", "tck-reject-task"))
        if created:  # a2a-sdk 1.x: the executor creates the task before its first status update
            await event_queue.enqueue_event(new_task(task_id, context_id, TaskState.TASK_STATE_SUBMITTED,
                                                     history=[message]))
        if self.state.faults.get("latency_ms"):  # after the task exists: returnImmediately answers at once
            if created:
                await updater.start_work()
            await asyncio.sleep(self.state.faults["latency_ms"] / 1000)
        streamed = {"tck-stream-artifact-text": "Streamed text content", "tck-stream-ordering-001": "Ordered output",
                    "tck-stream-001": "Stream hello from TCK", "tck-stream-003": "Stream task lifecycle"}
        # longest prefixes first: "tck-artifact-file-url" before "tck-artifact-file"
        if mid.startswith("tck-stream-artifact-chunked"):
            await updater.start_work()
            await updater.add_artifact(parts=[Part(text="chunk-1 ")], append=True)
            await updater.add_artifact(parts=[Part(text="chunk-2")], append=True, last_chunk=True)
            await updater.complete()
        elif mid.startswith("test-resubscribe-message-id"):
            await updater.start_work()
            await asyncio.sleep(STREAMING_WAIT_S)
            await updater.complete()
        elif mid.startswith(tuple(streamed)):
            await updater.start_work()
            await updater.add_artifact(parts=[Part(text=next(v for k, v in streamed.items() if mid.startswith(k)))])
            await updater.complete()
        elif mid.startswith("tck-stream-artifact-file"):
            await updater.start_work()
            await updater.add_artifact(parts=[text_file])
            await updater.complete()
        elif mid.startswith("tck-stream-002"):
            await updater.complete()
        elif mid.startswith("tck-artifact-file-url"):
            await updater.add_artifact(parts=[Part(url="https://example.com/output.txt", media_type="text/plain",
                                                   filename="output.txt")])
            await updater.complete()
        elif mid.startswith("tck-artifact-file"):
            await updater.add_artifact(parts=[text_file])
            await updater.complete()
        elif mid.startswith("tck-artifact-text"):
            await updater.add_artifact(parts=[Part(text="Generated text content")])
            await updater.complete()
        elif mid.startswith("tck-artifact-data"):
            await updater.add_artifact(parts=[_data_part({"key": "value", "count": 42})])
            await updater.complete()
        elif mid.startswith("tck-message-response"):
            await event_queue.enqueue_event(updater.new_agent_message([Part(text="Direct message response")]))
        elif mid.startswith("tck-input-required") and not follow_up:
            await updater.requires_input(updater.new_agent_message([Part(text="Which order do you mean?")]))
        elif mid.startswith("tck-reject-task"):
            raise A2AError("rejected")
        elif mid.startswith("tck-complete-task"):
            await updater.complete(updater.new_agent_message([Part(text="Hello from TCK")]))
        elif self.state.fixtures and (follow_up and task_id in self.state.asked or not follow_up and
                                      self._fixture_of(message) is not None):
            await self._fixture_turn(updater, task_id, message, follow_up)
        else:
            text, data = message_input(message)
            result = self.state.answer(text, data)
            if follow_up:
                result["follow_up"] = True
            await updater.add_artifact(parts=[_data_part(result)], name="result")
            await updater.complete()

    def _fixture_of(self, message) -> str | None:
        data = message_input(message)[1]
        if "elicitation" in self.state.fixtures and isinstance(data.get("message"), str):
            return "elicitation"
        if "sampling" in self.state.fixtures and isinstance(data.get("prompt"), str):
            return "sampling"
        return None

    async def _fixture_turn(self, updater: TaskUpdater, task_id: str, message, follow_up: bool) -> None:
        """The MCP fixtures: ask (input-required) on the first turn, answer with what came back on the next."""
        text, data = message_input(message)
        if not follow_up:
            kind = self._fixture_of(message)
            self.state.asked[task_id] = kind or ""
            if kind == "elicitation":
                parts = [Part(text=data["message"]), _data_part({"requestedSchema": USER_SCHEMA})]
            else:
                parts = [Part(text="The agent asks your model."), _data_part({"sampling": {
                    "messages": [{"role": "user", "content": {"type": "text", "text": data["prompt"]}}],
                    "maxTokens": 100}})]
            await updater.requires_input(updater.new_agent_message(parts))
            return
        kind = self.state.asked.pop(task_id)
        if kind == "elicitation":
            said = f"User response: accept, {json.dumps(data, ensure_ascii=False, sort_keys=True) if data else text}"
        else:
            content = data.get("content") if isinstance(data.get("content"), dict) else {}
            said = f"LLM response: {content.get('text') or text or json.dumps(data, ensure_ascii=False)}"
        await updater.add_artifact(parts=[_data_part({"content": [{"type": "text", "text": said}]})], name="result")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        if context.task_id is None or context.context_id is None:
            return
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def build_app(descriptor: dict, base_url: str, push: bool = False) -> tuple[Starlette, ExampleState]:
    state = ExampleState(descriptor, base_url, push)
    push_options = {}
    if push:
        configs = InMemoryPushNotificationConfigStore()
        push_options = {"push_config_store": configs,
                        "push_sender": BasePushNotificationSender(httpx.AsyncClient(timeout=10), configs)}
    handler = DefaultRequestHandler(agent_executor=ExampleExecutor(state), task_store=InMemoryTaskStore(),
                                    agent_card=state.card(), validate_input_modes=True, **push_options)

    async def card_modifier(_card: AgentCard) -> AgentCard:
        return state.card()

    async def stats(_request: Request) -> JSONResponse:
        return JSONResponse({"endpoint_id": state.endpoint_id, "executions": dict(state.executions),
                             "tasks": dict(state.tasks), "contexts": state.contexts, "texts": state.texts})

    async def faults(request: Request) -> JSONResponse:
        body = await request.json()
        if body.pop("reset", False):
            state.faults.clear()
            state.executions.clear()
            state.tasks.clear()
            state.contexts.clear()
            state.texts.clear()
        state.faults.update(body)
        return JSONResponse({"faults": state.faults})

    async def jsonrpc_content_type(request: Request):
        """A2A 5.4: a request body that is not JSON by its Content-Type is ContentTypeNotSupportedError (-32005);
        the SDK would try to parse it and answer ParseError."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind and kind not in ("application/json", "application/a2a+json"):
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32005, "message": f"Content-Type {kind} is not supported: send application/json"}})
        return await rpc(request)

    rpc = create_jsonrpc_routes(handler, rpc_url="/")[0].endpoint
    routes = [*create_agent_card_routes(state.card(), card_modifier=card_modifier),
              Route("/stats", stats, methods=["GET"]), Route("/faults", faults, methods=["POST"]),
              Route("/", jsonrpc_content_type, methods=["POST"]), *create_rest_routes(handler, path_prefix="/rest")]
    return Starlette(routes=routes, middleware=[Middleware(RestJsonContentType)]), state


class RestJsonContentType:
    """A2A 11.1: the HTTP+JSON binding answers ``application/json`` (the SDK labels it ``application/a2a+json``)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/rest"):
            return await self.app(scope, receive, send)

        async def relabel(message):
            if message["type"] == "http.response.start":
                message["headers"] = [(k, b"application/json" if k == b"content-type" and v == b"application/a2a+json"
                                       else v) for k, v in message.get("headers", [])]
            await send(message)

        return await self.app(scope, receive, relabel)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--descriptor", default=str(DEFAULT_DESCRIPTOR))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9201)
    parser.add_argument("--push", action="store_true", help="Declare and deliver push notifications.")
    args = parser.parse_args(argv)
    descriptor = yaml.safe_load(Path(args.descriptor).read_text(encoding="utf-8"))
    app, _ = build_app(descriptor, f"http://{args.host}:{args.port}", push=args.push)
    print(f"a2a agent {descriptor['agent']['endpoint_id']} on http://{args.host}:{args.port}"
          f"{' (push notifications)' if args.push else ''}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

