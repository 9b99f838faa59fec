"""``make run``: set up and start the whole platform locally; Ctrl-C stops every process it started.

Steps: embedded services (when DATABASE_URL / REDIS_URL are unset), migrate, admin user, import examples/ as
ACTIVE, issue the example agents' keys, then start the web server (gunicorn), a Celery worker, Celery beat and the
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

BASE = Path(__file__).resolve().parent.parent
PY = sys.executable


def manage(*args: str) -> None:
    subprocess.run([PY, "manage.py", *args], cwd=BASE, check=True)


def main() -> None:
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
    data = BASE / ".data"

    manage("migrate", "--no-input", "-v", "0")
    manage("reach_ensure_admin")
    manage("reach_setup_schedules")
    manage("reach_import", "examples/descriptors", "--activate")
    manage("reach_reembed", "--missing")  # ACTIVE versions an interrupted run left without vectors
    manage("reach_agent_keys", "--out", str(data / "agent-keys.json"))

    procs: list[subprocess.Popen] = []

    def start(name: str, cmd: list[str]) -> None:
        print(f"starting {name}: {' '.join(cmd)}", flush=True)
        procs.append(subprocess.Popen(cmd, cwd=BASE, env=env, start_new_session=True))

    start("web", [PY, "-m", "gunicorn", "reach_platform.wsgi", "-c", "reach_platform/gunicorn.conf.py",
                  "--bind", f"{host}:{port}"])
    start("worker", [PY, "-m", "celery", "-A", "reach_platform", "worker", "-l", "warning", "--concurrency", "4"])
    start("beat", [PY, "-m", "celery", "-A", "reach_platform", "beat", "-l", "warning"])
    for _ in range(100):
        try:
            if httpx.get(f"{gateway}/admin/login/", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    start("agents", [PY, "examples/agents/server.py", "--gateway", gateway, "--keys", str(data / "agent-keys.json")])

    print(f"\nAgent-Reach is up:\n  admin     {gateway}/admin/\n  API docs  {gateway}/api/docs/\n"
          f"  API       {gateway}/api/v1/\n(Ctrl-C stops everything)\n", flush=True)

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
                print(f"process {proc.args[:3]} exited with {proc.returncode}; stopping", flush=True)
                stop()
        time.sleep(1)


if __name__ == "__main__":
    main()
