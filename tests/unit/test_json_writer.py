"""``jsonsafe.dumps`` (orjson) writes what the json module wrote before it on the invoke path: the same bytes for
the values the invoke path writes, and what orjson refuses is still written."""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal

import pytest

from reach_platform.jsonsafe import dumps
from routing.rowsql import _plain


def _json_module(value, default=None) -> bytes:
    return json.dumps(value, default=default, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("value", [
    {"order_id": "42", "qty": 3, "price": 1.1, "ok": True, "none": None, "nested": {"list": [1, "二", {"x": []}]}},
    [{"created_at": datetime.datetime(2026, 12, 2, 6, 0, tzinfo=datetime.UTC),
      "at": datetime.datetime(2026, 12, 2, 6, 0, 1, 250, tzinfo=datetime.UTC), "day": datetime.date(2026, 12, 2),
      "cost": Decimal("0.000125"), "text": "résumé 订单 \u2028 \"quoted\" \\ back"}],
    {1: "an integer key", "big": 2 ** 70, "small": -(2 ** 63)},  # the json module's fallback: beyond 64 bits
    {"id": uuid.UUID("12345678-1234-5678-1234-567812345678").hex, "floats": [0.1, 2.5, 1e22, -0.0]},
])
def test_the_writer_matches_the_json_module(value):
    assert dumps(value, default=_plain) == _json_module(value, default=_plain)


def test_small_exponents_are_written_otherwise_but_read_back_the_same():
    value = {"latency_s": [1e-7, 3.2e-5, 1e-300]}
    assert dumps(value) == b'{"latency_s":[1e-7,0.000032,1e-300]}'  # the json module: 1e-07, 3.2e-05
    assert json.loads(dumps(value)) == value


def test_what_neither_can_write_is_refused():
    with pytest.raises(TypeError):
        dumps({"x": object()})
