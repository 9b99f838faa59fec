"""Example agents as real HTTP servers, driven by their YAML descriptors.

One process may serve several agents, each on its own port. Each agent:
- answers ``POST /invoke`` per its descriptor (``{"endpoint_id", "result": {"answer", ...}, "usage"}``), with the
  endpoint id as fingerprint; ``http-async`` agents answer 202 and report through the gateway's callback API;
- answers ``GET /health``; an ``http-async`` agent also answers ``GET /status?request_id=`` (for polling); ``GET /stats`` returns how often each request id and capability was executed;
- takes fault settings at start (``--faults``) or at run time (``POST /faults``): ``latency_ms``, ``jitter_ms``,
  ``spike_rate`` + ``spike_ms``, ``hang`` (accept, never answer: a dead host), ``fail_rate`` (5xx), ``fail_status``, ``bad_output_rate``, ``down`` (503 on
  everything, health included), ``endpoint_id_override`` (answer as another agent);
- registers with the gateway and heartbeats every 10 s when ``--gateway`` and ``--keys`` are given;
- answers a capability listed in the descriptor's ``server.results`` with that fixed result, and one listed in
  ``server.errors`` with 400 and that message (fixtures: ``examples/conformance/``).

Usage: python examples/agents/server.py --descriptors examples/descriptors [--agents a,b] [--port-offset N]
       [--gateway http://127.0.0.1:8000 --keys .data/agent-keys.json] [--faults '{"order-agent": {...}}']
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml

DEFAULT_FAULTS = {"no_callback": False, "hang": False, "latency_ms": 0, "jitter_ms": 0, "spike_rate": 0.0, "spike_ms": 0, "fail_rate": 0.0,
                  "fail_status": 503, "bad_output_rate": 0.0, "down": False, "endpoint_id_override": "",
                  "call": None}


class AgentState:
    def __init__(self, descriptor: dict, port: int, gateway: str, key: str, host: str):
        self.descriptor = descriptor
        self.endpoint_id = descriptor["agent"]["endpoint_id"]
        server = descriptor.get("server", {}) or {}
        self.transport = server.get("transport", "http")
        self.port = port
        self.host = host
        self.gateway = gateway.rstrip("/") if gateway else ""
        self.key = key
        self.capabilities = {c["name"]: c for c in descriptor["capabilities"]}
        self.fixed_results = dict(server.get("results") or {})
        self.fixed_errors = dict(server.get("errors") or {})
        self.faults = dict(DEFAULT_FAULTS)
        self.faults["latency_ms"] = server.get("latency_ms", 0)
        self.lock = threading.Lock()
        self.executions: Counter = Counter()
        self.async_status: dict[str, dict] = {}  # request id -> last report, for GET /status
        self.by_capability: Counter = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.max_concurrency = int(server.get("max_concurrency", 16))
        self.max_qps = float(server.get("max_qps", 100))
        self.started_at = datetime.now(UTC).isoformat()
        self.reg_version = int(time.time() * 1000)
        self.rng = random.Random(hash(self.endpoint_id) & 0xFFFF)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def delay_s(self) -> float:
        f = self.faults
        ms = f["latency_ms"] + (self.rng.uniform(0, f["jitter_ms"]) if f["jitter_ms"] else 0)
        if f["spike_rate"] and self.rng.random() < f["spike_rate"]:
            ms += f["spike_ms"]
        return ms / 1000.0

    def answer(self, capability: str, payload: dict) -> dict:
        cap = self.capabilities.get(capability) or next(iter(self.capabilities.values()))
        text = json.dumps(payload, ensure_ascii=False)[:200]
        return {"answer": f"{self.endpoint_id} handled {cap['name']}: {text}", "capability": cap["name"]}

    # -- gateway client ------------------------------------------------------------------------------------
    def _headers(self) -> dict:
        return {"Authorization": f"Agent {self.key}"}

    def register(self) -> None:
        body = {
            "endpoint_id": self.endpoint_id, "environment": self.descriptor["agent"]["environment"],
            "instance_id": f"{self.host}:{self.port}", "url": f"{self.base_url}/invoke",
            "transport": self.transport, "health_url": f"{self.base_url}/health",
            "status_url": f"{self.base_url}/status" if self.transport == "http-async" else "",
            "max_concurrency": self.max_concurrency, "max_qps": self.max_qps,
            "reg_version": self.reg_version, "started_at": self.started_at,
        }
        for attempt in range(30):
            try:
                r = httpx.post(f"{self.gateway}/api/v1/agents/register", json=body, headers=self._headers(), timeout=5)
                if r.status_code < 300:
                    return
                print(f"[{self.endpoint_id}] register refused: {r.status_code} {r.text}", file=sys.stderr)
                return
            except httpx.HTTPError:
                time.sleep(min(2.0, 0.2 * (attempt + 1)))

    def heartbeat_forever(self, interval: float) -> None:
        while True:
            time.sleep(interval)
            if self.faults["down"]:
                continue
            try:
                r = httpx.post(f"{self.gateway}/api/v1/agents/heartbeat", headers=self._headers(), timeout=5,
                               json={"instance_id": f"{self.host}:{self.port}", "in_flight": self.in_flight,
                                     "load": self.in_flight / max(1, self.max_concurrency)})
                if r.status_code in (404, 409):
                    self.register()
            except httpx.HTTPError:
                pass

    def report(self, request_id: str, status: str, result: dict | None = None, error: str = "") -> None:
        body = {"status": status}
        if result is not None:
            body["result"] = result
        if error:
            body["error"] = error
        self.async_status[request_id] = body
        if self.faults["no_callback"] or not self.gateway:
            return  # the gateway polls GET /status instead
        for attempt in range(5):
            try:
                r = httpx.post(f"{self.gateway}/api/v1/tasks/{request_id}/callback", json=body,
                               headers=self._headers(), timeout=5)
                if r.status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2 * (attempt + 1))


def make_handler(state: AgentState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        protocol_version = "HTTP/1.1"  # keep-alive: a gateway's connection pool reuses its connections

        def setup(self):
            super().setup()
            # headers and body go out in separate writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args):  # quiet
            return

        def _send(self, status: int, body: dict) -> None:
            raw = json.dumps(body, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            if not length:
                return {}
            try:
                return json.loads(self.rfile.read(length))
            except ValueError:
                return {}

        def _hang(self) -> bool:
            """A dead host: the connection is accepted and never answered (until 5 minutes pass)."""
            if state.faults["hang"] and not self.path.startswith(("/faults", "/stats")):
                time.sleep(300)
                return True
            return False

        def do_GET(self):
            if self._hang():
                return None
            if self.path.startswith("/health"):
                if state.faults["down"]:
                    return self._send(503, {"status": "down"})
                return self._send(200, {"status": "ok", "endpoint_id": state.endpoint_id})
            if self.path.startswith("/status"):
                from urllib.parse import parse_qs, urlparse

                rid = (parse_qs(urlparse(self.path).query).get("request_id") or [""])[0]
                return self._send(200, state.async_status.get(rid, {"status": "accepted"}))
            if self.path.startswith("/stats"):
                with state.lock:
                    return self._send(200, {"endpoint_id": state.endpoint_id, "executions": dict(state.executions),
                                            "by_capability": dict(state.by_capability),
                                            "max_in_flight": state.max_in_flight, "in_flight": state.in_flight})
            return self._send(404, {"error": "not found"})

        def do_POST(self):
            if self._hang():
                return None
            body = self._body()
            if self.path.startswith("/faults"):
                with state.lock:
                    if body.get("reset"):
                        state.faults = dict(DEFAULT_FAULTS)
                        state.executions.clear()
                        state.by_capability.clear()
                        state.max_in_flight = 0
                    state.faults.update({k: v for k, v in body.items() if k in DEFAULT_FAULTS})
                return self._send(200, {"faults": state.faults})
            if not self.path.startswith("/invoke"):
                return self._send(404, {"error": "not found"})
            if state.faults["down"]:
                return self._send(503, {"error": "agent down"})
            request_id = self.headers.get("X-Reach-Request-Id") or body.get("request_id", "")
            capability = body.get("capability", "")
            with state.lock:
                state.executions[request_id] += 1
                state.by_capability[capability] += 1
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                if state.transport == "http-async":
                    threading.Thread(target=run_async, args=(state, request_id, capability, body), daemon=True).start()
                    return self._send(202, {"endpoint_id": state.endpoint_id, "accepted": True})
                time.sleep(state.delay_s())
                if state.faults["fail_rate"] and state.rng.random() < state.faults["fail_rate"]:
                    status = int(state.faults["fail_status"])
                    return self._send(status, {"error": "injected failure", "retryable": status >= 500})
                if capability in state.fixed_errors:
                    return self._send(400, {"error": state.fixed_errors[capability], "retryable": False})
                result = state.fixed_results.get(capability) or state.answer(capability, body.get("payload") or {})
                if state.faults["call"]:
                    result["nested"] = nested_call(state, self.headers)
                    if result["nested"].get("status") != 200:
                        return self._send(502, {"error": "a dependency failed", "retryable": True,
                                                "nested": result["nested"]})
                if state.faults["bad_output_rate"] and state.rng.random() < state.faults["bad_output_rate"]:
                    result = {"unexpected": True}
                usage = {"input_tokens": 100 + len(json.dumps(body)) // 4, "output_tokens": 50}
                return self._send(200, {"endpoint_id": state.faults["endpoint_id_override"] or state.endpoint_id,
                                        "result": result, "usage": usage})
            finally:
                with state.lock:
                    state.in_flight -= 1

    return Handler


def nested_call(state: AgentState, headers) -> dict:
    """An orchestrator calls another agent. Through the gateway (``{"token", "task" | "capability"}``), forwarding
    the reach headers; or, as a naive baseline, straight to a random one of ``{"urls": [...]}`` with a 20 s timeout
    and two blind retries."""
    spec = state.faults["call"]
    if spec.get("urls"):
        url = random.choice(spec["urls"])
        for _ in range(3):
            try:
                r = httpx.post(url, json={"capability": spec.get("capability", ""), "payload": {}}, timeout=20)
                if r.status_code < 500:
                    return {"status": r.status_code}
            except httpx.HTTPError:
                pass
        return {"status": 0}
    forward = {k: v for k, v in headers.items() if k.lower().startswith("x-reach-") or k.lower() == "traceparent"}
    forward["Authorization"] = f"Token {spec['token']}"
    forward.pop("X-Reach-Request-Id", None)
    body = {"payload": spec.get("payload", {})}
    body["task" if spec.get("task") else "capability"] = spec.get("task") or spec["capability"]
    try:
        r = httpx.post(f"{state.gateway or spec['gateway']}/api/v1/invoke", headers=forward, timeout=30, json=body)
        return {"status": r.status_code, "body": r.json()}
    except (httpx.HTTPError, ValueError) as exc:
        return {"status": 0, "error": str(exc)}


def run_async(state: AgentState, request_id: str, capability: str, body: dict) -> None:
    time.sleep(0.05)
    state.report(request_id, "running")
    time.sleep(state.delay_s())
    if state.faults["fail_rate"] and state.rng.random() < state.faults["fail_rate"]:
        state.report(request_id, "failed", error="injected failure")
    else:
        state.report(request_id, "succeeded", result=state.answer(capability, body.get("payload") or {}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--descriptors", default=str(Path(__file__).resolve().parent.parent / "descriptors"))
    parser.add_argument("--agents", default="", help="Comma-separated endpoint ids (default: all).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port-offset", type=int, default=0)
    parser.add_argument("--gateway", default="")
    parser.add_argument("--keys", default="", help="JSON file {endpoint_id: agent key}.")
    parser.add_argument("--heartbeat", type=float, default=10.0)
    parser.add_argument("--faults", default="{}", help='JSON {endpoint_id: {fault: value}}.')
    args = parser.parse_args(argv)

    wanted = {a for a in args.agents.split(",") if a}
    keys = json.loads(Path(args.keys).read_text()) if args.keys else {}
    faults = json.loads(args.faults)
    states = []
    for path in sorted(Path(args.descriptors).glob("*.y*ml")):
        descriptor = yaml.safe_load(path.read_text(encoding="utf-8"))
        endpoint_id = descriptor["agent"]["endpoint_id"]
        if wanted and endpoint_id not in wanted:
            continue
        port = int((descriptor.get("server") or {}).get("port", 0)) + args.port_offset
        state = AgentState(descriptor, port, args.gateway, keys.get(endpoint_id, ""), args.host)
        state.faults.update(faults.get(endpoint_id, {}))
        ThreadingHTTPServer.request_queue_size = 4096  # many callers connect at once (the default backlog is 5)
        server = ThreadingHTTPServer((args.host, port), make_handler(state))
        server.daemon_threads = True
        state.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        states.append(state)
        print(f"agent {endpoint_id} ({state.transport}) on {state.base_url}", flush=True)
    if args.gateway:
        for state in states:
            if state.key:
                state.register()
                threading.Thread(target=state.heartbeat_forever, args=(args.heartbeat,), daemon=True).start()
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()


if __name__ == "__main__":
    main()
