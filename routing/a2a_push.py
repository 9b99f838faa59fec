"""A2A push notifications of the inbound door: the config methods' services, and the outbox rows of a change.

A config is the caller's, for one of the caller's A2A tasks (our request_id); its URL passes the same address
guard as a ``callback_url`` when it is stored and again when each notification is sent. Each committed change of
a task that came through the A2A door becomes one callback-outbox row per config (``push_enqueue``, called by the
state machine inside the transaction that moves the task), so a notification is signed, retried and
dead-lettered like a callback. The body is an A2A ``StreamResponse``: a ``statusUpdate`` for a change, the
whole ``task`` (with its artifacts) for a terminal state. The config's token goes in ``X-A2A-Notification-Token``
and its authentication in ``Authorization`` (A2A 4.3.3).
"""

from __future__ import annotations

import functools
import socket
import uuid

from django.db import IntegrityError, transaction
from django.utils import timezone

from reach_platform import netguard
from reach_platform.errors import InvalidInput
from routing.a2a_shapes import a2a_task
from routing.callbacks import check_callback_url, dispatch
from routing.choices import TERMINAL
from routing.models import A2APushConfig, CallbackDelivery, Task

MAX_CONFIGS = 10  # per task: a caller cannot make one change fan out without bound
MAX_PAGE = 100


class ConfigNotFound(LookupError):
    """No such config (or task) for this caller."""


def _text(value, name: str, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidInput(f"{name} must be a string of at most {limit} characters.")
    return value


def _resolves(host: str, port: int) -> bool:
    try:
        socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def _guard(url: str) -> None:
    """The address guard callbacks use (no internal targets). A host name that does not resolve (yet) is taken:
    every delivery resolves and checks it again, and is retried, then dead-lettered."""
    _, host, port = netguard.parse_url(url, what="url", code="callback_url_refused")
    try:
        check_callback_url(url)
    except InvalidInput:
        if host in netguard.METADATA_HOSTS or _resolves(host, port):
            raise


def config_as_a2a(row: A2APushConfig) -> dict:
    out: dict = {"id": row.config_id, "taskId": row.task_request_id, "url": row.url}
    if row.token:
        out["token"] = row.token
    if row.auth_scheme:
        out["authentication"] = {"scheme": row.auth_scheme, "credentials": row.auth_credentials}
    return out


def push_config_create(*, caller, task_request_id: str, config: dict) -> A2APushConfig:
    """Store (or replace, same id) a config. ``InvalidInput`` for a bad or refused URL or too many configs."""
    if not isinstance(config, dict):
        raise InvalidInput("The push notification config must be an object.")
    url = _text(config.get("url"), "url", 500)
    if not url:
        raise InvalidInput("The push notification config needs a url.")
    _guard(url)
    auth = config.get("authentication") or {}
    if not isinstance(auth, dict):
        raise InvalidInput("authentication must be an object {scheme, credentials}.")
    fields = {"url": url, "token": _text(config.get("token"), "token", 500),
              "auth_scheme": _text(auth.get("scheme"), "authentication.scheme", 40),
              "auth_credentials": _text(auth.get("credentials"), "authentication.credentials", 1000)}
    config_id = _text(config.get("id"), "id", 100) or uuid.uuid4().hex
    with transaction.atomic():
        mine = A2APushConfig.objects.select_for_update().filter(caller=caller, task_request_id=task_request_id)
        existing = {row.config_id: row for row in mine}
        if config_id not in existing and len(existing) >= MAX_CONFIGS:
            raise InvalidInput(f"A task has at most {MAX_CONFIGS} push notification configs.")
        try:
            row, _ = A2APushConfig.objects.update_or_create(caller=caller, task_request_id=task_request_id,
                                                            config_id=config_id, defaults=fields)
        except IntegrityError:  # created concurrently with the same id: the other one stands
            row = A2APushConfig.objects.get(caller=caller, task_request_id=task_request_id, config_id=config_id)
    return row


def push_config_get(*, caller, task_request_id: str, config_id: str) -> A2APushConfig:
    row = A2APushConfig.objects.filter(caller=caller, task_request_id=task_request_id, config_id=config_id).first()
    if row is None:
        raise ConfigNotFound(config_id)
    return row


def push_config_list(*, caller, task_request_id: str, page_size: int, page_token: str) -> tuple[list, str]:
    """A page of the task's configs (oldest first) and the next page's token ("" on the last page)."""
    rows = A2APushConfig.objects.filter(caller=caller, task_request_id=task_request_id).order_by("id")
    if page_token:
        if not page_token.isdigit():
            raise InvalidInput("pageToken is not one this server gave.")
        rows = rows.filter(id__gt=int(page_token))
    page = list(rows[: page_size + 1])
    more = len(page) > page_size
    page = page[:page_size]
    return page, str(page[-1].id) if more else ""


def push_config_delete(*, caller, task_request_id: str, config_id: str) -> None:
    """Idempotent: deleting a config that is gone succeeds. Its pending notifications go with it."""
    A2APushConfig.objects.filter(caller=caller, task_request_id=task_request_id, config_id=config_id).delete()


def stream_response(task: Task) -> dict:
    """The A2A ``StreamResponse`` announcing the task's current state."""
    shown = a2a_task(task)
    if task.status in TERMINAL:
        return {"task": shown}
    return {"statusUpdate": {"taskId": shown["id"], "contextId": shown["contextId"], "status": shown["status"]}}


def push_enqueue(task: Task) -> list[CallbackDelivery]:
    """Inside the transaction that moves ``task``: one outbox row per push config of the task; each is tried
    once the transaction commits."""
    if task.caller_id is None:
        return []
    configs = list(A2APushConfig.objects.filter(caller_id=task.caller_id, task_request_id=task.request_id))
    if not configs:
        return []
    body = stream_response(task)
    now = timezone.now()
    rows = CallbackDelivery.objects.bulk_create([CallbackDelivery(task=task, url=c.url, body=body, push_config=c,
                                                                  next_attempt_at=now) for c in configs])
    for row in rows:
        transaction.on_commit(functools.partial(dispatch, row.pk))
    return rows
