"""``make run``: set up and start the whole platform locally; Ctrl-C stops every process it started.

Steps: DEBUG on (a development server; said on start), embedded services (when DATABASE_URL / REDIS_URL are
unset), migrate, admin user, an example caller with its token, import examples/ as ACTIVE, issue the example
agents' keys, then start the web server (uvicorn), a Celery worker, Celery beat and the
example agents (which register and heartbeat), and print the URLs.
"""

from __future__ import annotations

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

    start("web", web_command(host, port))
    start("worker", worker_command())
    start("beat", [PY, "-m", "celery", "-A", "reach_platform", "beat", "-l", "warning"])
    for _ in range(100):
        try:
            if httpx.get(f"{gateway}/admin/login/", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    start("agents", [PY, "examples/agents/server.py", "--gateway", gateway, "--keys", str(data / "agent-keys.json"),
                     "--port-offset", os.environ.get("REACH_AGENT_PORT_OFFSET", "0")])
    wait_for_agents()

    print(f"\nAgent-Reach is up:\n  admin     {gateway}/admin/\n  API docs  {gateway}/api/docs/\n"
          f"  API       {gateway}/api/v1/\n  {admin_line}\n  Caller token ({caller}): {caller_token}\n"
          f"(Ctrl-C stops everything)\n", flush=True)

    def stop(*_):
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
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
