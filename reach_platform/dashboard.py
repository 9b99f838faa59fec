"""The operations dashboard on the admin index: what an operator needs at 3 a.m. — is traffic flowing, which agents
fail, which breakers are open, how full the review queue is, what today costs against budget, what the canaries
did. Assembled from each app's selectors (this module reads no table itself); team members get their own team's
figures only (registry.permissions decides who sees every team)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe

from ledger import selectors as ledger_selectors
from reach_platform.charts import gauge_svg, hourly_svg, share_bar_svg
from registry import selectors as registry_selectors
from registry.permissions import is_reviewer, sees_all_teams, team_ids
from reviews import selectors as review_selectors
from routing import breaker
from routing import selectors as routing_selectors
from routing.choices import TaskStatus

# An agent is flagged when its success rate over the last day falls below this (with at least FAILING_MIN_SAMPLE
# finished invokes), when a breaker of one of its instances is open, or when it has no ONLINE instance.
FAILING_BELOW = 0.9
FAILING_MIN_SAMPLE = 5
REFRESH_S = 30


def _link(name: str, **params: str) -> str:
    url = reverse(f"admin:{name}")
    return f"{url}?{urlencode(params)}" if params else url


def _since(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def _split(statuses: dict[str, int]) -> tuple[int, int, int]:
    ok = statuses.get(TaskStatus.SUCCEEDED, 0)
    failed = sum(statuses.get(s, 0) for s in routing_selectors.FAILED)
    return ok, failed, sum(statuses.values()) - ok - failed


def _rate(ok: int, failed: int) -> float | None:
    return ok / (ok + failed) if ok + failed else None


class Counts:
    """The dashboard's task counts, summed from one scan (routing.selectors.task_counts)."""

    def __init__(self, now: datetime, endpoints: list[str] | None):
        self.rows = routing_selectors.task_counts(since=now - timedelta(days=1), recent_since=now - timedelta(hours=1),
                                                  endpoints=endpoints)

    def by_status(self, *, recent: bool) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for row in self.rows:
            if row["recent"] or not recent:
                out[row["status"]] += row["n"]
        return out

    def by_agent(self, *, recent: bool) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for row in self.rows:
            if row["recent"] or not recent:
                out[row["agent_endpoint"]][row["status"]] += row["n"]
        return out

    def per_hour(self) -> dict[datetime, dict[str, int]]:
        out: dict[datetime, dict[str, int]] = defaultdict(lambda: {"ok": 0, "failed": 0, "other": 0})
        for row in self.rows:
            status = row["status"]
            kind = "ok" if status == TaskStatus.SUCCEEDED else "failed" if status in routing_selectors.FAILED else "other"
            out[row["hour"]][kind] += row["n"]
        return out


def _window(label: str, since: datetime, statuses: dict[str, int], endpoints: list[str] | None) -> dict:
    ok, failed, other = _split(statuses)
    latency = routing_selectors.attempt_latency(since=since, endpoints=endpoints)
    tasks = {"created_at__gte": _since(since)}
    return {"label": label, "total": ok + failed + other, "ok": ok, "failed": failed, "other": other,
            "manual_review": statuses.get(TaskStatus.MANUAL_REVIEW, 0), "success_rate": _rate(ok, failed),
            "p50": latency["p50"], "p95": latency["p95"],
            "bar": mark_safe(share_bar_svg(ok, failed, other, width=240)),  # noqa: S308 (escaped SVG)
            "link": _link("routing_task_changelist", **tasks),
            "failed_link": _link("routing_task_changelist", status__exact=TaskStatus.FAILED, **tasks)}


def _agents(now: datetime, counts: Counts, scope: set[int] | None,
            endpoints: list[str] | None) -> tuple[list[dict], dict]:
    day = now - timedelta(days=1)
    overview = registry_selectors.agents_overview(team_ids=scope)
    open_ids = breaker.open_instances([i["pk"] for a in overview for i in a["instances"]])
    by_day, by_hour = counts.by_agent(recent=False), counts.by_agent(recent=True)
    latency = routing_selectors.attempt_latency_by_agent(since=day, endpoints=endpoints)
    liveness = {"online": 0, "suspect": 0, "offline": 0}
    rows, open_instances = [], []
    for agent in overview:
        endpoint = agent["endpoint_id"]
        ok, failed, other = _split(by_day.get(endpoint, {}))
        for inst in agent["instances"]:
            liveness[inst["liveness"]] = liveness.get(inst["liveness"], 0) + 1
            if inst["pk"] in open_ids:
                open_instances.append({"agent": endpoint, "instance": inst["instance_id"],
                                       "link": reverse("admin:registry_instance_change", args=[inst["pk"]])})
        online = sum(1 for i in agent["instances"] if i["liveness"] == "online")
        breakers = sum(1 for i in agent["instances"] if i["pk"] in open_ids)
        rate = _rate(ok, failed)
        reasons = []
        if rate is not None and ok + failed >= FAILING_MIN_SAMPLE and rate < FAILING_BELOW:
            reasons.append(f"success {rate:.0%}")
        if breakers:
            reasons.append(f"{breakers} breaker{'s' if breakers > 1 else ''} open")
        if agent["instances"] and not online:
            reasons.append("no instance online")
        lat = latency.get(endpoint, {})
        rows.append({"endpoint": endpoint, "team": agent["team"], "calls_hour": sum(by_hour.get(endpoint, {}).values()),
                     "calls_day": ok + failed + other, "ok": ok, "failed": failed, "success_rate": rate,
                     "p50": lat.get("p50"), "p95": lat.get("p95"), "online": online,
                     "instances": len(agent["instances"]), "breakers": breakers, "failing": reasons,
                     "bar": mark_safe(share_bar_svg(ok, failed, other)),  # noqa: S308
                     "link": _link("routing_task_changelist", agent_endpoint=endpoint,
                                   created_at__gte=_since(day)),
                     "instances_link": _link("registry_instance_changelist", q=endpoint)})
    rows.sort(key=lambda r: (not r["failing"], -r["calls_day"], r["endpoint"]))
    instances = {"liveness": liveness, "open": open_instances,
                 "links": {state: _link("registry_instance_changelist", liveness__exact=state,
                                        deregistered_at__isnull="True") for state in liveness},
                 "open_link": _link("registry_instance_changelist",
                                    id__in=",".join(str(i) for i in sorted(open_ids)) or "0")}
    return rows, instances


def _hourly(now: datetime, counts: Counts) -> str:
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
    series = counts.per_hour()
    points = []
    for k in range(24):
        hour = start + timedelta(hours=k)
        row = series.get(hour, {"ok": 0, "failed": 0, "other": 0})
        points.append((f"{hour:%H}:00", row["ok"], row["failed"], row["other"]))
    return mark_safe(hourly_svg(points))  # noqa: S308 (escaped SVG)


def _costs(now: datetime, slugs: list[str] | None) -> dict:
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    today = ledger_selectors.cost_by_team(since=midnight, team_slugs=slugs)
    budgets = ledger_selectors.budgets_with_spend(team_slugs=slugs)
    for row in budgets:
        row["today"] = today.get(row["team"], 0.0) if row["team"] else None
        row["gauge"] = mark_safe(gauge_svg(row["ratio"], row["warn"]))  # noqa: S308
    return {"today_total": sum(today.values()), "by_team": sorted(today.items(), key=lambda kv: -kv[1])[:10],
            "budgets": budgets, "link": _link("ledger_costentry_changelist", created_at__gte=_since(midnight)),
            "budgets_link": _link("ledger_budget_changelist")}


def dashboard_context(user: Any, *, now: datetime | None = None) -> dict:
    now = now or timezone.now()
    scope = None if sees_all_teams(user) else team_ids(user)
    endpoints = registry_selectors.agent_endpoints(team_ids=scope)
    slugs = registry_selectors.team_slugs(team_ids=scope)
    counts = Counts(now, endpoints)
    agents, instances = _agents(now, counts, scope, endpoints)
    queue = None
    if is_reviewer(user) or user.has_perm("reviews.view_reviewitem"):
        queue = review_selectors.queue_summary()
        queue["link"] = _link("reviews_reviewitem_changelist", queue="waiting")
    outbox = routing_selectors.outbox_counts(endpoints=endpoints)
    return {
        "now": now, "refresh_s": REFRESH_S, "scope": "every team" if scope is None else ", ".join(sorted(slugs or []))
        or "no team",
        "windows": [_window("Last hour", now - timedelta(hours=1), counts.by_status(recent=True), endpoints),
                    _window("Last day", now - timedelta(days=1), counts.by_status(recent=False), endpoints)],
        "hourly": _hourly(now, counts), "agents": agents, "instances": instances, "queue": queue,
        "outbox": {**outbox, "dead_link": _link("routing_callbackdelivery_changelist", status__exact="dead"),
                   "pending_link": _link("routing_callbackdelivery_changelist", status__exact="pending")},
        "costs": _costs(now, slugs),
        "canaries": {"verdicts": registry_selectors.canary_verdicts(team_ids=scope),
                     "live": registry_selectors.canaries_live(team_ids=scope),
                     "link": _link("registry_auditlog_changelist", action="version.rolled_back"),
                     "live_link": _link("registry_capabilityversion_changelist", is_canary__exact="1",
                                        state__exact="active")},
    }
