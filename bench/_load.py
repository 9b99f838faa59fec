"""A lean asyncio HTTP/1.1 load generator for the benchmarks: N keep-alive connections, each sending one request
after another for a fixed time. It costs a small fraction of a millisecond of CPU per request (httpx costs
about one), which matters on 2 cores shared with the gateway under test."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlparse


@dataclass
class LoadResult:
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0  # connection errors and non-2xx answers

    @property
    def ok(self) -> int:
        return len(self.latencies_ms)

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        values = sorted(self.latencies_ms)
        return values[min(len(values) - 1, int(q * (len(values) - 1)))] if values else float("nan")


async def _request(reader, writer, head: bytes, body: bytes) -> tuple[int, bytes]:
    writer.write(head + body)
    line = await reader.readline()
    if not line:
        raise ConnectionError("closed")
    status = int(line.split()[1])
    length, close = 0, False
    while True:
        header = await reader.readline()
        if header in (b"\r\n", b""):
            break
        name, _, value = header.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            close = True
    data = await reader.readexactly(length) if length else b""
    if close:
        writer.close()
        raise _Closed(status, data)
    return status, data


class _Closed(Exception):
    def __init__(self, status: int, data: bytes):
        super().__init__("connection closed by server")
        self.status, self.data = status, data


async def run_load(url: str, body_for: Callable[[], dict], *, concurrency: int, seconds: float,
                   headers: dict | None = None, ok_statuses=(200,), timeout: float = 60.0,
                   count: int | None = None) -> LoadResult:
    """``concurrency`` connections POST ``body_for()`` to ``url`` for ``seconds`` (or until ``count`` requests
    were sent)."""
    parts = urlparse(url)
    host, port, path = parts.hostname, parts.port or 80, parts.path or "/"
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    result = LoadResult(seconds=seconds)
    stop_at = time.perf_counter() + seconds
    sent = [0]

    async def one_connection():
        reader = writer = None
        while time.perf_counter() < stop_at and (count is None or sent[0] < count):
            sent[0] += 1
            try:
                if writer is None:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
                body = json.dumps(body_for()).encode()
                head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n{extra}\r\n").encode()
                t0 = time.perf_counter()
                try:
                    status, _ = await asyncio.wait_for(_request(reader, writer, head, body), timeout)
                except _Closed as closed:
                    status, writer = closed.status, None
                elapsed = (time.perf_counter() - t0) * 1000
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status in ok_statuses:
                    result.latencies_ms.append(elapsed)
                else:
                    result.errors += 1
            except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                result.errors += 1
                if writer is not None:
                    writer.close()
                writer = None
                await asyncio.sleep(0.05)
        if writer is not None:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one_connection() for _ in range(concurrency)))
    result.seconds = time.perf_counter() - t0
    return result


def load(url: str, body_for, **kwargs) -> LoadResult:
    try:
        import uvloop

        return uvloop.run(run_load(url, body_for, **kwargs))
    except ImportError:
        return asyncio.run(run_load(url, body_for, **kwargs))


def http_sink(on_body: Callable[[bytes], None] | None = None):
    """A minimal asyncio HTTP/1.1 server connection handler (for ``asyncio.start_server``): answers every request
    200 with an empty body, keeping the connection open, and hands each request body to ``on_body`` (the callers'
    callback endpoint of the async benchmarks)."""

    async def handle(reader, writer):
        try:
            while await reader.readline():
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if on_body is not None:
                    on_body(body)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        # CancelledError: the sink closed at the end of a run with callers' connections open, and the handler ends
        # there (on Python 3.11 asyncio's stream callback logged the cancelled task's error otherwise)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    return handle
