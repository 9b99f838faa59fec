"""The weekly per-agent report, aggregated in the database (one GROUP BY per week)."""

from __future__ import annotations

from datetime import date, timedelta

from django.db.models import Aggregate, Count, FloatField, Q, Sum

from ledger.filters import WeeklyReportFilter
from ledger.models import Budget, CostEntry
from ledger.services import month_spend


class Percentile(Aggregate):
    """PostgreSQL ``percentile_cont(p) WITHIN GROUP (ORDER BY expr)``."""

    function = "percentile_cont"
    template = "%(function)s(%(p)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, p: float, **extra):
        super().__init__(expression, p=float(p), **extra)


def previous_week(week: str) -> str:
    year, number = int(week[:4]), int(week[6:])
    monday = date.fromisocalendar(year, number, 1) - timedelta(days=7)
    y, w, _ = monday.isocalendar()
    return f"{y}-W{w:02d}"


def _rows(week: str, team: str | None, agent: str | None, by: str) -> dict[str, dict]:
    qs = WeeklyReportFilter({"team": team or "", "agent": agent or ""}, CostEntry.objects.filter(week=week)).qs
    group = ["agent_endpoint", "team_slug"] if by == "agent" else ["team_slug"]
    rows = (qs.values(*group).annotate(
        calls=Count("id"), succeeded=Count("id", filter=Q(outcome__in=["success", "accepted"])),
        retries=Count("id", filter=Q(is_retry=True)), fallbacks=Count("id", filter=Q(is_fallback=True)),
        p50_latency_ms=Percentile("latency_ms", 0.5), p95_latency_ms=Percentile("latency_ms", 0.95),
        tokens_in=Sum("input_tokens"), tokens_out=Sum("output_tokens"), cost=Sum("cost"),
    ).order_by(*group))
    return {r["agent_endpoint"] if by == "agent" else r["team_slug"]: r for r in rows}


def weekly_report(*, week: str, team: str | None = None, agent: str | None = None,
                  by: str = "agent") -> list[dict]:
    """Per agent (or per team): calls, success rate, p50/p95 latency, tokens in/out, cost, retries, fallbacks,
    and the change in calls and cost against the previous ISO week."""
    current = _rows(week, team, agent, by)
    before = _rows(previous_week(week), team, agent, by)
    report = []
    for key, row in current.items():
        prev = before.get(key)
        cost = float(row["cost"] or 0)
        report.append({
            **({"agent": row["agent_endpoint"]} if by == "agent" else {}),
            "team": row["team_slug"], "week": week, "calls": row["calls"],
            "success_rate": round(row["succeeded"] / row["calls"], 4) if row["calls"] else None,
            "p50_latency_ms": round(row["p50_latency_ms"] or 0, 1), "p95_latency_ms": round(row["p95_latency_ms"] or 0, 1),
            "tokens_in": row["tokens_in"] or 0, "tokens_out": row["tokens_out"] or 0, "cost": round(cost, 6),
            "retries": row["retries"], "fallbacks": row["fallbacks"],
            "calls_change": (row["calls"] - prev["calls"]) if prev else None,
            "cost_change": round(cost - float(prev["cost"] or 0), 6) if prev else None,
        })
    return report


def weekly_totals(*, week: str, weeks: int = 8, team: str | None = None) -> list[tuple[str, float]]:
    """Total cost for ``week`` and the ``weeks - 1`` before it, oldest first (one GROUP BY)."""
    names = [week]
    for _ in range(weeks - 1):
        names.insert(0, previous_week(names[0]))
    qs = WeeklyReportFilter({"team": team or ""}, CostEntry.objects.filter(week__in=names)).qs
    totals = {r["week"]: float(r["cost"] or 0) for r in qs.values("week").annotate(cost=Sum("cost"))}
    return [(name, totals.get(name, 0.0)) for name in names]


def cost_by_team(*, since, team_slugs: list[str] | None = None) -> dict[str, float]:
    """{team slug: cost} of the entries since ``since`` (one GROUP BY on the created_at index)."""
    qs = CostEntry.objects.filter(created_at__gte=since)
    if team_slugs is not None:
        qs = qs.filter(team_slug__in=team_slugs)
    return {r["team_slug"]: float(r["cost"] or 0) for r in qs.order_by().values("team_slug").annotate(cost=Sum("cost"))}


def budgets_with_spend(*, team_slugs: list[str] | None = None) -> list[dict]:
    """Team and caller budgets with this month's spend (caller budgets only for everyone-views)."""
    qs = Budget.objects.select_related("team", "caller")
    if team_slugs is not None:
        qs = qs.filter(team__slug__in=team_slugs)
    rows = []
    for budget in qs[:50]:
        spent, limit = month_spend(budget), float(budget.monthly_limit)
        team = budget.team.slug if budget.team is not None else ""
        rows.append({"budget": budget, "scope": f"team {team}" if team else f"caller {budget.caller}", "team": team,
                     "spent": spent, "limit": limit, "ratio": spent / limit if limit else 0.0,
                     "warn": budget.warn_ratio})
    return sorted(rows, key=lambda r: -r["ratio"])
