"""The event loop that every agent call, wait and callback delivery of a process runs on.

An in-flight call costs a coroutine on this loop, not a thread or a process. In the ASGI server the loop is the
server's own (``bind`` at start-up); elsewhere (a Celery worker, a management command, the test client) a
daemon thread runs one, started on first use. Sync code hands coroutines to it with ``run`` (and waits) or
``spawn`` (and does not).

Database work never runs on the loop: Django's ORM is synchronous, and its async methods funnel every query
of a process through one thread. ``db`` runs a sync function in a bounded pool of threads instead, each with
its own persistent connection, so that the few statements of an invoke run concurrently across requests.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import functools
import heapq
import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

_loop: asyncio.AbstractEventLoop | None = None
# Set while a coroutine runs for sync code inside a transaction (``run_in_caller_thread``): its database work
# then runs in that caller's thread, on the caller's connection and transaction.
_caller_thread: contextvars.ContextVar[bool] = contextvars.ContextVar("reach_caller_thread", default=False)
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_background: set[asyncio.Task] = set()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio works the same
        return asyncio.new_event_loop()


def bind(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` (the ASGI server's) the engine loop of this process."""
    global _loop
    _loop = loop


def loop() -> asyncio.AbstractEventLoop:
    """The engine loop, started in a daemon thread when no server bound one."""
    global _loop
    current = _loop
    if current is not None and not current.is_closed():
        return current
    with _lock:
        if _loop is None or _loop.is_closed():
            new = _new_loop()
            started = threading.Event()

            def serve():
                asyncio.set_event_loop(new)
                new.call_soon(started.set)
                new.run_forever()

            threading.Thread(target=serve, name="reach-engine", daemon=True).start()
            started.wait()
            _loop = new
        return _loop


def has_loop() -> bool:
    """Whether this process runs an engine loop already (a server's, or a started daemon thread's)."""
    return _loop is not None and not _loop.is_closed() and _loop.is_running()


def on_loop() -> bool:
    """Whether the caller runs on the engine loop (where blocking is forbidden)."""
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False


def run(coro, timeout: float | None = None):
    """Run ``coro`` on the engine loop from sync code and return its result."""
    if on_loop():
        coro.close()
        raise RuntimeError("engine.run() called on the engine loop; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, loop()).result(timeout)


def run_in_caller_thread(make_coro):
    """Run the coroutine ``make_coro()`` for sync code that holds a transaction (a test's, or a caller's
    ``atomic`` block): on a loop of its own (asgiref's ``async_to_sync``), with every ``db`` call run back in
    this thread (``thread_sensitive``), so the work sees and joins the caller's transaction. Slower than ``run``
    (a loop and clients per call); the serving paths never take it."""
    from asgiref.sync import async_to_sync

    async def main():
        token = _caller_thread.set(True)
        try:
            return await make_coro()
        finally:
            _caller_thread.reset(token)
            await _close_clients_here()

    return async_to_sync(main)()


async def close_clients() -> None:
    """Close the shared clients of the running loop (the server's shutdown)."""
    await _close_clients_here()


def _close_at_exit() -> None:
    """At exit, close the daemon loop's aiohttp session and connection pool while the loop still runs (either
    would complain as it is collected); Redis stays open for the watchers that still listen."""
    target = _loop
    if target is None or not target.is_running() or on_loop():
        return
    entry = _clients.get(id(target))
    if entry is None:
        return
    try:
        asyncio.run_coroutine_threadsafe(entry.close_late_opened(), target).result(2)
    except Exception:  # exiting anyway
        pass


atexit.register(_close_at_exit)


async def _close_clients_here() -> None:
    entry = _clients.pop(id(asyncio.get_running_loop()), None)
    if entry is not None:
        await entry.http.aclose()
        await entry.redis.aclose(close_connection_pool=True)
        await entry.close_late_opened()


def spawn(coro) -> None:
    """Start ``coro`` on the engine loop without waiting for it (from any thread). Errors are logged."""
    target = loop()

    def start():
        task = target.create_task(coro)
        _background.add(task)
        task.add_done_callback(_done)

    if on_loop():
        start()
    else:
        target.call_soon_threadsafe(start)


def _done(task: asyncio.Task) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("background task failed", exc_info=task.exception())


def pending_background() -> int:
    return len(_background)


@dataclass
class _LoopClients:
    """The shared clients of one loop; the agent session and the database pool open on first use."""

    loop: asyncio.AbstractEventLoop
    http: Any  # _Shards of httpx.AsyncClient
    redis: Any  # redis.asyncio.Redis
    agent_session: Any = None  # aiohttp.ClientSession
    pg: asyncio.Task | None = None  # opens the psycopg AsyncConnectionPool (awaited by every user)
    gate: _Gate | None = None  # the invoke gate's slots (``gate``)
    pipeliner: Any = None  # _Pipeliner over ``redis``
    batchers: dict = field(default_factory=dict)  # ``batched``: a _Batcher per name

    async def close_late_opened(self) -> None:
        if self.pipeliner is not None and self.pipeliner.link is not None:
            self.pipeliner.link.close()
        if self.agent_session is not None:
            await self.agent_session.close()
        if self.pg is not None:
            await (await self.pg).close()


_clients: dict[int, _LoopClients] = {}


def _clients_here():
    running = asyncio.get_running_loop()
    entry = _clients.get(id(running))
    if entry is None or entry.loop is not running:
        import httpx
        import redis.asyncio as aioredis
        from django.conf import settings

        shards = max(1, int(settings.REACH["HTTP_POOL_SHARDS"]))
        per_shard = max(1, int(settings.REACH["HTTP_MAX_CONNECTIONS"]) // shards)
        limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        http_client = _Shards([httpx.AsyncClient(limits=limits, follow_redirects=False) for _ in range(shards)])
        pool = aioredis.BlockingConnectionPool.from_url(settings.REDIS_URL,
                                                        max_connections=int(settings.REACH["REDIS_CONNECTIONS"]),
                                                        timeout=10)
        entry = _LoopClients(running, http_client, aioredis.Redis(connection_pool=pool))
        _clients[id(running)] = entry
    return entry


class _Shards:
    """The loop's outbound clients. httpcore's connection pool scans every connection and every waiting request
    each time one starts or ends, so its cost per request grows with the calls in flight (with 256 calls to slow
    agents in flight, 37 % of the loop's time went there: bench/slow_agents.py under py-spy). Calls go to one of
    ``REACH_HTTP_POOL_SHARDS`` pools in turn, each holding a share of the connections."""

    def __init__(self, clients: list):
        self.clients = clients
        self.turn = itertools.cycle(clients)

    def next(self):
        return next(self.turn)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


# The invoke gate. A burst of N requests on one loop would otherwise share the CPU in turns: every request takes
# one step (parse, claim, admission, resolve) while the N-1 others take theirs, so all N reach their agents at the
# end of the burst, and their answers come back as the same burst one agent latency later. With at most
# REACH_INVOKE_GATE requests in those steps at once, the first of a burst reach their agents first, and the
# answers come back spread out. The slots go to the oldest request waiting (the time it entered the gate), and a
# request gives its slot back while it waits on PostgreSQL, Redis or a database thread (``off_gate``) and takes
# one again, ahead of younger requests, when that returns: a small gate keeps the CPU busy without letting a
# burst's requests step through in turns. The gate bounds CPU work only: a request leaves it before it waits on
# an agent or on another request (``leave_gate``), so the calls in flight are not bounded by it.
class _Gate:
    """``size`` slots handed to the oldest waiter first (asyncio's Semaphore serves them in arrival order)."""

    def __init__(self, size: int) -> None:
        self.free = size
        self.waiters: list[tuple[float, int, asyncio.Future]] = []
        self.order = itertools.count()

    async def acquire(self, age: float) -> None:
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiters, (age, next(self.order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed the slot as it was cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        while self.waiters:
            future = heapq.heappop(self.waiters)[2]
            if not future.done():  # a cancelled waiter's future is skipped
                future.set_result(None)
                return
        self.free += 1


class _Slot:
    """One request's place in the gate: held or not, and whether it has left for good."""

    __slots__ = ("gate", "age", "owner", "held", "left")

    def __init__(self, gate: _Gate, age: float) -> None:
        self.gate, self.age, self.owner = gate, age, asyncio.current_task()
        self.held = self.left = False

    def mine(self) -> bool:
        # a task started with a copy of the request's context (a shared token lookup, a shielded write) sees the
        # slot but does not own it: giving it away there would let the request run on without one
        return self.held and self.owner is asyncio.current_task()


_gate_slot: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("reach_gate_slot", default=None)


@contextlib.asynccontextmanager
async def gate():
    """Hold one of the loop's gate slots for the enclosed steps, or the slot this request holds already."""
    from django.conf import settings

    size = int(settings.REACH["INVOKE_GATE"])
    current = _gate_slot.get()
    if size <= 0 or (current is not None and not current.left):
        yield
        return
    clients = _clients_here()
    if clients.gate is None:
        clients.gate = _Gate(size)
    slot = _Slot(clients.gate, asyncio.get_running_loop().time())
    await slot.gate.acquire(slot.age)
    slot.held = True
    token = _gate_slot.set(slot)
    try:
        yield
    finally:
        leave_gate()  # unless the request left it already
        _gate_slot.reset(token)


def leave_gate() -> None:
    """Give the request's gate slot back for good (it is about to wait on an agent, or on another request)."""
    slot = _gate_slot.get()
    if slot is not None and slot.mine():
        slot.left, slot.held = True, False
        slot.gate.release()


async def off_gate(awaitable):
    """Await ``awaitable`` (a wait on PostgreSQL, Redis or a database thread) without the request's gate slot,
    then take one again, ahead of every younger request."""
    slot = _gate_slot.get()
    if slot is None or not slot.mine():
        return await awaitable
    slot.held = False
    slot.gate.release()
    try:
        return await awaitable
    finally:
        await slot.gate.acquire(slot.age)
        slot.held = True


def http():
    """One of the loop's shared ``httpx.AsyncClient`` pools, in turn (see ``_Shards``): use it for one call."""
    return _clients_here().http.next()


def redis():
    """The loop's shared ``redis.asyncio`` client (a bounded connection pool)."""
    return _clients_here().redis


class _Raised:
    """One item's own failure among a batch's results: its caller raises ``exc``; the other items' stand."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


class _Batcher:
    """Items of a loop's concurrent requests handed to one function together: an item goes at once when no batch
    is out; those that come while one is out go as the next batch. ``run`` (async, a list of items) returns each
    item's result in order (a ``_Raised`` for an item that failed on its own); when it raises, every item of that
    batch fails with it, and no other batch does."""

    def __init__(self, run) -> None:
        self.run = run
        self.queue: list[tuple[Any, asyncio.Future]] = []
        self.sender: asyncio.Task | None = None

    async def add(self, item):
        future = asyncio.get_running_loop().create_future()
        self.queue.append((item, future))
        if self.sender is None:
            self.sender = asyncio.get_running_loop().create_task(self._drain())
        return await off_gate(future)

    async def _drain(self) -> None:
        try:
            while self.queue:
                batch, self.queue = self.queue, []
                try:
                    results = await self.run([item for item, _ in batch])
                except Exception as exc:  # the batch's call itself (a connection): each of its items hears it
                    results = [_Raised(exc)] * len(batch)
                except BaseException:
                    for _, future in batch:
                        future.cancel()
                    raise
                for (_, future), result in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, _Raised):
                        future.set_exception(result.exc)
                    else:
                        future.set_result(result)
        finally:
            self.sender = None


class _Pipeliner(_Batcher):
    """The invoke path's Redis commands, of all of a loop's requests, sent together (auto-pipelining, as ioredis
    does it; redis-py has no such mode: redis/redis-py#3767). A command goes at once when nothing is on the
    wire; the commands that come while a batch is out queue and go as the next batch, one pipeline. Under load
    N requests' admissions cost one write, one read and one connection from the pool instead of N of each
    (the pool, the retry wrapper and the two system calls were most of the client's CPU per command:
    bench/gateway_overhead.py under py-spy); alone, a command waits for nothing. Each request gets its own
    commands' replies, errors included: one request's failing command does not fail another's."""

    def __init__(self, client) -> None:
        super().__init__(self._pipeline)
        self.client = client
        from django.conf import settings

        self.link = _RespLink.for_url(settings.REDIS_URL)

    async def send(self, add) -> list:
        """The replies of the commands that ``add(pipeline)`` puts on a pipeline (an error reply as its
        exception, in place); a connection failure raises."""
        return await self.add(add)

    async def _pipeline(self, adds: list) -> list:
        pipe = self.client.pipeline(transaction=False)
        spans: list[tuple[int, int] | _Raised] = []
        for add in adds:
            first = len(pipe)
            try:
                add(pipe)
            except Exception as exc:  # this request's own mistake: the others' commands still go
                del pipe.command_stack[first:]
                spans.append(_Raised(exc))
            else:
                spans.append((first, len(pipe)))
        if not len(pipe):
            replies = []
        elif self.link is not None and self.link.usable:
            try:
                replies = await self._exchange(self.link, pipe.command_stack)
            except Exception:
                if self.link.usable:
                    raise
                replies = await pipe.execute(raise_on_error=False)  # the server speaks no RESP3: redis-py's way
        else:
            replies = await pipe.execute(raise_on_error=False)
        return [span if isinstance(span, _Raised) else replies[span[0]:span[1]] for span in spans]

    async def _exchange(self, link: _RespLink, stack: list) -> list:
        """The batch's commands (as redis-py's pipeline collected them) over the link, their replies read as that
        pipeline reads them: an error reply as redis-py's exception for it (its parser's mapping, nested ones
        too), the others through the client's response callbacks (what a command returns does not change with
        the path)."""
        from redis.client import EMPTY_RESPONSE, NEVER_DECODE
        from redis.exceptions import ResponseError

        # a command name of several words ("CLIENT ID") goes as its words, as redis-py packs it
        raw = await link.exchange([(*args[0].split(), *args[1:]) if isinstance(args[0], str) and " " in args[0]
                                        else args for args, _ in stack])
        replies = []
        for (args, options), reply in zip(stack, raw, strict=True):
            if isinstance(reply, ResponseError):
                replies.append(options[EMPTY_RESPONSE] if EMPTY_RESPONSE in options else reply)
                continue
            if isinstance(reply, Exception):  # LOADING, NOAUTH...: redis-py's pipeline raised these for the batch
                raise reply
            callback = self.client.response_callbacks.get(args[0])
            if callback is not None:
                reply = callback(reply, **{k: v for k, v in options.items()
                                           if k not in ("keys", EMPTY_RESPONSE, NEVER_DECODE)})
            replies.append(reply)
        return replies


class _RespLink:
    """The connection that a loop's pipelined batches go over (one batch is out at a time: ``_Batcher``): the
    commands written as one buffer and the replies parsed by hiredis as they arrive. redis-py's pipeline spent
    about 40 us of CPU per command (its encoder per argument, a timeout scope and parser checks per reply): 185-230
    against 64-71 us for a batch of four EVALSHAs on this machine kind (one core). The same bytes go on the wire
    (hiredis packs as redis-py's serializer does). Only for ``redis://`` and ``unix://`` URLs; TLS or other
    options keep redis-py's pipeline (``for_url``), and so does a server that does not speak RESP3 (``usable``).
    A connection the server closed while it was idle is replaced before the batch is written; a failure during a
    batch (its reply later than redis-py's socket timeout, 5 s, included) drops the connection and fails that
    batch (its commands are not sent again: an admission script may have run), and the next batch opens a new
    one."""

    TIMEOUT_S = 5.0  # redis-py's default socket and connect timeouts, which its pipeline had here

    def __init__(self, params: dict) -> None:
        self.params = params
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.parser: Any = None
        self.usable = True

    @classmethod
    def for_url(cls, url: str) -> _RespLink | None:
        from redis.connection import parse_url

        if not url.startswith(("redis://", "unix://")):
            return None
        params = parse_url(url)
        if set(params) - {"host", "port", "db", "username", "password", "path", "connection_class"}:
            return None
        return cls(params)

    async def _open(self) -> None:
        import hiredis
        from redis._parsers.base import BaseParser
        from redis.exceptions import InvalidResponse, ResponseError

        if self.params.get("path"):
            reader, writer = await asyncio.open_unix_connection(self.params["path"])
        else:
            reader, writer = await asyncio.open_connection(self.params.get("host") or "localhost",
                                                           int(self.params.get("port") or 6379))
        # as redis-py's hiredis parser reads: its error mapping, its protocol error, and a sentinel for "more
        # bytes needed" (a RESP3 false reply is False)
        self.streams = (reader, writer)
        self.parser = hiredis.Reader(protocolError=InvalidResponse, replyError=BaseParser.parse_error,
                                     notEnoughData=_MORE)
        # RESP3, as redis-py speaks it by default: the replies have the types its pipeline would hand over
        username, password = self.params.get("username"), self.params.get("password")
        auth = ("AUTH", username or "default", password or "") if username or password else ()
        hello: list[tuple] = [("HELLO", 3, *auth)]
        if self.params.get("db"):
            hello.append(("SELECT", int(self.params["db"])))
        replies = await self._roundtrip(hello)
        for reply in replies:  # a refused login (AuthenticationError is not a ResponseError) included
            if isinstance(reply, Exception):
                if isinstance(reply, ResponseError) and "unknown command" in str(reply).lower():
                    self.usable = False  # no HELLO (Redis before 6, some proxies): redis-py's pipeline instead
                raise reply
        if not isinstance(replies[0], dict) or replies[0].get(b"proto") != 3:
            self.usable = False
            raise InvalidResponse("the server did not switch to RESP3")

    async def exchange(self, commands: list[tuple]) -> list:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        done = False
        if self.streams is not None and (self.streams[0].at_eof() or self.streams[1].is_closing()):
            self.close()  # the server closed it while idle (a restart, an idle timeout): open a new one first
        try:
            async with asyncio.timeout(self.TIMEOUT_S):
                if self.streams is None:
                    await self._open()
                replies = await self._roundtrip(commands)
            done = True
            return replies
        except TimeoutError as exc:
            raise RedisTimeoutError(f"Redis: no answer within {self.TIMEOUT_S:g} s") from exc
        except OSError as exc:
            raise RedisConnectionError(f"Redis: {exc}") from exc
        finally:
            if not done:
                self.close()

    async def _roundtrip(self, commands: list[tuple]) -> list:
        import hiredis

        reader, writer = self.streams  # type: ignore[misc]
        writer.write(b"".join([hiredis.pack_command(args) for args in commands]))
        replies: list = []
        parser = self.parser
        while len(replies) < len(commands):
            reply = parser.gets()
            if reply is _MORE:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionResetError("the connection closed")
                parser.feed(data)
                continue
            replies.append(reply)
        return replies

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
        self.streams, self.parser = None, None


_MORE = object()  # hiredis's "not enough data yet" (``_RespLink``)


async def batched(name: str, run, item) -> None:
    """Hand ``item`` to ``run`` (an async function of a list of items) with the items that this loop's other
    requests hand to the same ``name`` meanwhile (``_Batcher``); raises what ``run`` raised for its batch."""
    batchers = _clients_here().batchers
    if name not in batchers:
        async def each(items: list) -> list:
            await run(items)
            return [None] * len(items)

        batchers[name] = _Batcher(each)
    await batchers[name].add(item)


async def redis_pipelined(add) -> list:
    """Send the commands that ``add(pipeline)`` adds with the other requests' of this loop (``_Pipeliner``) and
    return their replies, an error reply as its exception object."""
    clients = _clients_here()
    if clients.pipeliner is None:
        clients.pipeliner = _Pipeliner(clients.redis)
    return await clients.pipeliner.send(add)


class CallTimeout(Exception):
    """No answer within the call's timeout."""


class ConnectFailed(Exception):
    """The call never reached the agent (refused, unreachable, connect timeout) or the connection broke."""


def _agent_session():
    entry = _clients_here()
    if entry.agent_session is None:
        import aiohttp
        from django.conf import settings

        connector = aiohttp.TCPConnector(limit=int(settings.REACH["HTTP_MAX_CONNECTIONS"]), limit_per_host=0,
                                         keepalive_timeout=30)
        # no cookie jar: what one agent sets must never travel with another caller's request
        entry.agent_session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                                    trust_env=False)
    return entry.agent_session


async def post_json(url: str, body: bytes, headers: dict[str, str], *, timeout: float,
                    connect_timeout: float, server_hostname: str | None = None) -> tuple[int, bytes]:
    """POST a JSON body to an agent and read its whole answer: (status, body). The agent calls of the invoke
    path use aiohttp's client rather than httpx: it costs a tenth of the CPU per call (0.1 against 1.9 ms, 16
    concurrent calls to a local server on the 2-core machine kind), which at hundreds of calls per second is
    most of a core. Redirects are not followed and nothing is retried (a POST may have
    run). ``server_hostname``: the name for TLS (SNI and the certificate check) when ``url`` names an address
    (``netguard.apost``). Raises ``CallTimeout`` or ``ConnectFailed``."""
    import aiohttp

    limits = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
    try:
        async with _agent_session().post(url, data=body, headers={"Content-Type": "application/json", **headers},
                                         timeout=limits, allow_redirects=False,
                                         server_hostname=server_hostname) as response:
            return response.status, await response.read()
    except aiohttp.ConnectionTimeoutError as exc:
        raise ConnectFailed("connect timeout") from exc
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise CallTimeout(f"no answer within {timeout:.1f}s") from exc
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise ConnectFailed(f"{type(exc).__name__}: {exc}"[:300]) from exc


def in_caller_thread() -> bool:
    """Whether database work must run in the waiting caller's thread and transaction (``run_in_caller_thread``)."""
    return _caller_thread.get()


async def pg():
    """The loop's own PostgreSQL connection pool (psycopg's ``AsyncConnectionPool``, ``REACH_DB_LOOP_CONNECTIONS``
    connections in autocommit, with Django's connection parameters): for the invoke path's few hand-written
    statements (``routing.rowsql.afetch``), awaited on the loop like the agent call, with no thread hop."""
    entry = _clients_here()
    if entry.pg is None:  # one opening, awaited by every first caller (a pool in use before it is open raises)
        entry.pg = asyncio.get_running_loop().create_task(_open_pg())
    return await entry.pg


# psycopg's prepare_threshold for connections that run hand-written prepared statements (routing.rowsql): Django
# connects with None, which disables prepared statements altogether -- psycopg then ignores execute(prepare=True),
# and every invoke had PostgreSQL parse and plan its two statements anew. This large threshold prepares what asks
# for it and never anything else automatically; None where REACH_DB_PREPARE is off (e.g. behind a pooler).
PREPARE_EXPLICIT_ONLY = 2**31 - 1


def prepare_threshold() -> int | None:
    from django.conf import settings

    return PREPARE_EXPLICIT_ONLY if settings.REACH["DB_PREPARE"] else None


async def _open_pg():
    from django.conf import settings
    from django.db import connection
    from psycopg_pool import AsyncConnectionPool

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params["prepare_threshold"] = prepare_threshold()
    pool = AsyncConnectionPool(kwargs={**params, "autocommit": True}, min_size=1,
                               max_size=max(1, int(settings.REACH["DB_LOOP_CONNECTIONS"])), open=False,
                               name="reach-loop")
    await pool.open(wait=False)
    return pool


async def warm_up() -> None:
    """Open, before the first request, what the first requests would otherwise open while they wait: the loop's
    Redis client, its agent session, its PostgreSQL pool at full size and every database thread with its
    connection. A node that starts (or restarts) under load otherwise answers its first burst of callers
    hundreds of milliseconds late (``bench/cold_start.py``). The pool keeps the connections above its minimum
    until they have been idle for its ``max_idle`` (10 minutes)."""
    from django.conf import settings
    from django.db import connection

    await _clients_here().redis.ping()
    _agent_session()  # imports aiohttp and builds its TLS contexts: 130 ms that would block the loop mid-burst
    pool = await pg()
    held = []
    try:  # holding them all makes the pool grow to its full size
        for _ in range(pool.max_size):
            held.append(await pool.getconn(timeout=10))
    finally:
        for conn in held:
            await pool.putconn(conn)
    threads = int(settings.REACH["DB_THREADS"])
    everyone = threading.Barrier(threads)

    def connect() -> None:  # each job holds its thread until all have one: one job per thread
        try:
            connection.ensure_connection()
        finally:
            everyone.wait(timeout=30)

    await asyncio.gather(*(db(connect) for _ in range(threads)))


def db_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _lock:
            if _pool is None:
                from django.conf import settings

                _pool = ThreadPoolExecutor(max_workers=int(settings.REACH["DB_THREADS"]),
                                           thread_name_prefix="reach-db")
    return _pool


def _db_job(fn, args, kwargs):
    import time

    from django.db import connection

    # Django checks this at each request's start and end; a pool thread does it per job, but only when there is
    # something to check (``close_if_unusable_or_obsolete`` would also make the next query run a health check).
    if connection.connection is not None and (connection.errors_occurred or (
            connection.close_at is not None and time.monotonic() >= connection.close_at)):
        connection.close_if_unusable_or_obsolete()
    return fn(*args, **kwargs)


async def db(fn, /, *args, **kwargs):
    """Run the sync function ``fn`` (ORM work, or anything that may block) in the database thread pool (or in
    the waiting caller's thread, under ``run_in_caller_thread``)."""
    if _caller_thread.get():
        from asgiref.sync import sync_to_async

        return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)
    ctx = contextvars.copy_context()
    return await off_gate(asyncio.get_running_loop().run_in_executor(
        db_pool(), functools.partial(ctx.run, _db_job, fn, args, kwargs)))


def _after_fork() -> None:
    """A forked child has neither the parent's loop thread nor its pool threads."""
    global _loop, _pool
    _loop, _pool = None, None
    _background.clear()
    _clients.clear()


os.register_at_fork(after_in_child=_after_fork)
