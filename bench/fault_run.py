"""The articles' 10-agent fault experiment, at a scale that fits this machine.

python bench/fault_run.py [--requests 400] [--concurrency 8] [--seed 0]

Ten example agents (served by examples/agents/server.py): 3 business capabilities (orders, billing, notify - not
idempotent), 2 tools (search, translate), 1 orchestrator that calls search through the gateway, and 4 agents that
overlap others (a second orders, billing, search and translate agent). Injected faults for the whole run:
order-a is dead (registered, its connections accepted and never answered, like a hung host), search-a is slowed 10x, billing-a fails 30 % with 5xx,
translate-a has latency spikes (8 % of calls take 25 s).

One fixed-seed request stream, two modes in one run:
- baseline: random choice among the agents that offer the capability, 20 s timeout, two blind retries per hop,
  no breaker, no fallback, no budget (the orchestrator calls a random search agent directly, likewise);
- reach: POST /api/v1/invoke with the task text, the product as configured by default (uvicorn as the README
  recommends, a database of its own).
Prints a table and, last, one JSON line {"baseline": {...}, "reach": {...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml
from _common import serve_gateway, setup_django

BASE = Path(__file__).resolve().parent.parent
PORT0 = 31000
FAMILIES = {
    "orders": {"agents": ["order-a", "order-b"], "share": 0.28, "cost": 0.002, "examples": [
        "where is my order 1234", "has my package shipped yet", "track the delivery of order 88",
        "when will my order arrive", "show the status of my last purchase", "is order 551 delayed",
        "list my open orders", "what did I order last week", "did the parcel leave the warehouse",
        "check shipping progress for my order"]},
    "billing": {"agents": ["billing-a", "billing-b"], "share": 0.22, "cost": 0.003, "examples": [
        "why was I charged twice", "send me my latest invoice", "what is my account balance",
        "explain this charge on my bill", "when is my next payment due", "update my billing address",
        "how much do I owe this month", "download last month's invoice", "refund the duplicate payment",
        "what payment methods are on file"]},
    "notify": {"agents": ["notify-a"], "share": 0.10, "cost": 0.0005, "idempotent": False, "examples": [
        "text the on-call engineer that the build failed", "email the customer about the delay",
        "remind the team about the standup", "send a push notification to all users",
        "notify finance that the report is ready", "message my manager that I am late",
        "alert the ops channel about the outage", "send an sms to the courier",
        "ping the reviewers about the pull request", "email the team the meeting notes"]},
    "search": {"agents": ["search-a", "search-b"], "share": 0.15, "cost": 0.001, "examples": [
        "search the knowledge base for the refund policy", "find documents about onboarding",
        "look up the wiki page on deployments", "search for articles mentioning pricing",
        "find the handbook section on travel expenses", "look for tickets about login errors",
        "search internal docs for the api rate limits", "find the runbook for database failover",
        "look up past incidents with the payment gateway", "search the faq for shipping times"]},
    "translate": {"agents": ["translate-a", "translate-b"], "share": 0.15, "cost": 0.001, "examples": [
        "translate this paragraph into french", "how do you say good morning in japanese",
        "translate the product description to german", "put this email into spanish",
        "what does gracias mean in english", "translate the menu into chinese",
        "render this contract clause in italian", "convert this text to portuguese",
        "translate the error message into korean", "give me the dutch version of this sentence"]},
    "orchestrate": {"agents": ["orchestrator"], "share": 0.10, "cost": 0.004, "examples": [
        "plan a research brief on competitor pricing", "prepare a briefing about our refund rules",
        "assemble a dossier on onboarding practices", "put together a summary of deployment guidance",
        "plan a report on expense policy questions", "build a briefing pack about login problems",
        "draft a plan covering api limits", "prepare an overview of database failover",
        "plan an incident review for the payment gateway", "compile a briefing on shipping times"]},
}
FAULTS = {"order-a": {"hang": True}, "search-a": {"latency_ms": 500}, "billing-a": {"fail_rate": 0.3, "fail_status": 503},
          "translate-a": {"spike_rate": 0.08, "spike_ms": 25000}}
BASE_LATENCY_MS = 50


def agent_list() -> list[tuple[str, str]]:
    return [(agent, fam) for fam, spec in FAMILIES.items() for agent in spec["agents"]]


def write_descriptors(folder: Path) -> dict[str, int]:
    ports = {}
    for i, (agent, family) in enumerate(agent_list()):
        spec = FAMILIES[family]
        ports[agent] = PORT0 + i
        descriptor = {
            "agent": {"endpoint_id": agent, "team": "bench", "environment": "dev"},
            "server": {"port": ports[agent], "transport": "http", "max_concurrency": 8, "max_qps": 1000,
                       "latency_ms": BASE_LATENCY_MS},
            "capabilities": [{
                "name": f"{family}.{agent}", "version": "1", "action": "query", "description": family,
                "examples": spec["examples"], "negative_cases": ["write a poem about the sea"],
                "idempotent": spec.get("idempotent", True),
                "output_schema": {"type": "object", "required": ["answer"]},
                "runtime": {"timeout_ms": 20000, "max_retries": 2, "p95_latency_ms": 150,
                            "cost_per_call": spec["cost"]}}],
        }
        (folder / f"{agent}.yaml").write_text(yaml.safe_dump(descriptor))
    return ports


def stream(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    families = list(FAMILIES)
    weights = [FAMILIES[f]["share"] for f in families]
    return [(fam, rng.choice(FAMILIES[fam]["examples"])) for fam in rng.choices(families, weights, k=n)]


def run_baseline(requests, ports, concurrency) -> list[dict]:
    rng = random.Random(1)
    lock = threading.Lock()

    def one(item):
        family, text = item
        with lock:
            agent = rng.choice(FAMILIES[family]["agents"])
        url = f"http://127.0.0.1:{ports[agent]}/invoke"
        rid = uuid.uuid4().hex
        t0, attempts, timeout_retries, ok = time.perf_counter(), 0, 0, False
        for attempt in range(3):  # one call and two blind retries
            attempts += 1
            try:
                r = httpx.post(url, json={"capability": f"{family}.{agent}", "payload": {"text": text},
                                          "request_id": rid}, headers={"X-Reach-Request-Id": rid}, timeout=20)
                if r.status_code == 200 and "answer" in (r.json().get("result") or {}):
                    ok = True
                    break
            except httpx.TimeoutException:
                if attempt < 2:
                    timeout_retries += 1
            except httpx.HTTPError:
                pass
        return {"ok": ok, "latency": time.perf_counter() - t0, "attempts": attempts,
                "timeout_retries": timeout_retries}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, requests))


def run_reach(requests, gateway, token, concurrency) -> list[dict]:
    def one(item):
        _, text = item
        rid = uuid.uuid4().hex
        t0 = time.perf_counter()
        try:
            r = httpx.post(f"{gateway}/api/v1/invoke", json={"task": text, "payload": {"text": text},
                                                            "request_id": rid},
                           headers={"Authorization": f"Token {token}"}, timeout=120)
            body = r.json()
            ok = body.get("status") == "succeeded"
        except (httpx.HTTPError, ValueError):
            ok = False
        return {"ok": ok, "latency": time.perf_counter() - t0, "request_id": rid}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, requests))


def agent_stats(ports) -> dict[str, dict]:
    out = {}
    for agent, port in ports.items():
        out[agent] = httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).json()
    return out


def reset_agents(ports, extra: dict[str, dict]) -> None:
    for agent, port in ports.items():
        faults = {"reset": True, "latency_ms": BASE_LATENCY_MS, **FAULTS.get(agent, {}), **extra.get(agent, {})}
        httpx.post(f"http://127.0.0.1:{port}/faults", json=faults, timeout=5).raise_for_status()


def summarize(results, stats, timeout_retries: int, attempts: int) -> dict:
    n = len(results)
    latencies = sorted(r["latency"] for r in results)
    cost = sum(FAMILIES[fam]["cost"] * sum(stats[agent]["by_capability"].values())
               for agent, fam in agent_list())
    notify_dupes = sum(1 for count in stats["notify-a"]["executions"].values() if count > 1)
    return {
        "success_rate": round(sum(r["ok"] for r in results) / n, 4),
        "mean_latency_s": round(sum(latencies) / n, 3),
        "p95_latency_s": round(latencies[int(0.95 * (n - 1))], 3),
        "attempts_per_request": round(attempts / n, 3),
        "timeout_retry_rate": round(timeout_retries / n, 4),
        "max_agent_concurrency": max(s["max_in_flight"] for s in stats.values()),
        "duplicate_non_idempotent": notify_dupes,
        "cost_per_request": round(cost / n, 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()

    setup_django("reach_bench_faults")
    from _common import register_descriptor_folder
    from django.contrib.auth import get_user_model
    from django.utils import timezone
    from rest_framework.authtoken.models import Token

    from registry.models import Agent, Instance
    from routing import snapshot
    from routing.models import Attempt

    folder = Path(tempfile.mkdtemp(prefix="reach-faults-"))
    ports = write_descriptors(folder)
    register_descriptor_folder(folder)
    now = timezone.now()
    for agent in Agent.objects.all():
        Instance.objects.create(agent=agent, instance_id="bench", url=f"http://127.0.0.1:{ports[agent.endpoint_id]}"
                                "/invoke", max_concurrency=8, max_qps=1000, last_heartbeat_at=now,
                                last_seen_at=now)
    snapshot.bump_generation()
    token = Token.objects.create(user=get_user_model().objects.create_user("fault-bench")).key

    live = [a for a, _ in agent_list()]
    agents = subprocess.Popen([sys.executable, str(BASE / "examples/agents/server.py"), "--descriptors", str(folder),
                               "--agents", ",".join(live)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    for line in agents.stdout:
        if line.strip() == "ready":
            break
    web, gateway = serve_gateway("reach_bench_faults", args.port)
    try:
        requests = stream(args.requests, args.seed)
        search_urls = [f"http://127.0.0.1:{ports[a]}/invoke" for a in FAMILIES["search"]["agents"]]

        # baseline
        reset_agents(ports, {"orchestrator": {"call": {"urls": search_urls, "capability": "search"}}})
        t0 = time.time()
        base = run_baseline(requests, ports, args.concurrency)
        base_stats = agent_stats(ports)
        base_figures = summarize(base, base_stats, sum(r["timeout_retries"] for r in base),
                                 sum(r["attempts"] for r in base))
        base_figures["wall_s"] = round(time.time() - t0, 1)

        # reach
        reset_agents(ports, {"orchestrator": {"call": {"token": token, "gateway": gateway,
                                                       "task": "search the knowledge base for the refund policy"}}})
        t0 = time.time()
        reach = run_reach(requests, gateway, token, args.concurrency)
        reach_stats = agent_stats(ports)
        # the callers' requests (depth 0), as in the baseline, where nested retries stay inside the agents
        top = Attempt.objects.filter(task__depth=0)
        attempts = top.count()
        # a timeout followed by another attempt of the same task
        timeout_retries = sum(1 for a in top.filter(outcome="timeout")
                              if top.filter(task_id=a.task_id, number__gt=a.number).exists())
        top_level = len(reach)
        reach_figures = summarize(reach, reach_stats, timeout_retries, attempts)
        reach_figures["attempts_per_request"] = round(attempts / top_level, 3)
        reach_figures["wall_s"] = round(time.time() - t0, 1)
    finally:
        for proc in (web, agents):
            os.killpg(proc.pid, signal.SIGTERM)

    keys = list(base_figures)
    print(f"{'':28}{'baseline':>12}{'reach':>12}")
    for key in keys:
        print(f"{key:28}{base_figures[key]!s:>12}{reach_figures[key]!s:>12}")
    print(json.dumps({"baseline": base_figures, "reach": reach_figures}))


if __name__ == "__main__":
    main()
