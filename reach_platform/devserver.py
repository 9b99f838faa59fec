"""``make run``: set up and start the whole platform locally; Ctrl-C stops every process it started.

Steps: DEBUG on (a development server; said on start), embedded services (when DATABASE_URL / REDIS_URL are
unset), migrate, admin user, an example caller with its token, import examples/ as ACTIVE, issue the example
agents' keys, then start the web server (uvicorn), a Celery worker, Celery beat, the
example agents (which register and heartbeat) and the example A2A agent (examples/a2a_agent.py --push, registered
from its agent card through the card import service and activated), and print the URLs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from reach_platform.local_services import DATA_DIR

BASE = Path(__file__).resolve().parent.parent
PY = sys.executable
A2A_DESCRIPTOR = "examples/a2a/shipment-agent.yaml"
A2A_PORT = 9201  # plus REACH_AGENT_PORT_OFFSET, as the other example agents


def manage(*args: str, capture: bool = False) -> str:
    done = subprocess.run([PY, "manage.py", *args], cwd=BASE, check=True, text=True,
                          stdout=subprocess.PIPE if capture else None)
    return (done.stdout or "").strip()


def wait_for_agents(timeout: float = 60) -> None:
    """Until every example agent has registered, so that the first call after "is up" finds them."""
    from registry.models import AllowlistEntry, Instance  # after django.setup()

    expected = set(AllowlistEntry.objects.values_list("endpoint_id", flat=True))
    deadline = time.time() + timeout
    while time.time() < deadline:
        live = set(Instance.objects.filter(deregistered_at__isnull=True).values_list("agent__endpoint_id", flat=True))
        if expected <= live:
            return
        time.sleep(0.5)
    print(f"agents not registered after {timeout:.0f} s: {sorted(expected - live)}", flush=True)


def wait_ok(url: str, *, tries: int) -> None:
    """Until ``url`` answers 200 (a refused connection waits 0.2 s; at most ``tries`` attempts)."""
    for _ in range(tries):
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each started process's group, then SIGKILL what has not ended within 10 s."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + 10
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def register_a2a_agent(url: str) -> str:
    """Register the example A2A agent from its card (once: a later start finds it registered), activate its
    skills' drafts (an admin may activate unreviewed drafts; a real team submits them for review) and say so."""
    from registry.a2a_cards import agent_card_import, card_location
    from registry.choices import VersionState
    from registry.models import AgentCard, CapabilityVersion
    from registry.services import capability_version_activate

    record = AgentCard.objects.filter(card_url=card_location(url)).select_related("agent").first()
    if record is None:
        record = agent_card_import(url=url, team="logistics", environment="dev", actor_label="make run")
        for version in CapabilityVersion.objects.filter(capability__agent=record.agent, state=VersionState.DRAFT):
            capability_version_activate(version=version, actor_label="make run")
        # the worker embeds the activated versions (queued on activation): routable once their centroid exists
        deadline = time.time() + 120
        while time.time() < deadline and CapabilityVersion.objects.filter(
                capability__agent=record.agent, state=VersionState.ACTIVE).exclude(vectors__kind="centroid").exists():
            time.sleep(0.5)
    skills = ", ".join(s.get("id", "") for s in record.card.get("skills") or [])
    push = " (push notifications)" if (record.card.get("capabilities") or {}).get("pushNotifications") else ""
    return f"{record.agent.endpoint_id}{push}, registered from its card {record.card_url}: {skills}"


def main() -> None:
    # A development server: Django's debug pages and the local defaults. Deployments leave DEBUG off.
    os.environ.setdefault("DEBUG", "true")
    print(f"DEBUG={os.environ['DEBUG']} (make run is for development; see README 'Serving' for production)",
          flush=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")
    # The example agents (and a local callback receiver) listen on loopback, which the address guard refuses
    # unless allowed; production lists its agents' networks instead.
    for name in ("REACH_AGENT_ALLOWED_NETWORKS", "REACH_CALLBACK_ALLOWED_NETWORKS"):
        if name not in os.environ:
            os.environ[name] = "127.0.0.0/8,::1/128"
            print(f"make run: {name}={os.environ[name]} (loopback allowed for the local agents)", flush=True)
    import django

    django.setup()  # starts the embedded PostgreSQL / Redis when needed
    from django.conf import settings

    env = dict(os.environ)
    env["DATABASE_URL"] = settings.DATABASE_URL
    env["REDIS_URL"] = settings.REDIS_URL
    os.environ.update(env)
    host = os.environ.get("REACH_HOST", "127.0.0.1")
    port = os.environ.get("REACH_PORT", "8000")
    gateway = f"http://{host}:{port}"
    env.setdefault("REACH_PUBLIC_URL", gateway)  # where A2A agents push their task updates
    data = DATA_DIR
    manage("migrate", "--no-input", "-v", "0")
    admin_line = manage("reach_ensure_admin", capture=True)
    caller = os.environ.get("REACH_EXAMPLE_CALLER", "example-caller")
    caller_token = manage("reach_caller", caller, capture=True)
    manage("reach_setup_schedules")
    manage("reach_import", "examples/descriptors", "--activate")
    manage("reach_reembed", "--missing")  # ACTIVE versions an interrupted run left without vectors
    manage("reach_agent_keys", "--out", str(data / "agent-keys.json"))

    procs: list[subprocess.Popen] = []

    def start(name: str, cmd: list[str]) -> None:
        print(f"starting {name}: {' '.join(cmd)}", flush=True)
        procs.append(subprocess.Popen(cmd, cwd=BASE, env=env, start_new_session=True))

    from reach_platform.serving import web_command, worker_command

    try:  # a start-up that fails stops what it started (their own sessions would outlive this process)
        start("web", web_command(host, port))
        start("worker", worker_command())
        start("beat", [PY, "-m", "celery", "-A", "reach_platform", "beat", "-l", "warning"])
        wait_ok(f"{gateway}/admin/login/", tries=100)
        start("agents", [PY, "examples/agents/server.py", "--gateway", gateway, "--keys", str(data / "agent-keys.json"),
                         "--port-offset", os.environ.get("REACH_AGENT_PORT_OFFSET", "0")])
        wait_for_agents()
        a2a_url = f"http://{host}:{A2A_PORT + int(os.environ.get('REACH_AGENT_PORT_OFFSET', '0'))}"
        start("a2a agent", [PY, "examples/a2a_agent.py", "--descriptor", A2A_DESCRIPTOR, "--host", host, "--port",
                            a2a_url.rsplit(":", 1)[1], "--push"])
        wait_ok(f"{a2a_url}/.well-known/agent-card.json", tries=150)
        a2a_line = register_a2a_agent(a2a_url)
        a2a_id = a2a_line.split(" ", 1)[0]
    except BaseException:
        stop_all(procs)
        raise
    print(f"\nAgent-Reach is up:\n  admin     {gateway}/admin/\n  API docs  {gateway}/api/docs/\n"
          f"  API       {gateway}/api/v1/\n  MCP       {gateway}/mcp\n"
          f"  A2A agent {a2a_line}\n"
          f"  A2A door  {gateway}/a2a/{a2a_id}/.well-known/agent-card.json\n"
          f"  {admin_line}\n  Caller token ({caller}): {caller_token}\n"
          f"(Ctrl-C stops everything)\n", flush=True)

    def stop(*_):
        stop_all(procs)
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while True:
        for proc in procs:
            if proc.poll() is not None:
                print(f"process {proc.args!r} exited with {proc.returncode}; stopping", flush=True)
                stop()
        time.sleep(1)


if __name__ == "__main__":
    main()
