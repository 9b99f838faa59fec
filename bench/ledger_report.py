"""Weekly report speed at 1,000,000 ledger entries.

python bench/ledger_report.py [--entries 1000000] [--agents 200] [--weeks 8] [--repeat 5]

Seeds the entries with one INSERT ... SELECT over generate_series in a database of its own
(reach_bench_ledger), ANALYZEs, then times the report the API and admin serve (weekly_report: one ISO week,
per agent, with the previous week's change) cold and repeated. Last line: JSON with entries and
weekly_report_s (the median of the repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _common import setup_django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--weeks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    setup_django("reach_bench_ledger")
    from django.db import connection

    from ledger.selectors import weekly_report

    t0 = time.time()
    with connection.cursor() as cursor:
        # entries spread evenly over the last N weeks ending 2026-11-29; agents in 20 teams
        cursor.execute("""
            INSERT INTO ledger_costentry (created_at, week, request_id, agent_endpoint, team_slug, model_name,
                input_tokens, output_tokens, tokens_estimated, latency_ms, attempt_number, is_retry, is_fallback,
                outcome, price_per_1k_input, price_per_1k_output, cost)
            SELECT ts, to_char(ts, 'IYYY-"W"IW'), 'r' || i, 'agent-' || (i %% %s), 'team-' || (i %% %s %% 20), 'm',
                   100 + i %% 900, 20 + i %% 300, false, 5 + (i * 7919 %% 2000) / 10.0, 1 + (i %% 10 = 0)::int,
                   i %% 10 = 0, i %% 50 = 0, CASE WHEN i %% 17 = 0 THEN 'server_error' ELSE 'success' END,
                   0.0008, 0.002, (100 + i %% 900) * 0.0000008 + (20 + i %% 300) * 0.000002
            FROM (SELECT i, timestamptz '2026-11-29 23:00+00' - (i %% (%s * 7 * 24)) * interval '1 hour' AS ts
                  FROM generate_series(1::bigint, %s) AS i) s
        """, [args.agents, args.agents, args.weeks, args.entries])
        cursor.execute("ANALYZE ledger_costentry")
        cursor.execute("SELECT count(*), max(week) FROM ledger_costentry")
        count, latest = cursor.fetchone()
    seed_s = time.time() - t0
    week = latest
    timings = []
    rows = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        rows = weekly_report(week=week)
        timings.append(time.perf_counter() - t)
    print(f"{count} entries seeded in {seed_s:.1f} s; report for {week}: {len(rows)} agents, "
          f"first {timings[0] * 1000:.0f} ms, median {statistics.median(timings) * 1000:.0f} ms")
    print(json.dumps({"entries": count, "week": week, "agents": len(rows),
                      "weekly_report_s": round(statistics.median(timings), 4),
                      "first_run_s": round(timings[0], 4), "seed_s": round(seed_s, 1)}))


if __name__ == "__main__":
    main()
