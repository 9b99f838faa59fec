"""Fast unit tests (no database, no network): pricing an attempt, the canary verdict, cron parsing."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ledger.services import Price, iso_week, price_attempt
from reach_platform.errors import InvalidInput
from reviews.services import canary_verdict
from routing.models import Schedule
from routing.schedules import _cron_fields, schedule_validate

TOKENS = Price(agent="a", team="t", model_name="m", price_in=Decimal("0.8"), price_out=Decimal("2"),
               cost_per_call=Decimal("0.5"), avg_tokens=1000)
FLAT = Price(agent="a", team="t", model_name="m", price_in=Decimal(0), price_out=Decimal(0),
             cost_per_call=Decimal("0.0004"), avg_tokens=300)


def test_usage_reported_by_the_agent_is_priced_per_thousand_tokens():
    assert price_attempt(TOKENS, "success", {"input_tokens": 1500, "output_tokens": 250}) == \
        (1500, 250, False, Decimal("1.700000"))


def test_without_usage_the_declared_profile_is_used_and_marked_estimated():
    assert price_attempt(TOKENS, "success", None) == (700, 300, True, Decimal("1.160000"))
    assert price_attempt(TOKENS, "success", {"other": 1})[2] is True


def test_a_version_without_token_prices_costs_its_price_per_call():
    assert price_attempt(FLAT, "success", {"input_tokens": 10, "output_tokens": 10})[3] == Decimal("0.000400")


@pytest.mark.parametrize("outcome", ["connect_error", "client_error"])
def test_attempts_the_agent_never_ran_are_free(outcome):
    assert price_attempt(TOKENS, outcome, None) == (0, 0, True, Decimal(0))
    assert price_attempt(TOKENS, outcome, {"input_tokens": 5, "output_tokens": 5}) == (5, 5, False, Decimal(0))


@pytest.mark.parametrize("outcome", ["timeout", "server_error", "bad_output", "accepted"])
def test_attempts_that_may_have_run_are_charged(outcome):
    assert price_attempt(FLAT, outcome, None)[3] == Decimal("0.000400")


def test_iso_weeks_cross_the_year_like_iso_8601():
    from datetime import datetime

    assert iso_week(datetime(2026, 12, 31)) == "2026-W53" and iso_week(datetime(2027, 1, 4)) == "2027-W01"


def stats(n: int, rate: float | None, p95: float | None, stable_n: int = 100, stable_rate: float | None = 0.99,
          stable_p95: float | None = 100.0, stable: bool = True) -> dict:
    return {"canary": {"attempts": n, "success_rate": rate, "p95_ms": p95},
            "stable": {"attempts": stable_n, "success_rate": stable_rate, "p95_ms": stable_p95} if stable else None}


@pytest.fixture
def margins(settings):
    settings.REACH = {**settings.REACH, "CANARY_MIN_SAMPLE": 20, "CANARY_SUCCESS_MARGIN": 0.05,
                      "CANARY_LATENCY_MARGIN": 0.5}


@pytest.mark.usefixtures("margins")
@pytest.mark.parametrize(("given", "verdict"), [
    (stats(19, 0.0, 5000), None),                      # too few attempts to judge, however bad
    (stats(20, 0.95, 120), None),                      # within both margins
    (stats(20, 0.93, 120), "success rate 93%"),        # more than 5 points below 99 %
    (stats(40, 0.99, 151), "p95 latency 151 ms"),      # 50 % slower than the stable 100 ms
    (stats(40, 0.99, 149), None),
    (stats(40, 0.99, 400, stable_p95=20), "p95 latency 400 ms"),
    (stats(40, 0.99, 69, stable_p95=20), None),        # at least 50 ms slower before it counts
    (stats(40, 0.99, 900, stable_n=5), None),          # latency needs a stable sample too
    (stats(20, 0.90, 100, stable=False), "success rate 90%"),  # no stable version: judged against 100 %
])
def test_canary_verdicts(given, verdict):
    result = canary_verdict(given)
    assert (result is None) if verdict is None else result.startswith(verdict), result


@pytest.mark.parametrize(("expression", "fields"), [
    ("*/5 * * * *", {"minute": "*/5", "hour": "*", "day_of_month": "*", "month_of_year": "*", "day_of_week": "*"}),
    ("0 9 * * mon-fri", {"minute": "0", "hour": "9", "day_of_month": "*", "month_of_year": "*",
                         "day_of_week": "mon-fri"}),
])
def test_cron_expressions_parse_into_beat_fields(expression, fields):
    assert _cron_fields(expression) == fields


@pytest.mark.parametrize("expression", ["* * * *", "61 * * * *", "* 25 * * *", "* * * * funday", "every day"])
def test_bad_cron_expressions_are_refused(expression):
    with pytest.raises(InvalidInput):
        _cron_fields(expression)


@pytest.mark.parametrize(("fields", "message"), [
    ({"cron": "* * * * *", "every_seconds": 5, "capability": "a.b"}, "either a cron"),
    ({"capability": "a.b"}, "either a cron"),
    ({"cron": "* * * * *", "capability": "a.b", "task_text": "x"}, "either a capability"),
    ({"cron": "* * * * *", "capability": "a.b", "payload": [1]}, "JSON object"),
])
def test_a_schedule_needs_one_timing_one_target_and_an_object_payload(fields, message):
    with pytest.raises(InvalidInput, match=message):
        schedule_validate(Schedule(name="s", **fields))
