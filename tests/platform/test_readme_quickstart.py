"""The README's quick start, run as written: its three shell commands and its Python snippet are read out of
README.md (so this test breaks when the README drifts), `make run` is run as the Makefile's recipe does it, on a
free port and the test database, and the first call must succeed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from tests.helpers import BASE, free_port, subprocess_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
README_URL = "http://127.0.0.1:8000"


def quick_start_blocks() -> tuple[list[str], str]:
    text = (BASE / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("\n## ", text.index("## Quick start") + 3)]
    shell, python = re.findall(r"```sh\n(.*?)```", section, re.S)[0], re.findall(r"```python\n(.*?)```", section,
                                                                                  re.S)[0]
    return [line.strip() for line in shell.replace("\\\n", " ").splitlines() if line.strip()], python


def make_run_recipe() -> list[str]:
    """What `make run` runs after `make install` (which this checkout has done; running it here would reinstall
    the shared virtualenv)."""
    makefile = (BASE / "Makefile").read_text()
    recipe = re.search(r"^run: install\n\t(.+)$", makefile, re.M).group(1).strip()
    assert recipe == "$(PY) -m reach_platform.devserver", recipe
    return [sys.executable, "-m", "reach_platform.devserver"]


def test_the_readme_quick_start_works_as_written():
    commands, snippet = quick_start_blocks()
    assert len(commands) == 3 and commands[0] == "make run"
    assert "reach_caller" in commands[1] and commands[2].startswith("curl ")
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {**subprocess_env(), "REACH_PORT": str(port), "REACH_AGENT_PORT_OFFSET": str(free_port() - 9100),
           "REACH_ADMIN_PASSWORD": "pw-quickstart-1", "WEB_WORKERS": "1",
           "LOG_LEVEL": "WARNING"}
    server = subprocess.Popen(make_run_recipe(), cwd=BASE, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output: list[str] = []

        def pump() -> None:  # what the servers print, read all along (a full pipe would block them)
            for line in server.stdout:
                output.append(line)

        threading.Thread(target=pump, daemon=True).start()
        # make run's children keep its stdout open after it exits: wait for its last line or its exit, bounded,
        # rather than read until that line comes
        wait_until(lambda: server.poll() is not None or any("Ctrl-C stops everything" in line for line in output),
                   timeout=600, message=lambda: f"make run to come up: {''.join(output)[-3000:]}")
        printed = "".join(output)
        assert server.poll() is None, f"make run exited with {server.returncode}: {printed[-3000:]}"
        assert "Agent-Reach is up" in printed, printed[-3000:]
        assert "DEBUG=true" in printed and "Admin login: admin / pw-quickstart-1" in printed
        assert re.search(r"Caller token \(example-caller\): [0-9a-f]{40}", printed)
        # the example A2A agent, registered from its card
        assert re.search(r"A2A agent shipment-agent \(push notifications\), registered from its card "
                         r"http://127\.0\.0\.1:\d+/\.well-known/agent-card\.json: shipment\.track", printed), printed
        assert f"A2A door  {base_url}/a2a/shipment-agent/.well-known/agent-card.json" in printed

        shell = " && ".join(commands[1:]).replace(README_URL, base_url)
        done = subprocess.run(["bash", "-c", f"{shell}; rc=$?; echo; echo RC=$rc; echo TOKEN=$TOKEN"], cwd=BASE,
                              env=env, capture_output=True, text=True, timeout=120)
        *answer_lines, rc_line, token_line = done.stdout.strip().split("\n")
        answer = "\n".join(answer_lines)
        assert '"status":"succeeded"' in answer.replace(" ", ""), (done.stdout, done.stderr,
                                                                   "".join(output)[-4000:])
        assert '"agent":"order-agent"' in answer.replace(" ", "")

        token = token_line.removeprefix("TOKEN=")
        ran = subprocess.run([sys.executable, "-c", snippet.replace(README_URL, base_url)], cwd=BASE,
                             env={**env, "TOKEN": token}, capture_output=True, text=True, timeout=120)
        assert ran.stdout.startswith("succeeded order-agent order-agent handled order.query"), ran.stderr
        a2a = httpx.post(f"{base_url}/api/v1/invoke", headers={"Authorization": f"Token {token}"}, timeout=60,
                         json={"capability": "shipment.track", "payload": {"tracking_number": "1Z9"}}).json()
        assert a2a["status"] == "succeeded" and a2a["agent"] == "shipment-agent", a2a
        assert a2a["result"]["answer"] == 'shipment-agent handled shipment.track: {"tracking_number": "1Z9"}'
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # its stop handler ends the web server, workers and agents
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        wait_until(lambda: server.poll() is not None, timeout=5, message="make run to stop")
