"""Shared capacity accounting in Redis: in-flight counts and token buckets, per instance and per caller.

Overload fails fast (429 + Retry-After) instead of queueing forever.
"""

from __future__ import annotations

import time
from typing import Any

from routing.snapshot import redis_client

# Atomic token bucket: refill by elapsed time, take one token or say how long until one is there.
_BUCKET = """
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local data = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(data[1]) or burst
local ts = tonumber(data[2]) or now
tokens = math.min(burst, tokens + (now - ts) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', key, 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', key, math.ceil(burst / rate) + 5)
return tostring(wait)
"""
# Atomic "increment unless at the cap".
_ACQUIRE = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then return -1 end
n = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return n
"""
_scripts: dict[str, Any] = {}


def _script(name: str, body: str) -> Any:
    if name not in _scripts:
        _scripts[name] = redis_client().register_script(body)
    return _scripts[name]


def take_token(key: str, rate: float, burst: float | None = None, *, now: float | None = None) -> float:
    """0 when a token was taken, else the seconds until one will be there (``now``: default the clock)."""
    burst = burst if burst is not None else max(1.0, rate)
    return float(_script("bucket", _BUCKET)(keys=[f"reach:bucket:{key}"],
                                             args=[rate, burst, time.time() if now is None else now]))


def in_flight_key(key: str) -> str:
    """The Redis key of ``key``'s in-flight count (``instance:<id>``, a caller's)."""
    return f"reach:inflight:{key}"


def acquire(key: str, cap: int, ttl: int = 600) -> bool:
    return int(_script("acquire", _ACQUIRE)(keys=[in_flight_key(key)], args=[cap, ttl])) >= 0


def release(key: str) -> None:
    r = redis_client()
    if r.decr(in_flight_key(key)) < 0:
        r.set(in_flight_key(key), 0)


def in_flight(keys: list[str]) -> list[int]:
    if not keys:
        return []
    return [int(v or 0) for v in redis_client().mget([in_flight_key(k) for k in keys])]

