"""The execution gateway (BRIEF §3): the attempt loop over the ranked candidates.

For each candidate (fallback order) and each try within the shared retry budget:
quota -> breaker -> transport -> record. Retries only on connection failures, 5xx and explicit retryable errors,
never on 4xx, and never when a non-idempotent capability may already have run (a timeout or a 5xx after the
request was sent); the same rule holds for fallback. Output that breaks ``output_schema`` or comes from another
endpoint id (a stale address) is discarded and the next candidate gets the request.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import random
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone

from reach_platform import engine, jsonsafe, tracing
from reach_platform.errors import ApplicationError, TooManyRequests
from reach_platform.metrics import CALL_SECONDS, QUOTA_REFUSALS
from routing import admission
from routing.choices import AttemptOutcome
from routing.schemas import validator_for
from routing.snapshot import InstanceInfo, VersionInfo

logger = logging.getLogger(__name__)
_rr_counter: dict[int, int] = {}
_timeouts: dict[int, tuple[float, float]] = {}


def _cfg(key: str):
    return settings.REACH[key]


@dataclass
class AttemptRecord:
    number: int
    version_id: int
    instance_id: int | None
    started_at: datetime
    latency_ms: float
    timeout_ms: float
    outcome: str
    status_code: int | None = None
    error: str = ""
    is_retry: bool = False
    is_fallback: bool = False
    usage: dict | None = None


@dataclass
class Execution:
    ok: bool
    result: Any = None
    error: dict | None = None
    version: VersionInfo | None = None
    instance: InstanceInfo | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    fallback: bool = False
    accepted: bool = False  # an http-async agent ACKed, or an A2A agent took the task: the outcome comes later
    input_required: bool = False  # an A2A agent asks the caller (result: its question and the A2A task)
    budget_left: int = 0


async def timeout_s(version: VersionInfo) -> float:
    """max(MIN_TIMEOUT_S, TIMEOUT_P95_FACTOR x p95): observed p95 once 20 latencies are known, else declared.
    Read from Redis at most every 5 s per version and process."""
    cached = _timeouts.get(version.id)
    now = time.monotonic()
    if cached and now - cached[1] < 5:
        return cached[0]
    samples = await admission.latency_samples(version.id)
    p95 = sorted(samples)[int(0.95 * (len(samples) - 1))] if len(samples) >= 20 else version.p95_latency_ms
    value = max(float(_cfg("MIN_TIMEOUT_S")), float(_cfg("TIMEOUT_P95_FACTOR")) * p95 / 1000.0)
    _timeouts[version.id] = (value, now)
    return value


def backoff_s(attempt: int) -> float:
    return min(float(_cfg("BACKOFF_CAP_S")), float(_cfg("BACKOFF_BASE_S")) * 2 ** attempt) \
        + random.uniform(0, float(_cfg("BACKOFF_JITTER_S")))


# --- instance pick strategies ----------------------------------------------------------------------------

def pick_weighted_round_robin(instances: list[InstanceInfo], key: str | None = None,
                              counts: list[int] | None = None) -> list[InstanceInfo]:
    """Smooth weighted round robin over the instances; ONLINE before SUSPECT. Returns an order to try."""
    online = [i for i in instances if i.liveness == "online"] or instances
    total = sum(max(1, i.weight) for i in online)
    rr_key = online[0].id if online else 0
    n = _rr_counter.get(rr_key, 0)
    slot = n % total if total else 0
    _rr_counter[rr_key] = n + 1
    order, acc = [], 0
    for inst in online:
        acc += max(1, inst.weight)
        if slot < acc:
            order.append(inst)
            break
    order += [i for i in online if i not in order] + [i for i in instances if i not in online]
    return order


def pick_least_connections(instances: list[InstanceInfo], key: str | None = None,
                           counts: list[int] | None = None) -> list[InstanceInfo]:
    """Fewest calls in flight per unit of weight (``counts``: in-flight per instance, read by the caller)."""
    counts = counts if counts is not None else [0] * len(instances)
    return [i for _, i in sorted(zip(counts, instances, strict=True), key=lambda p: (p[1].liveness != "online",
                                                                                     p[0] / max(1, p[1].weight)))]


def pick_consistent_hash(instances: list[InstanceInfo], key: str | None = None,
                         counts: list[int] | None = None) -> list[InstanceInfo]:
    """Rendezvous hashing on the user key: the same user sticks to the same instance while it lives."""
    if not key:
        return pick_weighted_round_robin(instances)
    return sorted(instances, key=lambda i: hashlib.blake2b(f"{key}:{i.instance_id}".encode(),
                                                           digest_size=8).digest(), reverse=True)


def pick_cost_aware(instances: list[InstanceInfo], key: str | None = None,
                    counts: list[int] | None = None) -> list[InstanceInfo]:
    """Instances of one agent share a price; prefer the least loaded, which wastes least on timeouts."""
    return pick_least_connections(instances, counts=counts)


STRATEGIES = {"weighted_round_robin": pick_weighted_round_robin, "least_connections": pick_least_connections,
              "consistent_hash": pick_consistent_hash, "cost_aware": pick_cost_aware}
LOAD_AWARE = {"least_connections", "cost_aware"}  # strategies that read the instances' in-flight counts


# --- the attempt loop -----------------------------------------------------------------------------------

@dataclass
class CallContext:
    request_id: str
    trace_id: str
    depth: int
    call_path: list[str]
    budget: int
    user_key: str = ""
    strategy: str = "weighted_round_robin"
    traceparent: str = ""
    sticky_instance_id: int | None = None  # the open session's instance, tried first
    task_text: str = ""  # the caller's request in words (the a2a transport sends it as a text part)
    a2a_turn: dict | None = None  # the caller's answer to an A2A agent's question: {task_id, context_id, answer, turn}
    task_pk: int | None = None  # our task's row (A2A push URLs name it: request_ids are unique per caller only)
    mode: str = "sync"  # an async task's A2A call may return at once and be followed by push
    after: Any = None  # the run's routing.transitions.Deferred: a successful call's settlement goes with it
    # (version id, instance) whose slot the caller's admission took already (routing.invoke.run): the first try
    # of that version goes there without an admission of its own; None once taken
    admitted: tuple[int, InstanceInfo] | None = None


def _headers(ctx: CallContext, version: VersionInfo, budget: int) -> dict[str, str]:
    headers = {
        "X-Reach-Request-Id": ctx.request_id,
        "X-Reach-Trace-Id": ctx.trace_id,
        "X-Reach-Depth": str(ctx.depth + 1),
        "X-Reach-Call-Path": ",".join([*ctx.call_path, version.agent]),
        "X-Reach-Retry-Budget": str(budget),
        # the attempt span's context when tracing is on; else the caller's trace id with a fresh parent id
        "traceparent": tracing.current_traceparent()
        or f"00-{ctx.trace_id[:32].ljust(32, '0')}-{random.getrandbits(64):016x}-01",
    }
    return headers


async def _call(instance: InstanceInfo, version: VersionInfo, payload: dict, ctx: CallContext, budget: int,
                timeout: float) -> tuple[str, int | None, Any, str, dict | None]:
    """One HTTP call. Returns (outcome, status, result, error, usage)."""
    body = {"capability": version.capability, "version": version.version, "payload": payload,
            "request_id": ctx.request_id}
    try:
        if instance.transport == "a2a":
            from routing import a2a_transport

            outcome, status, result, error, usage = await a2a_transport.call(
                instance, version, payload, ctx, _headers(ctx, version, budget), timeout)
            return _checked_output(version, status, result, usage) if outcome == AttemptOutcome.SUCCESS \
                else (outcome, status, result, error, usage)
        status, content = await engine.post_json(
            instance.url, jsonsafe.dumps(body),
            _headers(ctx, version, budget), timeout=timeout, connect_timeout=min(timeout, 2.0))
    except (engine.CallTimeout, httpx.TimeoutException) as exc:  # httpx: the a2a transport's client
        if isinstance(exc, httpx.ConnectTimeout):
            return AttemptOutcome.CONNECT_ERROR, None, None, "connect timeout", None
        return AttemptOutcome.TIMEOUT, None, None, f"no answer within {timeout:.1f}s", None
    except (engine.ConnectFailed, httpx.TransportError) as exc:
        return AttemptOutcome.CONNECT_ERROR, None, None, str(exc) if isinstance(exc, engine.ConnectFailed) \
            else f"{type(exc).__name__}: {exc}"[:300], None
    try:  # an agent's answer is stored: what PostgreSQL cannot hold (a NUL, a lone surrogate) is refused here
        data = jsonsafe.parse_json(content) if content else {}
    except ApplicationError:
        data = None
    if data is None:
        if status < 400:
            return AttemptOutcome.BAD_OUTPUT, status, None, "the answer is not storable JSON", None
        data = {}
    if not isinstance(data, dict):
        data = {"result": data}
    if status >= 500:
        return AttemptOutcome.SERVER_ERROR, status, None, str(data.get("error", content[:200].decode("utf-8", "replace"))), None
    if status >= 400:
        if data.get("retryable") is True:
            return AttemptOutcome.SERVER_ERROR, status, None, str(data.get("error", "retryable error")), None
        return AttemptOutcome.CLIENT_ERROR, status, None, str(data.get("error", content[:200].decode("utf-8", "replace"))), None
    answered_by = data.get("endpoint_id")
    if answered_by != version.agent:
        return AttemptOutcome.FINGERPRINT, status, None, \
            f"answered as '{answered_by}', expected '{version.agent}' (stale address?)", None
    if status == 202:
        return AttemptOutcome.ACCEPTED, status, None, "", data.get("usage")
    return _checked_output(version, status, data.get("result"), data.get("usage"))


def _checked_output(version: VersionInfo, status: int | None, result: Any, usage: dict | None):
    if version.output_schema:
        errors = [e.message for e in validator_for(version.output_schema).iter_errors(result)]
        if errors:
            return AttemptOutcome.BAD_OUTPUT, status, None, f"output_schema: {errors[0]}"[:300], usage
    return AttemptOutcome.SUCCESS, status, result, "", usage


# Outcomes after which the agent may have executed the request.
_MAY_HAVE_RUN = {AttemptOutcome.TIMEOUT, AttemptOutcome.SERVER_ERROR, AttemptOutcome.BAD_OUTPUT,
                 AttemptOutcome.FINGERPRINT}
_RETRYABLE = {AttemptOutcome.TIMEOUT, AttemptOutcome.CONNECT_ERROR, AttemptOutcome.SERVER_ERROR}


async def execute(*, candidates: list[VersionInfo], payload: dict, ctx: CallContext) -> Execution:
    """Try the candidates in order with retries inside the shared budget. Raises TooManyRequests when every
    candidate is at capacity and nothing was attempted."""
    execution = Execution(ok=False, budget_left=ctx.budget)
    number = 0
    busy_wait: float | None = None
    for c_index, version in enumerate(candidates):
        if not version.instances:
            continue
        tries = 0
        while True:
            instance: InstanceInfo | None
            if ctx.admitted is not None and ctx.admitted[0] == version.id:
                (_, instance), wait, ctx.admitted = ctx.admitted, 0.0, None
            else:
                instance, wait = await _admit(await instance_order(version, ctx))
            if instance is None:
                busy_wait = wait if busy_wait is None else min(busy_wait, wait)
                break
            number += 1
            timeout = await timeout_s(version)
            started = timezone.now()
            t0 = time.perf_counter()
            outcome: str = AttemptOutcome.CONNECT_ERROR
            status, result, error, usage = None, None, "cancelled", None
            try:
                with tracing.tracer.start_as_current_span(
                        "reach.attempt", context=tracing.parent_context(ctx.traceparent),
                        attributes={"reach.request_id": ctx.request_id, "reach.agent": version.agent,
                                    "reach.attempt": number}) as span:
                    outcome, status, result, error, usage = await _call(instance, version, payload, ctx,
                                                                        execution.budget_left, timeout)
                    span.set_attribute("reach.outcome", outcome)
            finally:
                latency = (time.perf_counter() - t0) * 1000
                ok = outcome in (AttemptOutcome.SUCCESS, AttemptOutcome.ACCEPTED, AttemptOutcome.INPUT_REQUIRED)
                if ok and ctx.after is not None:  # nothing waits on it: sent with the run's last round trip
                    ctx.after.later(functools.partial(admission.settle_into, instance=instance,
                                                      version_id=version.id, latency_ms=latency))
                else:
                    await asyncio.shield(admission.settle(instance, version.id,
                                                          ok=ok or outcome == AttemptOutcome.CLIENT_ERROR,
                                                          latency_ms=latency if ok else None))
            CALL_SECONDS.labels(agent=version.agent, outcome=outcome).observe(latency / 1000)
            execution.attempts.append(AttemptRecord(
                number=number, version_id=version.id, instance_id=instance.id, started_at=started,
                latency_ms=latency, timeout_ms=timeout * 1000, outcome=outcome, status_code=status, error=error,
                is_retry=tries > 0, is_fallback=c_index > 0, usage=usage))
            if ok:
                execution.ok = True
                execution.accepted = outcome == AttemptOutcome.ACCEPTED
                execution.input_required = outcome == AttemptOutcome.INPUT_REQUIRED
                execution.result, execution.version, execution.instance = result, version, instance
                execution.fallback = c_index > 0
                return execution
            execution.error = {"code": outcome, "message": error, "agent": version.agent, "status": status}
            execution.version, execution.instance = version, instance
            if not version.idempotent and outcome in _MAY_HAVE_RUN:
                # it may have run: neither a retry nor a fallback may run it again
                execution.error["message"] += " (not idempotent: not retried)"
                return execution
            if outcome == AttemptOutcome.CLIENT_ERROR:
                return execution  # the request itself is wrong: no other agent will take it either
            if outcome == AttemptOutcome.TIMEOUT and c_index + 1 < len(candidates):
                break  # a timed-out agent is slow or sick: the next candidate, not the same one again
            if (outcome in _RETRYABLE and execution.budget_left > 0 and tries < version.max_retries):
                execution.budget_left -= 1
                tries += 1
                await asyncio.sleep(backoff_s(tries - 1))
                continue
            break  # next candidate
    if not execution.attempts and busy_wait is not None:
        QUOTA_REFUSALS.labels(scope="instance").inc()
        raise TooManyRequests("Every capable agent is at capacity; try again shortly.", retry_after=busy_wait,
                              code="agent_overloaded")
    return execution


async def instance_order(version: VersionInfo, ctx: CallContext) -> list[InstanceInfo]:
    """The instances of ``version`` in the order to try them (the strategy's, the open session's first)."""
    counts = await admission.in_flight([i.id for i in version.instances]) if ctx.strategy in LOAD_AWARE else None
    order = STRATEGIES.get(ctx.strategy, pick_weighted_round_robin)(version.instances, ctx.user_key, counts)
    if ctx.sticky_instance_id is not None:
        order.sort(key=lambda inst: inst.id != ctx.sticky_instance_id)
    return order


async def _admit(order: list[InstanceInfo]) -> tuple[InstanceInfo | None, float]:
    """First instance in ``order`` whose breaker, rate and concurrency let a call through (one Redis round trip
    per instance asked)."""
    wait = 1.0
    for instance in order:
        admitted, token_wait = await admission.admit(instance)
        if admitted:
            return instance, 0.0
        if token_wait > 0:
            wait = min(wait, token_wait)
    return None, wait
