"""Shared set-up for the benchmarks: a fresh database of their own on the configured PostgreSQL."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def seeded_shots(train: list, shots: int, seed: int) -> dict[str, list[str]]:
    """intent -> its first ``shots`` training utterances after a seeded shuffle (the CLINC150 README's protocol)."""
    import random

    by_intent: dict[str, list[str]] = {}
    for text, intent in train:
        by_intent.setdefault(intent, []).append(text)
    rng = random.Random(seed)
    out = {}
    for intent in sorted(by_intent):
        texts = list(by_intent[intent])
        rng.shuffle(texts)
        out[intent] = texts[:shots]
    return out


def setup_django(db_name: str, embedder: str | None = None) -> None:
    """Create ``db_name`` afresh, point Django at it and migrate."""
    os.environ["REACH_DB_NAME"] = db_name
    if embedder:
        os.environ["REACH_EMBEDDER"] = embedder
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")
    # A Redis database of their own, emptied: breakers, quotas and in-flight counts are keyed by row ids, which a
    # fresh benchmark database numbers afresh.
    if not os.environ.get("REDIS_URL"):
        from reach_platform.local_services import default_redis_url

        os.environ["REDIS_URL"] = default_redis_url().rsplit("/", 1)[0] + "/12"
    import psycopg
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).flushdb()

    base = dict(settings.DATABASES["default"])
    conn = psycopg.connect(dbname="postgres", user=base["USER"], host=base["HOST"], port=base["PORT"] or None,
                           password=base["PASSWORD"] or None, autocommit=True)
    conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    conn.execute(f'CREATE DATABASE "{db_name}"')
    conn.close()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def embedding_deferred():
    """While this is open, activation enqueues no embedding task: the benchmark embeds in its own process."""
    from contextlib import ExitStack
    from unittest import mock

    stack = ExitStack()
    stack.enter_context(mock.patch("registry.tasks.embed_capability_version.delay"))
    stack.enter_context(mock.patch("registry.tasks.embed_capability_versions.delay"))
    return stack


def register_capabilities(capabilities: dict[str, list[str]], *, negatives: dict[str, list[str]] | None = None,
                          agents_per_capability: bool = True, embedder=None, flush_query_cache: bool = True,
                          timings: dict[str, float] | None = None) -> list:
    """Register one agent + capability per entry through the real import path, activate, embed in this process
    (with ``embedder``, default the configured one), calibrate, and give every agent a live instance. Returns the
    ACTIVE versions. ``timings`` (when given) receives the seconds of each step: import_s, embed_s, calibrate_s."""
    import time

    from django.utils import timezone

    from registry.descriptors import ParsedDescriptor, descriptors_import
    from registry.embedding import get_embedder
    from registry.embedding_service import capability_versions_embed
    from registry.models import Agent, Instance
    from routing import snapshot
    from routing.calibration_service import calibration_refresh

    negatives = negatives or {}
    parsed = []
    for name, examples in capabilities.items():
        slug = name.replace("_", "-").replace(".", "-")[:90]
        parsed.append(ParsedDescriptor(path=f"<{name}>", agent={"endpoint_id": f"agent-{slug}", "team": "bench",
                                                                "environment": "dev"},
                                       capabilities=[{"name": name, "version": "1", "action": "query",
                                                      "examples": examples,
                                                      "negative_cases": negatives.get(name, [])}]))
    t0 = time.perf_counter()
    with embedding_deferred():  # embedded below, in this process
        result = descriptors_import(parsed=parsed, activate=True)
    t1 = time.perf_counter()
    capability_versions_embed(versions=list(result.activated), embedder=embedder or get_embedder())
    t2 = time.perf_counter()
    calibration_refresh()
    if timings is not None:
        timings.update(import_s=t1 - t0, embed_s=t2 - t1, calibrate_s=time.perf_counter() - t2)
    for key in (snapshot.redis_client().scan_iter("reach:emb:*") if flush_query_cache else ()):
        snapshot.redis_client().delete(key)  # figures start from a cold embedding cache
    now = timezone.now()
    Instance.objects.bulk_create([Instance(agent=a, instance_id="bench", url=f"http://127.0.0.1:1/{a.pk}",
                                           last_heartbeat_at=now, last_seen_at=now) for a in Agent.objects.all()])
    snapshot.bump_generation()
    snapshot.clear_caches()
    return result.activated


def register_descriptor_folder(folder) -> list:
    """Import a folder of YAML descriptors through reach_import's own parser and import, activate, embed in this
    process and calibrate."""
    from pathlib import Path

    from registry.descriptors import DescriptorError, descriptors_import, parse_file
    from registry.embedding import get_embedder
    from registry.embedding_service import capability_versions_embed
    from routing import snapshot
    from routing.calibration_service import calibration_refresh

    errors: list[DescriptorError] = []
    parsed = [p for p in (parse_file(f, errors) for f in sorted(Path(folder).glob("*.yaml"))) if p]
    if errors:
        raise SystemExit("\n".join(map(str, errors)))
    with embedding_deferred():  # embedded below, in this process
        result = descriptors_import(parsed=parsed, activate=True)
    capability_versions_embed(versions=list(result.activated), embedder=get_embedder())
    calibration_refresh()
    snapshot.bump_generation()
    snapshot.clear_caches()
    return result.activated


def serve_gateway(db_name: str, port: int, **env_overrides: str):
    """Start the gateway as production serves it (reach_platform.serving.web_command: uvicorn) on ``db_name`` and
    wait until it answers. Returns the process (its own session: stop it with os.killpg) and its base URL."""
    import subprocess
    import time

    import httpx
    from django.conf import settings

    base = Path(__file__).resolve().parent.parent
    env = dict(os.environ, DATABASE_URL=settings.DATABASE_URL, REACH_DB_NAME=db_name, REDIS_URL=settings.REDIS_URL,
               DEBUG="false", LOG_LEVEL="WARNING", **env_overrides)
    from reach_platform.serving import web_command

    web = subprocess.Popen(web_command("127.0.0.1", port, workers=int(env.get("WEB_WORKERS", "2"))), cwd=base,
                           env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{url}/admin/login/", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return web, url


def start_order_agent(*, port_offset: int, faults: dict | None = None, instance_id: str = "bench"):
    """Import the example order-agent, start it in its own process (session leader, for killpg) and register one
    instance for it. Returns (process, agent base URL)."""
    import json
    import subprocess
    from pathlib import Path

    from django.core.management import call_command

    from registry.models import Agent, Instance
    from routing import snapshot

    base = Path(__file__).resolve().parent.parent
    with embedding_deferred():
        call_command("reach_import", str(base / "examples/descriptors/order-agent.yaml"), "--activate", verbosity=0)
    cmd = [sys.executable, str(base / "examples/agents/server.py"), "--agents", "order-agent",
           "--port-offset", str(port_offset)]
    if faults:
        cmd += ["--faults", json.dumps({"order-agent": faults})]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    url = ""
    for line in proc.stdout:
        if line.startswith("agent "):
            url = line.split()[-1]
        if line.strip() == "ready":
            break
    Instance.objects.create(agent=Agent.objects.get(endpoint_id="order-agent"), instance_id=instance_id,
                            url=f"{url}/invoke", max_concurrency=5000, max_qps=100000)
    latency = (faults or {}).get("latency_ms", 0)
    if latency:  # the agent's declared runtime profile says how long it takes: the timeout is 1.5 x its p95
        from registry.models import CapabilityVersion

        CapabilityVersion.objects.filter(capability__agent__endpoint_id="order-agent").update(
            p95_latency_ms=max(latency * 1.25, 300))
    snapshot.bump_generation()
    return proc, url


class CpuMeter:
    """CPU seconds (user + system, all threads) spent by groups of processes while it runs, read from /proc
    (Linux): e.g. the load generator (this process), the gateway (its uvicorn process group), the agent,
    PostgreSQL and Redis. Sampled every ``interval`` seconds so that processes that come and go (a database
    backend replaced after CONN_MAX_AGE) are counted up to their last sample.

    A group is a matcher of (pid, process group, command name): ``CpuMeter.pid``, ``process_groups``, ``named``.
    Each process is classified once, from the one ``/proc/PID/stat`` read that also gives its CPU ticks; a
    sample reads only the counted processes' files. (Scanning /proc once per group and sample, as this meter did
    first, cost this process 3-4 % of a core: CPU taken from the gateway under test, and the GIL from the load
    generator's loop for ~7 ms every sample.)"""

    def __init__(self, interval: float = 0.5, **groups):
        self.groups = groups  # name -> matcher(pid, pgrp, comm) -> bool
        self.interval = interval
        self._last: dict[int, int] = {}
        self._group_of: dict[int, str | None] = {}  # pid -> its group's name, None: not counted
        self._totals: dict[str, int] = {}
        self._stop = None
        self._thread = None

    @staticmethod
    def _stat(pid: int) -> tuple[str, int, int] | None:
        """(command name, process group, utime + stime ticks), or None when the process is gone."""
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone
            return None
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        return head.partition("(")[2], int(fields[2]), int(fields[11]) + int(fields[12])

    @staticmethod
    def pid(*pids: int):
        return lambda pid, pgrp, comm: pid in pids

    @staticmethod
    def process_groups(*pgids: int):
        return lambda pid, pgrp, comm: pgrp in pgids

    @staticmethod
    def named(*names: str):
        return lambda pid, pgrp, comm: comm in names

    def _sample(self, baseline: bool = False) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            known = pid in self._group_of
            if known and self._group_of[pid] is None:
                continue
            stat = self._stat(pid)
            if stat is None:
                continue
            comm, pgrp, ticks = stat
            if not known:
                self._group_of[pid] = next((name for name, matches in self.groups.items()
                                            if matches(pid, pgrp, comm)), None)
            name = self._group_of[pid]
            if name is None:
                continue
            previous = self._last.get(pid)
            if not baseline:  # a process first seen now started after the baseline: all of it counts
                self._totals[name] += ticks - (previous if previous is not None else 0)
            self._last[pid] = ticks

    def start(self) -> None:
        import threading

        self._last, self._group_of, self._totals = {}, {}, dict.fromkeys(self.groups, 0)
        self._sample(baseline=True)
        self._stop = threading.Event()

        def loop():
            while not self._stop.wait(self.interval):
                self._sample()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self, requests: int) -> dict[str, float]:
        """CPU milliseconds per request for each group since start()."""
        self._stop.set()
        self._thread.join()
        self._sample()
        hz = os.sysconf("SC_CLK_TCK")
        return {name: round(ticks / hz * 1000 / max(requests, 1), 2) for name, ticks in self._totals.items()}


def interpreter() -> str:
    """The Python every process of a benchmark runs on (they start with ``sys.executable``): the build moves the
    serving figures by a tenth or more (README, *The interpreter*), so each serving benchmark prints it."""
    import platform

    return f"{platform.python_implementation()} {platform.python_version()} {os.path.realpath(sys.executable)}"


def group_pids(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def peak_rss_mb(pgid: int) -> dict[str, float]:
    """Peak resident memory (VmHWM, MB) of every process of a process group, by pid."""
    return {str(pid): value for pid in group_pids(pgid) if (value := rss_mb(pid, "VmHWM")) is not None}


def start_worker(db_name: str, *, concurrency: int | None = None, name: str = "", **env_overrides: str):
    """Start a Celery worker as production starts it (reach_platform.serving.worker_command) on ``db_name`` and
    wait until it answers a ping. Returns the process (its own session: stop it with os.killpg)."""
    import subprocess

    from django.conf import settings

    from reach_platform.celery import app
    from reach_platform.serving import worker_command

    env = dict(os.environ, DATABASE_URL=settings.DATABASE_URL, REACH_DB_NAME=db_name, REDIS_URL=settings.REDIS_URL,
               DEBUG="false", LOG_LEVEL="WARNING", **env_overrides)
    extra = ["-n", f"{name}@%h"] if name else None
    worker = subprocess.Popen(worker_command(concurrency=concurrency, extra=extra),
                              cwd=Path(__file__).resolve().parent.parent,
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if app.control.ping(timeout=0.5):
            break
    return worker
