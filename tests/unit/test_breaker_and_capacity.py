"""Fast unit tests (no database, no network but the local Redis): the breaker's decision and window with an
injected clock, token buckets and in-flight caps (the quotas behind 429), and the retry back-off bounds."""

from __future__ import annotations

import itertools
import os

import pytest

from routing import breaker, capacity
from routing.gateway import backoff_s
from routing.snapshot import redis_client

_ids = itertools.count(900_000_000 + os.getpid() * 10_000)  # runs at once (CI beside a session) use other keys
T0 = 1_800_000_000.0


@pytest.fixture
def reach(settings):
    settings.REACH = {**settings.REACH, "BREAKER_WINDOW_S": 10, "BREAKER_MIN_REQUESTS": 20,
                      "BREAKER_FAILURE_RATE": 0.4, "BREAKER_OPEN_S": 30, "BACKOFF_BASE_S": 0.2,
                      # the rate rule alone (failures in a row have a test of their own)
                      "BREAKER_CONSECUTIVE_FAILURES": 10_000,
                      "BACKOFF_CAP_S": 5.0, "BACKOFF_JITTER_S": 0.2}
    return settings.REACH


@pytest.mark.parametrize(("total", "failed", "opens"), [
    (19, 19, False),  # below the minimum sample, however bad
    (20, 7, False),   # 35 %
    (20, 8, True),    # 40 %: the threshold itself opens
    (100, 39, False),
    (100, 100, True),
])
def test_the_breaker_opens_at_the_failure_rate_over_a_minimum_sample(reach, total, failed, opens):
    assert breaker.trips(total, failed) is opens


def test_failures_open_the_breaker_and_successes_do_not(reach):
    inst = next(_ids)
    for k in range(12):
        assert breaker.record(inst, True, now=T0 + k * 0.1) == breaker.CLOSED
    states = [breaker.record(inst, False, now=T0 + 2 + k * 0.1) for k in range(8)]  # 8 of 20 failed
    assert states[-1] == breaker.OPEN and set(states[:-1]) == {breaker.CLOSED}
    assert breaker.state(inst) == breaker.OPEN and not breaker.allow(inst)
    assert breaker.open_instances([inst, next(_ids)]) == {inst}


def test_the_resolver_reads_open_breakers_and_calls_in_flight_together(reach):
    """One round trip for a resolve's candidates: which breakers are open and how many calls each instance holds
    (the counts ``capacity.acquire`` keeps for ``instance:<id>``)."""
    tripped, busy, idle = next(_ids), next(_ids), next(_ids)
    for k in range(20):
        breaker.record(tripped, False, now=T0 + k * 0.1)
    assert capacity.acquire(f"instance:{busy}", cap=5) and capacity.acquire(f"instance:{busy}", cap=5)
    assert capacity.acquire(f"instance:{tripped}", cap=5)
    assert breaker.open_instances_and_loads([tripped, busy, idle]) == ({tripped}, {tripped: 1, busy: 2, idle: 0})
    assert breaker.open_instances_and_loads([]) == (set(), {})


def test_outcomes_older_than_the_window_do_not_count(reach):
    inst = next(_ids)
    for _ in range(19):
        breaker.record(inst, False, now=T0)
    # eleven seconds later the old failures have left the 10 s window: one more failure is a sample of one
    assert breaker.record(inst, False, now=T0 + 11) == breaker.CLOSED
    assert breaker.state(inst) == breaker.CLOSED


def test_half_open_lets_one_probe_through_whose_result_decides(reach):
    r = redis_client()
    inst = next(_ids)
    for _ in range(20):
        breaker.record(inst, False, now=T0)
    open_key = breaker._keys(inst)[0]
    r.delete(open_key)  # the open period's TTL has run out
    assert breaker.state(inst) == breaker.HALF_OPEN
    assert breaker.allow(inst) and not breaker.allow(inst)  # one probe at a time
    assert breaker.record(inst, False, now=T0 + 40) == breaker.OPEN  # the probe failed: open again
    assert 0 < r.ttl(open_key) <= 30
    r.delete(open_key)
    assert breaker.allow(inst)
    assert breaker.record(inst, True, now=T0 + 80) == breaker.CLOSED  # the probe succeeded: closed, counts gone
    assert breaker.state(inst) == breaker.CLOSED and breaker.allow(inst)


def test_failures_in_a_row_open_the_breaker_whatever_the_volume(reach, settings):
    """An instance called a few times a second never holds BREAKER_MIN_REQUESTS calls in a window: five failures
    in a row open its breaker all the same, by the sync rules (``breaker.record``) and by the gateway's
    (``admission.settle``, in Lua) alike; a success in between starts the count again."""
    from routing import admission
    from tests.helpers import run_async

    settings.REACH = {**settings.REACH, "BREAKER_CONSECUTIVE_FAILURES": 5}
    inst = next(_ids)
    assert [breaker.record(inst, False, now=T0 + k * 0.1) for k in range(4)] == [breaker.CLOSED] * 4
    assert breaker.record(inst, True, now=T0 + 0.5) == breaker.CLOSED  # a success: the row starts again
    states = [breaker.record(inst, False, now=T0 + 0.6 + k * 0.1) for k in range(5)]
    assert states == [breaker.CLOSED] * 4 + [breaker.OPEN]  # 9 calls in the window, far below the 20 of the rate
    assert breaker.state(inst) == breaker.OPEN

    instance = _instance(next(_ids))
    settle = [run_async(admission.settle(instance, 1, ok=False, latency_ms=None)) for _ in range(4)]
    assert settle == ["closed"] * 4
    assert run_async(admission.settle(instance, 1, ok=True, latency_ms=30.0)) == "closed"
    settle = [run_async(admission.settle(instance, 1, ok=False, latency_ms=None)) for _ in range(5)]
    assert settle == ["closed"] * 4 + ["open"] and breaker.state(instance.id) == breaker.OPEN
    # the probe after the open period closes it, and the row is counted afresh from there
    redis_client().delete(breaker._keys(instance.id)[0])
    assert run_async(admission.admit(instance))[0]
    assert run_async(admission.settle(instance, 1, ok=True, latency_ms=30.0)) == "closed"
    assert run_async(admission.settle(instance, 1, ok=False, latency_ms=None)) == "closed"


def test_a_token_bucket_refuses_past_its_burst_and_refills_with_time():
    key = f"unit:{next(_ids)}"
    assert capacity.take_token(key, rate=2, burst=2, now=T0) == 0
    assert capacity.take_token(key, rate=2, burst=2, now=T0) == 0
    wait = capacity.take_token(key, rate=2, burst=2, now=T0)
    assert wait == pytest.approx(0.5)  # the next token in half a second: the Retry-After
    assert capacity.take_token(key, rate=2, burst=2, now=T0 + 0.25) > 0
    assert capacity.take_token(key, rate=2, burst=2, now=T0 + 1.0) == 0
    # a long pause refills to the burst, not beyond
    assert [capacity.take_token(key, rate=2, burst=2, now=T0 + 60) for _ in range(3)][-1] > 0


def test_in_flight_cap_refuses_at_the_cap_until_a_slot_is_released():
    key = f"unit:{next(_ids)}"
    assert [capacity.acquire(key, cap=2) for _ in range(3)] == [True, True, False]
    assert capacity.in_flight([key]) == [2]
    capacity.release(key)
    assert capacity.acquire(key, cap=2)
    for _ in range(5):  # more releases than acquisitions never go below zero
        capacity.release(key)
    assert capacity.in_flight([key]) == [0]


@pytest.mark.parametrize("attempt", range(6))
def test_backoff_doubles_up_to_the_cap_plus_jitter(reach, attempt):
    base = min(5.0, 0.2 * 2 ** attempt)
    samples = [backoff_s(attempt) for _ in range(200)]
    assert all(base <= s <= base + 0.2 for s in samples)
    assert max(samples) - min(samples) > 0.05  # jittered, not fixed


def test_the_callers_admission_reads_the_open_breakers_it_is_asked_about(reach, settings):
    """The sync invoke naming its capability reads its instances' breakers in the caller's admission round trip
    (no round trip of its own): the answer must be the breaker's own state, open or half-open alike."""
    from routing import admission
    from tests.helpers import run_async

    settings.REACH = {**settings.REACH, "CALLER_MAX_CONCURRENCY": 1, "CALLER_MAX_QPS": 1000}
    tripped, healthy, caller = next(_ids), next(_ids), f"unit-{next(_ids)}"
    for _ in range(20):
        breaker.record(tripped, False)
    assert breaker.state(tripped) == breaker.OPEN
    admitted = run_async(admission.caller_acquire(caller, instance_ids=[tripped, healthy]))
    assert admitted.refused == "" and admitted.open_instances == {tripped} and admitted.generation is not None
    # a second request while the first holds the caller's only slot: refused, and no breaker answer to act on
    refused = run_async(admission.caller_acquire(caller, instance_ids=[tripped]))
    assert refused.refused == "concurrency" and refused.open_instances is None
    run_async(admission.caller_release(caller))
    redis_client().delete(breaker._keys(tripped)[0])  # the open period is over: half-open lets a probe through
    assert run_async(admission.caller_acquire(caller, instance_ids=[tripped, healthy])).open_instances == set()
    assert run_async(admission.caller_acquire(f"unit-{next(_ids)}")).open_instances is None  # none asked about
    run_async(admission.caller_release(caller))


def _instance(pk: int, *, max_concurrency: int = 2, max_qps: float = 1000.0):
    from routing.snapshot import InstanceInfo

    return InstanceInfo(id=pk, instance_id=f"unit-{pk}", url="http://127.0.0.1:9/", transport="http", status_url="",
                        weight=1, max_concurrency=max_concurrency, max_qps=max_qps, liveness="online")


def test_the_callers_admission_takes_the_first_instance_that_admits_the_call(reach, settings):
    """A request naming its capability is admitted to its instance in the caller's round trip, by ``admit``'s
    rules: an open breaker, a half-open one (left to its probe), a full instance and an empty bucket are passed
    over; a refused caller takes no instance slot; the slot taken is counted where ``admit`` counts it."""
    from routing import admission
    from tests.helpers import run_async

    settings.REACH = {**settings.REACH, "CALLER_MAX_CONCURRENCY": 1, "CALLER_MAX_QPS": 1000}
    opened, half_open, full, drained, free = (_instance(next(_ids)) for _ in range(5))
    full = _instance(full.id, max_concurrency=1)
    drained = _instance(drained.id, max_qps=0.001)
    for _ in range(20):
        breaker.record(opened.id, False)
        breaker.record(half_open.id, False)
    redis_client().delete(breaker._keys(half_open.id)[0])  # past its open period: half-open
    assert run_async(admission.admit(full))[0] and run_async(admission.admit(drained))[0]  # full; bucket empty
    caller = f"unit-{next(_ids)}"
    order = [opened, half_open, full, drained, free]
    admitted = run_async(admission.caller_acquire(caller, instance_ids=[i.id for i in order], admit=order))
    assert admitted.refused == "" and admitted.instance == free and admitted.open_instances == {opened.id}
    assert capacity.in_flight([f"instance:{i.id}" for i in order]) == [0, 0, 1, 1, 1]
    # the caller's only slot is held: refused, and no instance slot taken either
    refused = run_async(admission.caller_acquire(caller, admit=[free]))
    assert refused.refused == "concurrency" and refused.instance is None
    assert capacity.in_flight([f"instance:{free.id}"]) == [1]
    # an admission that did not go to its instance gives the slot back with the caller's
    run_async(admission.caller_release(caller, after=_release_of(free)))
    assert capacity.in_flight([f"instance:{free.id}"]) == [0]
    second = run_async(admission.caller_acquire(caller, admit=[full, free]))
    assert second.instance == free and second.open_instances is None
    run_async(admission.caller_release(caller, after=_release_of(free)))


def _release_of(instance):
    from functools import partial

    from routing import admission
    from routing.transitions import Deferred

    after = Deferred()
    after.later(partial(admission.release_instance_into, instance=instance))
    return after


def test_concurrent_requests_commands_share_round_trips_and_keep_their_own_replies():
    """The loop's Redis commands go together (``engine.redis_pipelined``): each request gets the replies of its
    own commands, in its order; one request's failing command (a wrong type, a bad argument) fails neither the
    other requests' commands nor its own others."""
    import asyncio

    from reach_platform import engine
    from tests.helpers import run_async

    base = f"reach:test:pipelined:{next(_ids)}"

    async def one(k: int):
        def add(pipe):
            pipe.incrby(f"{base}:n", k)
            pipe.set(f"{base}:{k}", k)
            pipe.get(f"{base}:{k}")
            if k % 10 == 0:
                pipe.incr(f"{base}:text")  # fails: the key holds text
        return await engine.redis_pipelined(add)

    async def many():
        await engine.redis().set(f"{base}:text", "words")
        return await asyncio.gather(*(one(k) for k in range(1, 101)))

    replies = run_async(many())
    for k, reply in enumerate(replies, start=1):
        assert reply[1] is True and reply[2] == str(k).encode()
        assert len(reply) == (4 if k % 10 == 0 else 3)
        if k % 10 == 0:
            assert isinstance(reply[3], Exception)
    assert sorted(int(r[0]) for r in replies)[-1] == sum(range(1, 101))  # every increment went through once
    redis_client().delete(f"{base}:n", f"{base}:text", *[f"{base}:{k}" for k in range(1, 101)])


def test_the_pipelined_link_answers_as_redis_pys_pipeline_and_reconnects_after_a_lost_connection():
    """The pipeliner's own connection (``engine._RespLink``) hands every command the reply redis-py's pipeline
    gives (types through the client's callbacks, error replies as redis-py's exceptions, nested ones too, a
    missing script as NoScriptError); an idle connection the server dropped is replaced before the next batch;
    a connection that breaks under a batch fails that batch, and the next batch opens a new one."""
    import asyncio

    from redis.exceptions import NoScriptError, ResponseError

    from reach_platform import engine
    from tests.helpers import run_async

    base = f"reach:test:link:{next(_ids)}"

    def add(pipe):
        pipe.hset(f"{base}:h", mapping={"a": 1, "b": "x"})
        pipe.hgetall(f"{base}:h")
        pipe.incrbyfloat(f"{base}:f", 0.25)
        pipe.expire(f"{base}:f", 60)
        pipe.exists(f"{base}:none")
        pipe.eval("return {1, 'two', redis.pcall('INCR', KEYS[1]), false}", 1, f"{base}:h")
        pipe.evalsha("0" * 40, 0)
        pipe.incr(f"{base}:h")
        pipe.eval("redis.setresp(3); return false", 0)  # a top-level RESP3 false is a reply, not "more bytes"
        pipe.ping()

    async def scenario():
        client = engine.redis()
        reference = client.pipeline(transaction=False)
        add(reference)
        expected = await reference.execute(raise_on_error=False)
        await client.delete(f"{base}:h", f"{base}:f")
        got = await engine.redis_pipelined(add)
        # the server drops the link's idle connection: the next batch goes over a new one
        (link_id,) = await engine.redis_pipelined(lambda pipe: pipe.client_id())
        await client.execute_command("CLIENT", "KILL", "ID", link_id)
        await asyncio.sleep(0.1)  # the close reaches the link's socket
        after_kill = await engine.redis_pipelined(lambda pipe: (pipe.ping(), pipe.client_id()))
        # a connection that breaks during a batch fails that batch only: the next one reconnects
        link = engine._clients_here().pipeliner.link
        link.streams[1].transport.abort()  # broken under the batch, which finds out on its read
        link.streams[1].is_closing = lambda: False  # as if the break came after the batch was written
        link.streams[0].at_eof = lambda: False
        lost = None
        try:
            await engine.redis_pipelined(lambda pipe: pipe.ping())
        except Exception as exc:
            lost = exc
        (last_id,) = await engine.redis_pipelined(lambda pipe: pipe.client_id())
        return expected, got, lost, link_id, after_kill, last_id

    expected, got, lost, link_id, after_kill, last_id = run_async(scenario())

    def shape(reply):
        if isinstance(reply, Exception):
            return type(reply).__name__
        if isinstance(reply, list):
            return [shape(item) for item in reply]
        return reply

    assert len(got) == len(expected) == 10
    assert got[8] is False and got[9] is True
    assert [shape(r) for r in got] == [shape(r) for r in expected]
    assert got[1] == {b"a": b"1", b"b": b"x"} and got[2] == 0.25 and got[3] is True and got[4] == 0
    assert isinstance(got[5][2], ResponseError) and isinstance(got[6], NoScriptError)
    assert isinstance(got[7], ResponseError)
    assert after_kill[0] is True and after_kill[1] != link_id  # a new connection, no error
    assert lost is not None and "connection" in type(lost).__name__.lower()
    assert last_id not in (link_id, after_kill[1])
    redis_client().delete(f"{base}:h", f"{base}:f")


def test_the_pipelined_link_times_out_as_redis_py_did_and_refuses_a_failed_login():
    """A server that never answers fails the batch after redis-py's socket timeout (the link then holds no
    connection), and a refused login fails it with redis-py's AuthenticationError instead of going on as the
    default user."""
    import asyncio
    import socket

    from redis.exceptions import AuthenticationError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from reach_platform import engine
    from tests.helpers import run_async

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # accepts (the kernel does) and never answers
    try:
        link = engine._RespLink.for_url(f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        link.TIMEOUT_S = 0.3

        async def ask(link):
            try:
                await link.exchange([("PING",)])
            except Exception as exc:
                return exc
            return None

        timed_out = run_async(asyncio.wait_for(ask(link), 10))
        assert isinstance(timed_out, RedisTimeoutError) and link.streams is None
    finally:
        silent.close()
    refused = run_async(ask(engine._RespLink.for_url("redis://nosuchuser-reach:wrong@127.0.0.1:6379/0")))
    assert isinstance(refused, AuthenticationError)


def test_concurrent_requests_items_go_in_batches_and_a_failed_batch_fails_only_its_own():
    """``engine.batched`` hands the items that come while a batch is out to one call as the next batch (callback
    receipts: one UPDATE for many deliveries); a batch whose call fails fails its own items only."""
    import asyncio

    from reach_platform import engine
    from tests.helpers import run_async

    calls: list[list[int]] = []
    name = f"test-batched-{next(_ids)}"

    async def run(items: list[int]) -> None:
        calls.append(items)
        await asyncio.sleep(0.01)
        if -1 in items:  # a poisoned batch
            raise ValueError("refused")

    async def one(k: int):
        try:
            await engine.batched(name, run, k)
        except ValueError:
            return k
        return None

    async def many():
        first = [asyncio.ensure_future(one(k)) for k in range(50)]
        await asyncio.sleep(0.002)  # the first 50 are out
        return await asyncio.gather(*first, *(one(k) for k in range(50, 100)))

    failed = [k for k in run_async(many()) if k is not None]
    assert calls == [list(range(50)), list(range(50, 100))]  # those that came while a batch was out: the next
    assert failed == []
    calls.clear()

    async def more():
        first = [asyncio.ensure_future(one(k)) for k in range(10)]
        await asyncio.sleep(0.002)
        return await asyncio.gather(*first, *(one(k) for k in [-1, *range(10, 20)]))

    failed = [k for k in run_async(more()) if k is not None]
    assert calls == [list(range(10)), [-1, *range(10, 20)]]
    assert failed == [-1, *range(10, 20)]  # the poisoned batch failed, the one before it did not
