"""Recording costs and enforcing budgets.

Month-to-date spend per team and caller is kept in Redis (INCRBYFLOAT on every record) so the invoke path checks
a budget with one round trip; the database stays the record (``spend_rebuild`` recomputes the counters)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from ledger.models import Budget, CostEntry
from reach_platform.errors import InvalidInput, PaymentRequired
from registry.audit import audit
from registry.generation import redis_client

logger = logging.getLogger(__name__)
# Outcomes where the agent did (or may have done) the work, so the attempt is charged.
CHARGED = {"success", "timeout", "server_error", "bad_output", "fingerprint_mismatch", "accepted"}


@dataclass
class Price:
    """What the ledger needs to know about a capability version to price an attempt."""

    agent: str
    team: str
    model_name: str
    price_in: Decimal
    price_out: Decimal
    cost_per_call: Decimal
    avg_tokens: int


def iso_week(moment: datetime) -> str:
    year, week, _ = moment.isocalendar()
    return f"{year}-W{week:02d}"


def _month_key(kind: str, ident, moment: datetime) -> str:
    return f"reach:spend:{moment:%Y%m}:{kind}:{ident}"


def price_attempt(price: Price, outcome: str, usage: dict | None) -> tuple[int, int, bool, Decimal]:
    """(input tokens, output tokens, estimated?, cost). Tokens from the agent's ``usage`` when it sent one, else
    the declared profile (70 % input / 30 % output of avg_tokens_per_call), marked estimated."""
    if isinstance(usage, dict) and ("input_tokens" in usage or "output_tokens" in usage):
        tin, tout, estimated = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0), False
    else:
        tin, tout, estimated = int(price.avg_tokens * 0.7), price.avg_tokens - int(price.avg_tokens * 0.7), True
    if outcome not in CHARGED:
        return tin if not estimated else 0, tout if not estimated else 0, estimated, Decimal(0)
    if price.price_in or price.price_out:
        cost = (Decimal(tin) * price.price_in + Decimal(tout) * price.price_out) / 1000
    else:
        cost = price.cost_per_call
    return tin, tout, estimated, cost.quantize(Decimal("0.000001"))


def cost_entries_record(*, entries: list[CostEntry]) -> None:
    """Write the attempts' entries in one INSERT and add them to the month-to-date counters."""
    if not entries:
        return
    CostEntry.objects.bulk_create(entries)
    cost_counters_add(entries=entries)


def cost_counters_add(*, entries: list[CostEntry]) -> None:
    """Add written entries to the month-to-date counters that budgets read (one Redis round trip)."""
    if not any(entry.cost for entry in entries):
        return
    pipe = redis_client().pipeline()
    cost_counters_pipe(pipe, entries)
    pipe.execute()


def cost_counters_pipe(pipe, entries) -> None:
    """The counter increments of ``entries``, added to a Redis pipeline (sync or asyncio)."""
    for entry in entries:
        if entry.cost:
            pipe.incrbyfloat(_month_key("team", entry.team_slug, entry.created_at), float(entry.cost))
            if entry.caller_id:
                pipe.incrbyfloat(_month_key("caller", entry.caller_id, entry.created_at), float(entry.cost))


def cost_entry_for(*, price: Price, request_id: str, caller_id, version_id, instance_id, outcome: str,
                   usage: dict | None, latency_ms: float, number: int, is_retry: bool, is_fallback: bool,
                   at: datetime) -> CostEntry:
    tin, tout, estimated, cost = price_attempt(price, outcome, usage)
    return CostEntry(created_at=at, week=iso_week(at), request_id=request_id, agent_endpoint=price.agent,
                     team_slug=price.team, version_id=version_id, instance_id=instance_id, caller_id=caller_id,
                     model_name=price.model_name, input_tokens=tin, output_tokens=tout, tokens_estimated=estimated,
                     latency_ms=latency_ms, attempt_number=number, is_retry=is_retry, is_fallback=is_fallback,
                     outcome=outcome, price_per_1k_input=price.price_in, price_per_1k_output=price.price_out,
                     cost=cost)


@dataclass
class BudgetState:
    spent: float
    limit: float

    @property
    def ratio(self) -> float:
        return self.spent / self.limit if self.limit else 0.0


_budgets_cache: dict[tuple[str, object], tuple[float, Budget | None]] = {}
_BUDGET_CACHE_S = 10


def _fresh(scope: tuple[str, object]) -> tuple[float, Budget | None] | None:
    """The budget cache's entry for ``scope``, if it is younger than ``_BUDGET_CACHE_S``."""
    hit = _budgets_cache.get(scope)
    return hit if hit and time.monotonic() - hit[0] < _BUDGET_CACHE_S else None


def _budget(kind: str, ident) -> Budget | None:
    """Budgets change rarely: cached in-process for 10 s (and dropped in the process that saves one)."""
    if hit := _fresh((kind, ident)):
        return hit[1]
    row = Budget.objects.filter(**({"team__slug": ident} if kind == "team" else {"caller_id": ident})).first()
    _budgets_cache[(kind, ident)] = (time.monotonic(), row)
    return row


def _scopes(caller_id, team_slugs: list[str]) -> list[tuple[str, object]]:
    """The budget scopes a call answers to: its caller's, and each candidate team's once."""
    return ([("caller", caller_id)] if caller_id else []) + [("team", slug) for slug in dict.fromkeys(team_slugs)]


def budgets_known_absent(*, caller_id, team_slugs: list[str]) -> bool:
    """Whether this process knows, without I/O, that neither the caller nor any of the teams has a budget (every
    scope's cache entry fresh and empty): ``budget_check`` would pass with no warning."""
    return all((hit := _fresh(scope)) is not None and hit[1] is None for scope in _scopes(caller_id, team_slugs))


def budget_check(*, caller_id, team_slugs: list[str], now: datetime | None = None) -> list[str]:
    """Refuse (402) when the caller's or a candidate team's month-to-date spend has reached its cap. Returns
    warnings for budgets past their warn ratio."""
    now = now or timezone.now()
    scopes = _scopes(caller_id, team_slugs)
    budgets = [(kind, ident, b) for kind, ident in scopes if (b := _budget(kind, ident)) is not None]
    if not budgets:
        return []
    spent = redis_client().mget([_month_key(kind, ident, now) for kind, ident, _ in budgets])
    warnings = []
    for (kind, ident, budget), raw in zip(budgets, spent, strict=True):
        state = BudgetState(spent=float(raw or 0), limit=float(budget.monthly_limit))
        if state.spent >= state.limit:
            raise PaymentRequired(f"The {kind} budget of {state.limit:g} for {now:%Y-%m} is spent "
                                  f"({state.spent:.4f}); no more work this month.", code="budget_exceeded",
                                  details={"scope": kind, "spent": round(state.spent, 6), "limit": state.limit})
        if state.ratio >= budget.warn_ratio:
            warnings.append(f"{kind} {ident} has spent {state.ratio:.0%} of its monthly budget")
            logger.warning("budget warning", extra={"scope": kind, "ident": str(ident), "ratio": state.ratio})
            from reach_platform.metrics import BUDGET_WARNINGS

            BUDGET_WARNINGS.labels(scope=kind).inc()
    return warnings


def spend_rebuild(*, month: datetime | None = None) -> None:
    """Recompute the month-to-date counters from the entries (after a Redis loss)."""
    month = month or timezone.now()
    start = month.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    qs = CostEntry.objects.filter(created_at__gte=start)
    r = redis_client()
    for team in qs.values("team_slug").annotate(total=Sum("cost")):
        r.set(_month_key("team", team["team_slug"], month), float(team["total"] or 0))
    for caller in qs.exclude(caller__isnull=True).values("caller_id").annotate(total=Sum("cost")):
        r.set(_month_key("caller", caller["caller_id"], month), float(caller["total"] or 0))


def month_spend(budget: Budget, now: datetime | None = None) -> float:
    """Month-to-date spend against ``budget`` (from the Redis counter)."""
    now = now or timezone.now()
    kind, ident = ("team", budget.team.slug) if budget.team is not None else ("caller", budget.caller_id)
    return float(redis_client().get(_month_key(kind, ident, now)) or 0)


@transaction.atomic
def budget_set(*, monthly_limit: Decimal, caller=None, team=None, warn_ratio: float | None = None,
               actor=None) -> Budget:
    """Create or change the monthly cap of one caller or one team, with an audit row."""
    if (caller is None) == (team is None):
        raise InvalidInput("A budget is for one caller or one team.", code="invalid_budget")
    if monthly_limit < 0 or (warn_ratio is not None and not 0 < warn_ratio <= 1):
        raise InvalidInput("A budget needs a limit >= 0 and a warn ratio in (0, 1].", code="invalid_budget")
    scope = {"caller": caller} if caller is not None else {"team": team}
    budget = Budget.objects.select_for_update().filter(**scope).first()
    before = {"monthly_limit": str(budget.monthly_limit), "warn_ratio": budget.warn_ratio} if budget else None
    if budget is None:
        budget = Budget(**scope, monthly_limit=monthly_limit)
    budget.monthly_limit = monthly_limit
    if warn_ratio is not None:
        budget.warn_ratio = warn_ratio
    budget.save()
    audit(action="budget.set", target=budget, actor=actor, before=before,
          after={"monthly_limit": str(budget.monthly_limit), "warn_ratio": budget.warn_ratio})
    key = ("caller", caller.pk) if caller is not None else ("team", team.slug)
    _budgets_cache.pop(key, None)
    return budget
