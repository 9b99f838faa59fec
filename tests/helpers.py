"""Real processes for tests: example agents and a Celery worker, pointed at the test database."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

BASE = Path(__file__).resolve().parent.parent
DESCRIPTORS = BASE / "examples" / "descriptors"


def as_user(user):
    """A DRF test client authenticated as ``user``."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


PROXY_DROPPED = {"content-length", "transfer-encoding", "connection", "keep-alive"}  # hop by hop: re-framed here


def token_proxy(target: str, token: str, *, keep_host: bool = True, on_answer=None):
    """An ASGI app for the conformance suites, which send no credentials: every request is forwarded to ``target``
    with ``Authorization: Bearer <token>`` and its answer streamed back as it comes (server-sent events
    included). ``keep_host``: the gateway sees the proxy's Host (so the cards it serves point at the proxy).
    ``on_answer(request_body, answer_head)`` is called with the first 64 KiB of each answer."""
    import httpx

    client = httpx.AsyncClient(timeout=httpx.Timeout(120, connect=5, read=None))
    dropped = {b"authorization", b"content-length", *([] if keep_host else [b"host"])}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k not in dropped]
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        request = client.build_request(scope["method"], target + path, content=body,
                                       headers=[*headers, ("authorization", f"Bearer {token}")])
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raw = f"proxy: {type(exc).__name__}".encode()
            await send({"type": "http.response.start", "status": 502,
                        "headers": [(b"content-length", str(len(raw)).encode())]})
            await send({"type": "http.response.body", "body": raw})
            return
        head = b""
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode(), v.encode()) for k, v in response.headers.items()
                                    if k.lower() not in PROXY_DROPPED]})
            try:
                async for chunk in response.aiter_raw():
                    if len(head) < 65536:
                        head += chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError:
                pass  # the gateway closed a stream (a GET stream whose session ended)
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            pass  # the suite closed a stream early
        finally:
            await response.aclose()
        if on_answer is not None:
            on_answer(body, head)

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.1, message: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message() if callable(message) else message}")


def wait_http_ok(url: str, timeout: float, message: str) -> None:
    def up():
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=timeout, message=message)


def stop_group(proc: subprocess.Popen | None, wait: float) -> None:
    """SIGTERM a process started with start_new_session, SIGKILL when it does not stop in time."""
    if proc and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def subprocess_env() -> dict:
    from django.conf import settings
    from django.db import connection

    env = dict(os.environ)
    env["DATABASE_URL"] = settings.DATABASE_URL
    env["REACH_DB_NAME"] = connection.settings_dict["NAME"]
    env["DJANGO_SETTINGS_MODULE"] = "reach_platform.settings"
    return env


class AgentProcess:
    """examples/agents/server.py in its own process, serving some agents on free ports."""

    def __init__(self, agents: list[str], *, gateway: str = "", keys: dict | None = None, faults: dict | None = None,
                 heartbeat: float = 10.0, tmp: Path | None = None, port_offset: int | None = None,
                 descriptors: Path = DESCRIPTORS):
        self.agents = agents
        self.descriptors = descriptors
        self.gateway = gateway
        self.keys = keys or {}
        self.faults = faults or {}
        self.heartbeat = heartbeat
        self.tmp = tmp or Path("/tmp")
        self.fixed_ports = port_offset is not None
        self.port_offset = port_offset if port_offset is not None else free_port() - 9100
        self.proc: subprocess.Popen | None = None
        self.urls: dict[str, str] = {}

    def start(self, tries: int = 3) -> AgentProcess:
        """Start the process; when one of its ports turns out to be taken, try again on fresh ports."""
        for attempt in range(tries):
            try:
                return self._start()
            except AssertionError:
                if self.proc and self.proc.poll() is None:
                    self.kill()
                if attempt == tries - 1 or self.fixed_ports:
                    raise
                self.port_offset = free_port() - 9100
                self.urls = {}
        return self

    def _start(self) -> AgentProcess:
        keys_file = self.tmp / f"keys-{os.getpid()}-{self.port_offset}.json"
        keys_file.write_text(json.dumps(self.keys))
        cmd = [sys.executable, str(BASE / "examples/agents/server.py"), "--descriptors", str(self.descriptors),
               "--agents", ",".join(self.agents),
               "--port-offset", str(self.port_offset), "--heartbeat", str(self.heartbeat),
               "--faults", json.dumps(self.faults)]
        if self.gateway:
            cmd += ["--gateway", self.gateway, "--keys", str(keys_file)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)
        for line in self.proc.stdout:
            if line.startswith("agent "):
                parts = line.split()
                self.urls[parts[1]] = parts[-1]
            if line.strip() == "ready":
                break
        assert set(self.urls) == set(self.agents), f"agents did not start: {self.urls}"
        return self

    def url(self, agent: str) -> str:
        return self.urls[agent]

    def stats(self, agent: str) -> dict:
        return httpx.get(f"{self.urls[agent]}/stats", timeout=5).json()

    def set_faults(self, agent: str, **faults) -> None:
        httpx.post(f"{self.urls[agent]}/faults", json=faults, timeout=5).raise_for_status()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


class WorkerProcess:
    """A real Celery worker, started as production starts it (reach_platform.serving.worker_command: a thread
    pool over the process's engine loop), on the test database and the test Redis database."""

    def __init__(self, concurrency: int = 2, extra: list[str] | None = None):
        self.concurrency = concurrency
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None

    def start(self) -> WorkerProcess:
        from reach_platform.celery import app
        from reach_platform.serving import worker_command

        cmd = worker_command(concurrency=self.concurrency, extra=["--without-gossip", "--without-mingle",
                                                                  *self.extra])
        self.proc = subprocess.Popen(cmd, cwd=BASE, env=subprocess_env(), start_new_session=True)
        wait_until(lambda: app.control.ping(timeout=0.5), timeout=60, message="celery worker to answer ping")
        return self

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes: no shutdown, no acks."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


class GatewayProcess:
    """The gateway served as production serves it (reach_platform.serving.web_command: uvicorn) on the test
    database and the test Redis database, on a free port: one node of a multi-node deployment."""

    def __init__(self, workers: int = 1, **env: str):
        self.workers = workers
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> GatewayProcess:
        from reach_platform.serving import web_command

        env = {**subprocess_env(), "REACH_WARM_UP": "0", "REACH_WARM_CONNECTIONS": "0", "DEBUG": "false", **self.env}
        self.proc = subprocess.Popen(web_command("127.0.0.1", self.port, workers=self.workers), cwd=BASE, env=env,
                                     start_new_session=True)

        wait_http_ok(f"{self.url}/admin/login/", timeout=60, message="gateway node to answer")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def run_async(coro):
    """asyncio.run in a thread of its own: a test may run while another library (Playwright's sync API) keeps an
    event loop running in the main thread."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class A2AAgentProcess:
    """examples/a2a_agent.py (an example agent served as an A2A v1.0 server) in its own process on a free port."""

    def __init__(self, descriptor: str = "order-agent.yaml", push: bool = False):
        self.descriptor = DESCRIPTORS / descriptor
        self.push = push
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> A2AAgentProcess:
        self.proc = subprocess.Popen([sys.executable, str(BASE / "examples/a2a_agent.py"), "--descriptor",
                                      str(self.descriptor), "--port", str(self.port),
                                      *(["--push"] if self.push else [])],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        wait_http_ok(f"{self.url}/.well-known/agent-card.json", timeout=30, message="A2A agent to serve its card")
        return self

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/stats", timeout=5).json()

    def set_faults(self, **faults) -> None:
        httpx.post(f"{self.url}/faults", json=faults, timeout=5).raise_for_status()

    def stop(self) -> None:
        stop_group(self.proc, 5)


MCP_FIXTURE_A2A = "../a2a/mcp-fixture-a2a-agent.yaml"  # relative to DESCRIPTORS


def a2a_agent_registered_from_card(url: str, team: str = "conformance") -> list[str]:
    """Register an A2A agent from its card (the card import service), activate and embed its skills' drafts and
    publish the routing snapshot, as ``make run`` does for its A2A agent; returns the capability names."""
    from registry.a2a_cards import agent_card_import
    from registry.choices import VersionState
    from registry.embedding import get_embedder
    from registry.embedding_service import capability_version_embed
    from registry.models import CapabilityVersion
    from registry.services import capability_version_activate
    from routing import a2a_transport, snapshot
    from routing.calibration_service import calibration_refresh

    record = agent_card_import(url=url, team=team, environment="dev", actor_label="tests")
    versions = list(CapabilityVersion.objects.filter(capability__agent=record.agent, state=VersionState.DRAFT))
    embedder = get_embedder()
    for version in versions:
        capability_version_activate(version=version, actor_label="tests")
        capability_version_embed(version=version, embedder=embedder)
    calibration_refresh()
    snapshot.bump_generation()
    a2a_transport._registered.clear()
    return [v.capability.name for v in versions]
