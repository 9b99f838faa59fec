"""The id of the HTTP request being served, for audit rows and log lines (set by RequestIdMiddleware)."""

from __future__ import annotations

import contextvars
import re
import uuid

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("reach_request_id", default="")
_VALID = re.compile(r"^[A-Za-z0-9._:@~+=-]{1,100}$")  # AuditLog.request_id holds 100


def current_request_id() -> str:
    return _request_id.get()


def request_id_from(header: str | None) -> str:
    """The caller's X-Request-Id when it is a sane token, else a fresh one."""
    return header if header and header.isascii() and _VALID.match(header) else uuid.uuid4().hex


def bind(request_id: str) -> contextvars.Token:
    return _request_id.set(request_id)


def unbind(token: contextvars.Token) -> None:
    _request_id.reset(token)
