"""Circuit breaker per instance, shared by every gateway process through Redis (BRIEF §3).

Closed: outcomes are counted in one-second buckets; when the last BREAKER_WINDOW_S seconds hold at least
BREAKER_MIN_REQUESTS calls and BREAKER_FAILURE_RATE of them failed, or the last BREAKER_CONSECUTIVE_FAILURES calls
all failed (each within BREAKER_WINDOW_S of the one before), the breaker opens for BREAKER_OPEN_S.
Open: the instance gets no traffic. Half-open (the open key expired): one probe call at a time is let through;
its success closes the breaker (counts cleared), its failure opens it again.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings

from routing.capacity import in_flight_key
from routing.snapshot import redis_client

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


def _cfg(key: str) -> Any:
    return settings.REACH[key]


def _keys(instance_id: int) -> tuple[str, str, str]:
    base = f"reach:breaker:{instance_id}"
    return f"{base}:open", f"{base}:probe", f"{base}:tripped"


def _in_a_row_key(instance_id: int) -> str:
    return f"reach:breaker:{instance_id}:c"


def state(instance_id: int) -> str:
    open_key, _, tripped_key = _keys(instance_id)
    r = redis_client()
    if r.exists(open_key):
        return OPEN
    return HALF_OPEN if r.exists(tripped_key) else CLOSED


def open_instances(instance_ids: list[int]) -> set[int]:
    """Instances whose breaker is OPEN (one round trip for all)."""
    if not instance_ids:
        return set()
    flags = redis_client().mget([_keys(i)[0] for i in instance_ids])
    return {i for i, flag in zip(instance_ids, flags, strict=True) if flag}


def open_instances_and_loads(instance_ids: list[int]) -> tuple[set[int], dict[int, int]]:
    """Instances whose breaker is OPEN, and each instance's calls in flight (``capacity``'s counts): one round
    trip for both, as the resolver reads them for its candidates."""
    if not instance_ids:
        return set(), {}
    values = redis_client().mget([_keys(i)[0] for i in instance_ids]
                                 + [in_flight_key(f"instance:{i}") for i in instance_ids])
    flags, loads = values[:len(instance_ids)], values[len(instance_ids):]
    return ({i for i, flag in zip(instance_ids, flags, strict=True) if flag},
            {i: int(load or 0) for i, load in zip(instance_ids, loads, strict=True)})


def allow(instance_id: int) -> bool:
    """May a call go to this instance now? In half-open, only one probe at a time."""
    open_key, probe_key, tripped_key = _keys(instance_id)
    r = redis_client()
    is_open, tripped = r.mget([open_key, tripped_key])  # one round trip
    if is_open:
        return False
    if tripped:
        return bool(r.set(probe_key, "1", nx=True, ex=max(5, int(_cfg("BREAKER_OPEN_S")))))
    return True


def trips(total: int, failed: int) -> bool:
    """Whether a window holding ``total`` calls of which ``failed`` failed opens the breaker (no I/O)."""
    return total >= int(_cfg("BREAKER_MIN_REQUESTS")) and failed / total >= float(_cfg("BREAKER_FAILURE_RATE"))


def record(instance_id: int, ok: bool, *, now: float | None = None) -> str:
    """Count one outcome (at ``now``, default the clock); returns the breaker state after it."""
    open_key, probe_key, tripped_key = _keys(instance_id)
    r = redis_client()
    window = int(_cfg("BREAKER_WINDOW_S"))
    now = int(time.time() if now is None else now)
    # one round trip: whether the breaker is half-open, and the count of this outcome (harmless when half-open:
    # closing clears the counters, and while open nothing reads them)
    pipe = r.pipeline(transaction=False)
    pipe.exists(tripped_key)
    in_a_row_key = _in_a_row_key(instance_id)
    pipe.incr(f"reach:breaker:{instance_id}:n:{now}")
    pipe.expire(f"reach:breaker:{instance_id}:n:{now}", window + 2)
    if ok:
        pipe.delete(in_a_row_key)
    else:
        pipe.incr(f"reach:breaker:{instance_id}:f:{now}")
        pipe.expire(f"reach:breaker:{instance_id}:f:{now}", window + 2)
        pipe.incr(in_a_row_key)
        pipe.expire(in_a_row_key, window)
    answers = pipe.execute()
    half_open = answers[0]
    if half_open:  # the probe's result decides
        r.delete(probe_key)
        if ok:
            r.delete(tripped_key, in_a_row_key, *[f"reach:breaker:{instance_id}:{b}:{now - k}" for b in ("n", "f")
                                                  for k in range(window)])
            return CLOSED
        r.set(open_key, "1", ex=int(_cfg("BREAKER_OPEN_S")))
        return OPEN
    if ok:
        return CLOSED
    counts = r.mget([f"reach:breaker:{instance_id}:n:{now - k}" for k in range(window)]
                    + [f"reach:breaker:{instance_id}:f:{now - k}" for k in range(window)])
    total = sum(int(c or 0) for c in counts[:window])
    failed = sum(int(c or 0) for c in counts[window:])
    if trips(total, failed) or int(answers[5]) >= int(_cfg("BREAKER_CONSECUTIVE_FAILURES")):
        pipe = r.pipeline()
        pipe.set(open_key, "1", ex=int(_cfg("BREAKER_OPEN_S")))
        pipe.set(tripped_key, "1")
        pipe.delete(in_a_row_key)
        pipe.execute()
        return OPEN
    return CLOSED
