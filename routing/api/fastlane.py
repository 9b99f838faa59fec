"""``POST /api/v1/invoke`` with a caller token, served on the event loop without Django's request cycle.

Django under ASGI runs each sync middleware and every sync view in one thread per process, so an invoke that
waits seconds on an agent would hold that thread for all requests of the process. This lane answers the same
request with the same validation (``InvokeInput``), the same services and the same JSON as ``InvokeView``
(which still serves session-authenticated callers), awaiting the agent call. A test holds the two equal.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from decimal import Decimal

from django.utils.datastructures import CaseInsensitiveMapping
from rest_framework.exceptions import ValidationError

from reach_platform import engine, jsonsafe
from reach_platform.authentication import TOKEN_CACHE_SECONDS
from reach_platform.errors import ApplicationError, error_body
from reach_platform.middleware import log_unhandled
from routing.api.headers import invoke_headers
from routing.api.serializers import REQUEST_ID, InvokeInput, task_output
from routing.api.views import HTTP_STATUS
from routing.choices import TERMINAL
from routing.invoke import invoke

logger = logging.getLogger(__name__)
PATH = "/api/v1/invoke"
_users: dict[str, tuple[float, object]] = {}
# the lookups in flight, by (loop, token): the callers that miss the cache together (a burst of new connections
# from one caller, or every request in flight when the entry expires) share one query instead of each queueing
# its own for the database threads
_lookups: dict[tuple[int, str], asyncio.Future] = {}


def wants(scope) -> bool:
    """Whether this lane serves the request: an invoke with a caller token (other credentials go to Django)."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
        return False
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value[:6].lower() == b"token "
    return False


def _token_user(key: str):
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return None
    return token.user


async def _caller(key: str):
    hit = _users.get(key)
    now = time.monotonic()
    if hit is not None and now - hit[0] < TOKEN_CACHE_SECONDS:
        return hit[1]
    slot = (id(asyncio.get_running_loop()), key)
    lookup = _lookups.get(slot)
    if lookup is None:
        lookup = _lookups[slot] = asyncio.ensure_future(_look_up(key, now))
        lookup.add_done_callback(lambda _done: _lookups.pop(slot, None))
    return await asyncio.shield(lookup)  # one caller's disconnect does not cancel the others' lookup


async def _look_up(key: str, now: float):
    user = await engine.db(_token_user, key)
    if user is not None:
        if len(_users) > 10000:
            _users.clear()
        _users[key] = (now, user)
    return user


_forms = threading.local()

# The common shapes of an invoke body, checked without DRF (its field machinery took about 6 % of a gateway
# process's CPU under load): each key's value exactly as ``InvokeInput`` would return it (a string already
# stripped, within its length; a whole number in range; an object payload). Anything else -- another key, another
# type, a value DRF would strip, convert or refuse -- goes to ``InvokeInput``, which also writes the errors. A
# test holds the two equal on generated bodies.
_TEXT = {"capability": (1, 120), "task": (1, 4000), "action": (1, 40), "confirm": (1, 120), "user_key": (0, 200),
         "request_id": (1, 100)}
_REQUEST_ID = re.compile(REQUEST_ID)
_DEFAULTS = (("payload", dict), ("mode", lambda: "sync"), ("callback_url", str), ("user_key", str),
             ("cost_preference", float))


def _encodable(text: str) -> bool:
    """No lone surrogate (which DRF's text fields refuse)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _plain(data: dict) -> dict | None:
    """``data`` validated when it is one of the common shapes, else None (``InvokeInput`` decides)."""
    out = {}
    for key, value in data.items():
        bounds = _TEXT.get(key)
        if bounds is not None:
            if (type(value) is not str or not bounds[0] <= len(value) <= bounds[1] or value != value.strip()
                    or "\x00" in value or not (value.isascii() or _encodable(value))  # DRF's two prohibitions
                    or (key == "request_id" and not _REQUEST_ID.search(value))):
                return None
        elif key == "payload":
            if type(value) is not dict:
                return None
        elif key == "mode":
            if value not in ("sync", "async") or type(value) is not str:
                return None
        elif key == "top_k":
            if type(value) is not int or not 1 <= value <= 20:
                return None
        else:
            return None
        out[key] = value
    if not out.get("task") and not out.get("capability"):
        return None
    for key, default in _DEFAULTS:
        if key not in out:
            out[key] = default()
    return out


def validated(data: dict) -> tuple[dict | None, dict | None]:
    """``InvokeInput``'s validation: the common shapes directly (``_plain``), the rest with one serializer kept
    per thread and reset for each request (DRF deep-copies a serializer's declared fields for every new instance,
    which cost half a millisecond of each invoke). Returns (validated fields, None) or (None, errors)."""
    plain = _plain(data)
    if plain is not None:
        return plain, None
    form = getattr(_forms, "invoke", None)
    if form is None:
        form = _forms.invoke = InvokeInput(data=data)
    else:
        for attr in ("_validated_data", "_errors", "_data"):  # what is_valid() and .data cache
            form.__dict__.pop(attr, None)
        form.initial_data = data
    if form.is_valid():
        return dict(form.validated_data), None
    return None, dict(form.errors)


def _default(value):
    if isinstance(value, Decimal):
        return float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


async def _respond(send, status: int, body, headers: dict | None = None) -> None:
    raw = jsonsafe.dumps(body, default=_default)
    out = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    out += [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": raw})


async def _read_body(receive, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"\x00too-large"
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def serve(scope, receive, send) -> None:
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
    raw = await _read_body(receive, jsonsafe.max_body_bytes())
    if raw is None:
        return
    if raw == b"\x00too-large":
        return await _respond(send, 413, error_body(jsonsafe.PayloadTooLarge.code,
                                               "The request body is over the size limit."))
    async with engine.gate():  # the request's CPU-bound steps, first come first served (invoke leaves it early)
        await _serve(headers, raw, send)


async def _serve(headers: dict, raw: bytes, send) -> None:
    caller = await _caller(headers["authorization"].split(None, 1)[1].strip() if " " in headers["authorization"]
                           else "")
    if caller is None:
        return await _respond(send, 401, error_body("authentication_failed", "Invalid token."),
                              {"WWW-Authenticate": "Token"})
    try:
        data = jsonsafe.parse_json(raw or b"{}")
        fields, errors = validated(data if isinstance(data, dict) else {"payload": data})
        if fields is None:
            return await _respond(send, 400, error_body("invalid", "The request body is not valid.", errors))
        task = await invoke(caller=caller, headers=invoke_headers(CaseInsensitiveMapping(headers)), **fields)
    except ValidationError as exc:
        return await _respond(send, 400, error_body("invalid", "The request body is not valid.", exc.detail))
    except ApplicationError as exc:
        return await _respond(send, exc.status_code, error_body(exc.code, exc.message, exc.details), exc.headers)
    except Exception as exc:
        log_unhandled(exc, path=PATH, method="POST")
        return await _respond(send, 500, error_body("server_error", "Internal error; it has been logged."))
    status = 202 if task.mode == "async" and task.status not in TERMINAL else HTTP_STATUS.get(task.status, 200)
    await _respond(send, status, task_output(task))
