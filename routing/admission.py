"""One Redis round trip before and one after each agent call, shared by every node (redis.asyncio).

``admit`` asks, atomically: is the instance's breaker closed (or is this the one half-open probe), is there a
token in its ``max_qps`` bucket, and is it under ``max_concurrency``; if all three, it takes the token and the
in-flight slot. ``settle`` gives the slot back, counts the outcome in the breaker's window (opening it past the
failure rate, or letting the half-open probe decide) and keeps the latency sample that sets the timeout.

Every command goes with the commands of the process's other requests (``engine.redis_pipelined``): under load,
many requests' admissions share one round trip.

The keys are the ones ``routing.breaker`` and ``routing.capacity`` read and write (their sync functions serve
the resolver, the admin and the tests); the rules are the same, in Lua so that each step is one round trip.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from redis.exceptions import NoScriptError

from reach_platform import engine

_ADMIT = """
-- KEYS: breaker open, breaker tripped, breaker probe, token bucket, in-flight count
-- ARGV: now, rate, burst, max concurrency, probe ttl, in-flight ttl
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, 'open'} end
local probing = false
if redis.call('EXISTS', KEYS[2]) == 1 then
  if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', tonumber(ARGV[5])) then return {0, 'probe'} end
  probing = true
end
local now, rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local data = redis.call('HMGET', KEYS[4], 'tokens', 'ts')
local tokens = tonumber(data[1]) or burst
local ts = tonumber(data[2]) or now
tokens = math.min(burst, tokens + (now - ts) * rate)
if tokens < 1 then
  if probing then redis.call('DEL', KEYS[3]) end
  return {0, 'rate', tostring((1 - tokens) / rate)}
end
local n = tonumber(redis.call('GET', KEYS[5]) or '0')
if n >= tonumber(ARGV[4]) then
  if probing then redis.call('DEL', KEYS[3]) end
  return {0, 'busy'}
end
redis.call('HSET', KEYS[4], 'tokens', tokens - 1, 'ts', now)
redis.call('EXPIRE', KEYS[4], math.ceil(burst / rate) + 5)
redis.call('INCR', KEYS[5])
redis.call('EXPIRE', KEYS[5], tonumber(ARGV[6]))
return {1, 'ok'}
"""

_SETTLE = """
-- KEYS: breaker open, breaker probe, breaker tripped, in-flight count, latency samples
-- ARGV: now, window, ok (1/0), min requests, failure rate, open seconds, latency ms ('' for none), bucket prefix,
--       failures in a row that open the breaker
if redis.call('DECR', KEYS[4]) < 0 then redis.call('SET', KEYS[4], 0) end
local ok = ARGV[3] == '1'
if ok and ARGV[7] ~= '' then
  redis.call('LPUSH', KEYS[5], ARGV[7])
  redis.call('LTRIM', KEYS[5], 0, 199)
end
local now, window, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[8]
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('DEL', KEYS[2])
  if ok then
    redis.call('DEL', KEYS[3], prefix .. ':c')
    for k = 0, window - 1 do redis.call('DEL', prefix .. ':n:' .. (now - k), prefix .. ':f:' .. (now - k)) end
    return 'closed'
  end
  redis.call('SET', KEYS[1], '1', 'EX', tonumber(ARGV[6]))
  return 'open'
end
redis.call('INCR', prefix .. ':n:' .. now)
redis.call('EXPIRE', prefix .. ':n:' .. now, window + 2)
if ok then
  redis.call('DEL', prefix .. ':c')
  return 'closed'
end
redis.call('INCR', prefix .. ':f:' .. now)
redis.call('EXPIRE', prefix .. ':f:' .. now, window + 2)
local in_a_row = redis.call('INCR', prefix .. ':c')
redis.call('EXPIRE', prefix .. ':c', window)
local total, failed = 0, 0
for k = 0, window - 1 do
  total = total + tonumber(redis.call('GET', prefix .. ':n:' .. (now - k)) or '0')
  failed = failed + tonumber(redis.call('GET', prefix .. ':f:' .. (now - k)) or '0')
end
if in_a_row >= tonumber(ARGV[9]) or (total >= tonumber(ARGV[4]) and failed / total >= tonumber(ARGV[5])) then
  redis.call('SET', KEYS[1], '1', 'EX', tonumber(ARGV[6]))
  redis.call('SET', KEYS[3], '1')
  redis.call('DEL', prefix .. ':c')
  return 'open'
end
return 'closed'
"""

_ACQUIRE_CALLER = """
-- KEYS: in-flight count, token bucket, routing snapshot generation, then the breaker 'open' keys of the instances
-- the request will likely go to (generation and breakers are read back with the answer: the resolve that follows
-- needs no round trip of its own), then four keys (breaker open, breaker tripped, token bucket, in-flight count)
-- of each instance to admit the call to, in the order to try them (``_ADMIT``'s rules, in the same round trip)
-- ARGV: max concurrency, in-flight ttl, now, rate, burst, how many breaker keys, then rate, burst and max
-- concurrency of each instance to admit to
local generation = redis.call('GET', KEYS[3]) or ''
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then return {0, 'concurrency', '0', generation} end
local now, rate, burst = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local data = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
local tokens = tonumber(data[1]) or burst
local ts = tonumber(data[2]) or now
tokens = math.min(burst, tokens + (now - ts) * rate)
if tokens < 1 then return {0, 'rate', tostring((1 - tokens) / rate), generation} end
redis.call('HSET', KEYS[2], 'tokens', tokens - 1, 'ts', now)
redis.call('EXPIRE', KEYS[2], math.ceil(burst / rate) + 5)
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
local flags = tonumber(ARGV[6])
local answer = {1, 'ok', '0', generation, 0}
for k = 4, 3 + flags do answer[#answer + 1] = redis.call('EXISTS', KEYS[k]) end
-- the call's instance: the first one whose breaker is closed (a half-open one is left to its probe, see _ADMIT)
-- with a token in its bucket and a free slot
local first = 4 + flags
for j = 0, (#KEYS - first + 1) / 4 - 1 do
  local key, arg = first + 4 * j, 7 + 3 * j
  if redis.call('EXISTS', KEYS[key]) == 0 and redis.call('EXISTS', KEYS[key + 1]) == 0 then
    local irate, iburst = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1])
    local idata = redis.call('HMGET', KEYS[key + 2], 'tokens', 'ts')
    local itokens = math.min(iburst, (tonumber(idata[1]) or iburst) + (now - (tonumber(idata[2]) or now)) * irate)
    if itokens >= 1 and tonumber(redis.call('GET', KEYS[key + 3]) or '0') < tonumber(ARGV[arg + 2]) then
      redis.call('HSET', KEYS[key + 2], 'tokens', itokens - 1, 'ts', now)
      redis.call('EXPIRE', KEYS[key + 2], math.ceil(iburst / irate) + 5)
      redis.call('INCR', KEYS[key + 3])
      redis.call('EXPIRE', KEYS[key + 3], tonumber(ARGV[2]))
      answer[5] = j + 1
      break
    end
  end
end
return answer
"""

_RELEASE = "if redis.call('DECR', KEYS[1]) < 0 then redis.call('SET', KEYS[1], 0) end return 1"
INFLIGHT_TTL_S = 600


def _cfg(key: str):
    return settings.REACH[key]


@functools.cache
def _sha(body: str) -> str:
    return hashlib.sha1(body.encode()).hexdigest()  # noqa: S324 - Redis names a script by its SHA-1


async def _evaluate(body: str, keys: list, args: list):
    """Run a script by its SHA with the loop's other requests' commands (``engine.redis_pipelined``); a server
    that does not have it yet (restarted, flushed) gets the script itself once."""
    sha = _sha(body)
    reply, = await engine.redis_pipelined(lambda pipe: pipe.evalsha(sha, len(keys), *keys, *args))
    if isinstance(reply, NoScriptError):
        return await engine.redis().eval(body, len(keys), *keys, *args)
    if isinstance(reply, Exception):
        raise reply
    return reply


def _breaker_keys(instance_id: int) -> tuple[str, str, str]:
    base = f"reach:breaker:{instance_id}"
    return f"{base}:open", f"{base}:tripped", f"{base}:probe"


async def admit(instance) -> tuple[bool, float]:
    """(admitted, seconds to wait before the instance has a token again: 0 when not rate-limited)."""
    open_key, tripped_key, probe_key = _breaker_keys(instance.id)
    rate, burst, concurrency = _instance_limits(instance)
    answer = await _evaluate(
        _ADMIT, [open_key, tripped_key, probe_key, f"reach:bucket:instance:{instance.id}",
                 f"reach:inflight:instance:{instance.id}"],
        [time.time(), rate, burst, concurrency, max(5, int(_cfg("BREAKER_OPEN_S"))), INFLIGHT_TTL_S])
    if int(answer[0]) == 1:
        return True, 0.0
    reason = answer[1].decode() if isinstance(answer[1], bytes) else answer[1]
    return False, float(answer[2]) if reason == "rate" else 0.0


def _settle_args(instance, version_id: int, ok: bool, latency_ms: float | None) -> tuple[list, list]:
    open_key, tripped_key, probe_key = _breaker_keys(instance.id)
    return ([open_key, probe_key, tripped_key, f"reach:inflight:instance:{instance.id}", f"reach:lat:{version_id}"],
            [int(time.time()), int(_cfg("BREAKER_WINDOW_S")), "1" if ok else "0", int(_cfg("BREAKER_MIN_REQUESTS")),
             float(_cfg("BREAKER_FAILURE_RATE")), int(_cfg("BREAKER_OPEN_S")),
             "" if latency_ms is None else str(round(latency_ms, 1)), f"reach:breaker:{instance.id}",
             int(_cfg("BREAKER_CONSECUTIVE_FAILURES"))])


async def settle(instance, version_id: int, *, ok: bool, latency_ms: float | None) -> str:
    """Release the slot, count the outcome; returns the breaker state after it."""
    keys, args = _settle_args(instance, version_id, ok, latency_ms)
    state = await _evaluate(_SETTLE, keys, args)
    return state.decode() if isinstance(state, bytes) else state


def settle_into(pipe, instance, version_id: int, *, latency_ms: float) -> None:
    """``settle`` of a successful call, added to a pipeline sent later (``routing.transitions.Deferred``): the
    run's last round trip carries it. EVAL, not the registered script (see ``caller_release``)."""
    keys, args = _settle_args(instance, version_id, True, latency_ms)
    pipe.eval(_SETTLE, len(keys), *keys, *args)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class CallerAdmission:
    """What ``caller_acquire`` answered: ``refused`` is '' when the quotas let the request in, else the quota
    that refused it ('concurrency' | 'rate') with ``wait`` the seconds to wait. ``generation`` is the routing
    snapshot's (``routing.snapshot``); ``open_instances`` are those of the instances asked about whose breaker
    is OPEN (None when the quotas refused, or none were asked about); ``instance`` is the instance of those
    offered whose slot the call took (``release_instance_into`` gives it back when the call does not go
    there)."""

    refused: str
    wait: float
    generation: str
    open_instances: set[int] | None = None
    instance: Any = None


def _instance_limits(instance) -> tuple[float, float, int]:
    rate = float(instance.max_qps)
    return rate, max(1.0, rate), int(instance.max_concurrency)


async def caller_acquire(caller_id, *, instance_ids: Sequence[int] = (), admit: Sequence = ()) -> CallerAdmission:
    """Take a slot of the caller's concurrency quota and a token of its rate quota, and read, in the same round
    trip, the routing snapshot's generation and whether the breaker of each of ``instance_ids`` is open. With
    ``admit`` (instances, in the order to try them), the call's admission to the first of them that takes it
    comes in the same round trip too (``admit``'s rules; an instance whose breaker is half-open is skipped: its
    probe goes through ``admit``)."""
    from routing.snapshot import GENERATION_KEY

    key = f"caller:{caller_id}"
    rate = float(_cfg("CALLER_MAX_QPS"))
    keys = [f"reach:inflight:{key}", f"reach:bucket:{key}", GENERATION_KEY,
            *[_breaker_keys(i)[0] for i in instance_ids]]
    args: list = [int(_cfg("CALLER_MAX_CONCURRENCY")), INFLIGHT_TTL_S, time.time(), rate, max(1.0, rate),
                  len(instance_ids)]
    for instance in admit:
        open_key, tripped_key, _ = _breaker_keys(instance.id)
        keys += [open_key, tripped_key, f"reach:bucket:instance:{instance.id}",
                 f"reach:inflight:instance:{instance.id}"]
        args += _instance_limits(instance)
    answer = await _evaluate(_ACQUIRE_CALLER, keys, args)
    reason, generation = _text(answer[1]), _text(answer[3])
    if reason == "rate":
        return CallerAdmission(reason, float(answer[2]), generation)
    if reason == "concurrency":
        return CallerAdmission(reason, 1.0, generation)
    flags, taken = answer[5:], int(answer[4])
    return CallerAdmission("", 0.0, generation, {i for i, flag in zip(instance_ids, flags, strict=True) if int(flag)}
                           if instance_ids else None, admit[taken - 1] if taken else None)


def release_instance_into(pipe, instance) -> None:
    """Give back an instance slot that ``caller_acquire`` took for a call that did not go there (added to a
    pipeline: ``caller_release`` sends it)."""
    pipe.eval(_RELEASE, 1, f"reach:inflight:instance:{instance.id}")


async def caller_release(caller_id, *, after=None, release: bool = True) -> None:
    """Give back the caller's concurrency slot (``release``) and send ``after`` (the Redis commands a committed
    run left for later, ``routing.transitions.Deferred``) in the same round trip, with the loop's other
    requests' commands (``engine.redis_pipelined``)."""
    def add(pipe) -> None:
        if release:  # EVAL, not EVALSHA: a server that lost the script would fail the release
            pipe.eval(_RELEASE, 1, f"reach:inflight:caller:{caller_id}")
        if after is not None:
            after.add_to(pipe)

    for reply in await engine.redis_pipelined(add):
        if isinstance(reply, Exception):
            raise reply


async def latency_samples(version_id: int) -> list[float]:
    return [float(x) for x in await engine.redis().lrange(f"reach:lat:{version_id}", 0, 199)]


async def in_flight(instance_ids: list[int]) -> list[int]:
    if not instance_ids:
        return []
    values = await engine.redis().mget([f"reach:inflight:instance:{i}" for i in instance_ids])
    return [int(v or 0) for v in values]
