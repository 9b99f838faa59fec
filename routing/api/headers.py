"""The headers a nested call carries, read and checked in one place: ASCII, within the lengths of the columns
they are stored in, well formed, or a 400 ``invalid_header`` (they are passed on to agents, and a value that
cannot be encoded or stored failed the task after it had been accepted)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from reach_platform.errors import InvalidInput
from routing.invoke import InvokeHeaders

MAX_HOPS = 32  # longer than any depth the gateway allows (MAX_DEPTH 5)
_ENDPOINT = re.compile(r"^[-a-zA-Z0-9_]{1,100}$")  # the agents' endpoint ids (SlugField, 100)
_TRACE_ID = re.compile(r"^[-A-Za-z0-9._:]{1,64}$")  # Task.trace_id
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")  # W3C Trace Context
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@~+=-]{1,100}$")  # Task.parent_request_id / request_id


def _refuse(name: str, why: str):
    raise InvalidInput(f"Header {name} {why}.", code="invalid_header")


def _text(headers: Mapping[str, str], name: str, pattern: re.Pattern, what: str) -> str:
    raw = headers.get(name)
    if raw is None or raw == "":
        return ""
    if not raw.isascii() or not pattern.match(raw):
        _refuse(name, f"must be {what}")
    return raw


def _integer(headers: Mapping[str, str], name: str, default: int | None, maximum: int) -> int | None:
    raw = headers.get(name)
    if raw is None or raw == "":
        return default
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
        _refuse(name, "must be a non-negative integer")
    return min(int(raw), maximum)


def invoke_headers(headers: Mapping[str, str]) -> InvokeHeaders:
    """X-Reach-Depth, X-Reach-Call-Path, X-Reach-Retry-Budget, X-Reach-Trace-Id, traceparent and
    X-Reach-Parent-Request-Id of an invoke request, checked."""
    path = headers.get("X-Reach-Call-Path") or ""
    hops = tuple(p for p in path.split(",") if p)
    if len(hops) > MAX_HOPS or not all(p.isascii() and _ENDPOINT.match(p) for p in hops):
        _refuse("X-Reach-Call-Path", f"must be up to {MAX_HOPS} comma-separated endpoint ids")
    return InvokeHeaders(
        depth=_integer(headers, "X-Reach-Depth", 0, 10_000) or 0,
        call_path=hops,
        retry_budget=_integer(headers, "X-Reach-Retry-Budget", None, 10_000),
        trace_id=_text(headers, "X-Reach-Trace-Id", _TRACE_ID, "1-64 characters of A-Z a-z 0-9 . _ : -"),
        traceparent=_text(headers, "traceparent", _TRACEPARENT, "a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"),
        parent_request_id=_text(headers, "X-Reach-Parent-Request-Id", _REQUEST_ID,
                                "1-100 characters of A-Z a-z 0-9 . _ : @ ~ + = -"),
    )
