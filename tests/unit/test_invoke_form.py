"""The fast lane's reused InvokeInput: each request is validated on its own, as a fresh serializer would."""

from __future__ import annotations

import threading

from routing.api.fastlane import validated
from routing.api.serializers import InvokeInput


def _fresh(data: dict):
    form = InvokeInput(data=data)
    return (dict(form.validated_data), None) if form.is_valid() else (None, dict(form.errors))


CASES = [
    {"capability": "order.query", "payload": {"order_id": "1"}, "request_id": "a-1"},
    {"capability": "x" * 121},
    {"task": "where is my parcel", "mode": "async", "top_k": 2},
    {"payload": {"a": 1}},  # neither task nor capability
    {"capability": "order.query", "request_id": "bad id/with slash"},
    {"capability": "order.query", "domains": ["commerce"], "cost_preference": 0.5},
]


def test_one_reused_form_answers_each_request_as_a_fresh_one():
    for data in CASES * 2:  # and again: nothing of an earlier request is left behind
        assert validated(data) == _fresh(data)


def test_each_thread_has_its_own_form():
    seen: list = []
    threads = [threading.Thread(target=lambda d=d: seen.append((d, validated(d)))) for d in CASES]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(seen) == len(CASES)
    assert all(answer == _fresh(data) for data, answer in seen)
