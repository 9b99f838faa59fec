"""Operations dashboard (the admin index) render time at 1,000,000 tasks.

python bench/dashboard.py [--tasks 1000000] [--agents 60] [--days 30] [--repeat 7]

Fills a database of its own (reach_bench_dashboard) with INSERT ... SELECT over generate_series: agents in 12
teams with two instances each (one breaker open), ``--tasks`` tasks spread evenly over the last ``--days`` days
(4 % failed, 2 % in the manual review queue, the rest succeeded), one attempt and one cost entry per routed task,
some callback deliveries pending and dead, team budgets; ANALYZEs; then renders GET /admin/ through Django's test
client as a superuser and as a team member, cold and repeated. Target: <= 300 ms. Last line: JSON with tasks,
render_ms (median, superuser), team_render_ms (median, team member), first_ms and queries.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _common import setup_django


def fill(cursor, *, tasks: int, agents: int, days: int) -> None:
    seconds = days * 86400
    cursor.execute("""
        INSERT INTO routing_task (request_id, key, status, fallback, mode, capability_requested, task_text, text_hash,
            payload, callback_url, user_key, top_k, decision, agent_endpoint, capability_label, attempts_count,
            retry_budget, depth, call_path, trace_id, parent_request_id, options, review_reason, created_at,
            updated_at, version_id, instance_id)
        SELECT 'r' || i, 'r' || i,
               CASE WHEN i %% 50 = 1 THEN 'manual_review' WHEN i %% 25 = 0 THEN 'failed' ELSE 'succeeded' END,
               false, 'sync', '', 'bench request ' || i, '', '{}', '', '', 3, '{}',
               CASE WHEN i %% 50 = 1 THEN '' ELSE 'agent-' || (i %% %(agents)s) END,
               '', 1, 3, 0, '[]', '', '', '{}', CASE WHEN i %% 50 = 1 THEN 'low_score' ELSE '' END, ts, ts,
               NULL, NULL
        FROM (SELECT i, now() - (i::float8 * %(seconds)s / %(tasks)s) * interval '1 second' AS ts
              FROM generate_series(1::bigint, %(tasks)s) AS i) s
    """, {"agents": agents, "seconds": seconds, "tasks": tasks})
    cursor.execute("""
        INSERT INTO routing_attempt (task_id, number, version_id, instance_id, started_at, latency_ms, timeout_ms,
            outcome, status_code, error, is_retry, is_fallback, usage)
        SELECT t.id, 1, NULL, inst.id, t.created_at, 5 + (t.id * 7919 %% 2000) / 10.0, 2000,
               CASE WHEN t.status = 'failed' THEN 'server_error' ELSE 'success' END, 200, '', false, false, NULL
        FROM routing_task t
        JOIN registry_agent a ON a.endpoint_id = t.agent_endpoint
        JOIN registry_instance inst ON inst.agent_id = a.id AND inst.instance_id = 'bench-' || (t.id %% 2)
    """, [])
    cursor.execute("""
        INSERT INTO ledger_costentry (created_at, week, request_id, agent_endpoint, team_slug, model_name,
            input_tokens, output_tokens, tokens_estimated, latency_ms, attempt_number, is_retry, is_fallback,
            outcome, price_per_1k_input, price_per_1k_output, cost)
        SELECT t.created_at, to_char(t.created_at, 'IYYY-"W"IW'), t.key, t.agent_endpoint, tm.slug, 'm',
               300, 100, false, 40, 1, false, false, 'success', 0.0008, 0.002, 0.00044
        FROM routing_task t
        JOIN registry_agent a ON a.endpoint_id = t.agent_endpoint
        JOIN registry_team tm ON tm.id = a.team_id
    """)
    cursor.execute("""
        INSERT INTO routing_callbackdelivery (task_id, url, body, status, attempts, last_error, created_at)
        SELECT id, 'http://127.0.0.1:1/cb', '{}', CASE WHEN id %% 2 = 0 THEN 'dead' ELSE 'pending' END, 3, '',
               created_at
        FROM routing_task WHERE id %% 997 = 0
    """, [])
    for table in ("routing_task", "routing_attempt", "ledger_costentry", "routing_callbackdelivery"):
        cursor.execute(f"VACUUM ANALYZE {table}")  # the steady state autovacuum keeps (visibility map)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--agents", type=int, default=60)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    setup_django("reach_bench_dashboard")
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from ledger.services import budget_set
    from registry.models import Agent, Environment, Instance, Team
    from routing.breaker import _keys
    from routing.snapshot import redis_client

    t0 = time.time()
    env, _ = Environment.objects.get_or_create(name="dev")
    teams = [Team.objects.create(slug=f"team-{k}", name=f"Team {k}") for k in range(12)]
    now = timezone.now()
    agents = Agent.objects.bulk_create([Agent(endpoint_id=f"agent-{k}", team=teams[k % 12], environment=env)
                                        for k in range(args.agents)])
    instances = Instance.objects.bulk_create([
        Instance(agent=a, instance_id=f"bench-{n}", url=f"http://127.0.0.1:1/{a.pk}/{n}", last_heartbeat_at=now,
                 last_seen_at=now, liveness="online" if n == 0 or a.pk % 7 else "suspect")
        for a in agents for n in range(2)])
    redis_client().set(_keys(instances[0].pk)[0], "1", ex=600)
    for team in teams:
        budget_set(team=team, monthly_limit=Decimal("500"))
    with connection.cursor() as cursor:
        fill(cursor, tasks=args.tasks, agents=args.agents, days=args.days)
        cursor.execute("SELECT count(*) FROM routing_task")
        count = cursor.fetchone()[0]
    fill_s = time.time() - t0

    User = get_user_model()
    admin = User.objects.create_superuser("bench-admin", password="pw-bench-admin")
    member = User.objects.create_user("bench-member", password="pw-bench-member", is_staff=True)
    member.groups.add(Group.objects.get(name="agent team member"))
    teams[0].members.add(member)

    def timed(user) -> tuple[float, list[float], int]:
        client = Client()
        client.force_login(user)
        queries: list[tuple[float, str]] = []

        def count(execute, sql, params, many, context):
            t = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                queries.append((time.perf_counter() - t, sql))

        with connection.execute_wrapper(count):
            t = time.perf_counter()
            assert client.get("/admin/").status_code == 200
            first = time.perf_counter() - t
        runs = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            assert client.get("/admin/").status_code == 200
            runs.append(time.perf_counter() - t)
        for took, sql in sorted(queries, reverse=True)[:6]:  # where the first render's time went
            print(f"  {took * 1000:7.1f} ms  {sql[:150]}", file=sys.stderr)
        return first, runs, len(queries)

    first, runs, queries = timed(admin)
    _, team_runs, _ = timed(member)
    redis_client().delete(_keys(instances[0].pk)[0])
    render_ms, team_ms = statistics.median(runs) * 1000, statistics.median(team_runs) * 1000
    print(f"{count} tasks filled in {fill_s:.1f} s; admin index: first {first * 1000:.0f} ms, median "
          f"{render_ms:.0f} ms ({queries} queries); team member median {team_ms:.0f} ms; target 300 ms")
    print(json.dumps({"tasks": count, "fill_s": round(fill_s, 1), "first_ms": round(first * 1000, 1),
                      "render_ms": round(render_ms, 1), "team_render_ms": round(team_ms, 1), "queries": queries,
                      "target_ms": 300}))


if __name__ == "__main__":
    main()
