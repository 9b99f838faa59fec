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


def test_the_plain_shapes_validate_exactly_as_invoke_input():
    """The checks that skip DRF for the common bodies (``_plain``) answer every generated body as a fresh
    ``InvokeInput`` does, and do answer the common ones themselves."""
    import random

    from routing.api.fastlane import _plain

    texts = ["order.query", " padded ", "", "x" * 121, "x" * 4001, "a\x00b", "\ud800", "é ok", "bad id/with slash",
             "ok-1.2:3@4~5+6=7", "\n", 7, 2.5, True, None, ["a"], {"a": 1}]
    values = {
        "capability": texts, "task": texts, "request_id": texts + ["r" * 100, "r" * 101], "user_key": texts,
        "action": texts, "confirm": texts, "mode": ["sync", "async", "later", 1, None],
        "top_k": [1, 20, 0, 21, True, 3.0, "3", None], "payload": [{}, {"order_id": "42"}, [], "x", None, 3],
        "domains": [["commerce"]], "cost_preference": [0.5], "callback_url": [""], "unknown": [1],
    }
    rng = random.Random(7)
    plain_answers = 0
    for _ in range(3000):
        keys = rng.sample(sorted(values), rng.randint(0, 5))
        data = {key: rng.choice(values[key]) for key in keys}
        if rng.random() < 0.5:
            data["capability"] = "order.query"
        fresh = _fresh(data)
        if _plain(data) is not None:
            plain_answers += 1
            assert (_plain(data), None) == fresh, data
        assert validated(data) == fresh, data
    assert plain_answers > 300  # the common shapes do skip DRF
