"""Callback outbox: SSRF guard on callback URLs, HMAC-signed delivery, retries, dead letters and replay."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from reach_platform import netguard
from reach_platform.errors import InvalidInput
from registry.audit import audit
from routing.models import CallbackDelivery, CallerSecret, Task

SIGNATURE_HEADER = "X-Reach-Signature"
PUSH_TOKEN_HEADER = "X-A2A-Notification-Token"
ALLOWED_SETTING = "REACH_CALLBACK_ALLOWED_NETWORKS"


def _allowed_networks() -> list:
    return netguard.networks(settings.REACH["CALLBACK_ALLOWED_NETWORKS"])


def check_callback_url(url: str) -> netguard.CheckedURL:
    """Refuse URLs that would let a caller make the gateway reach internal services (SSRF)."""
    return netguard.check_url(url, _allowed_networks(), what="callback_url", code="callback_url_refused",
                              setting=ALLOWED_SETTING)


def caller_secret(caller) -> str:
    row, _ = CallerSecret.objects.get_or_create(caller=caller, defaults={"secret": secrets.token_urlsafe(32)})
    return row.secret


def sign(secret: str, raw: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


def outbox_row(task: Task) -> CallbackDelivery | None:
    """The (unsaved) delivery of ``task``'s terminal state to its callback_url, if it has one."""
    if not task.callback_url:
        return None
    body: dict[str, object] = {"request_id": task.request_id, "status": task.status}
    if task.status == "succeeded":
        body["result"] = task.result
    else:
        body["error"] = task.error
    return CallbackDelivery(task=task, url=task.callback_url, body=body, next_attempt_at=timezone.now())


def outbox_enqueue(task: Task) -> CallbackDelivery | None:
    """Call inside the transaction that moves ``task`` to a terminal state: the delivery row commits with the
    state, and its first try starts when that commits."""
    delivery = outbox_row(task)
    if delivery is None:
        return None
    delivery.save()
    transaction.on_commit(lambda: dispatch(delivery.pk))
    return delivery


def dispatch(delivery_id: int) -> None:
    """Start a delivery: at once on this process's engine loop when it has one (a gateway or a worker), else
    through a Celery worker. ``outbox_sweep`` restarts any whose process died before it was tried."""
    from reach_platform import engine

    if engine.has_loop():
        engine.spawn(deliver(delivery_id))
    else:
        from routing.tasks import deliver_callback

        deliver_callback.delay(delivery_id)


def dispatch_first(delivery: CallbackDelivery, secret: str | None) -> None:
    """Start a delivery whose first try the outcome's own statement counted, with the caller's signing secret
    it read (``transitions._one_statement(first_try=True)``): on this process's engine loop, with no statement
    before the POST. ``outbox_sweep`` restarts it if this process dies first."""
    from reach_platform import engine

    engine.spawn(deliver(delivery.pk, first=(delivery, secret)))


async def _first_start(delivery: CallbackDelivery, secret: str | None):
    """What ``_attempt_start_on_loop`` answers, for a delivery written with its first try counted: its body as a
    retry reads it back from the jsonb column, so that every try signs the same bytes."""
    from routing.rowsql import plain_json

    task = delivery.task
    return await _signed(delivery.url, plain_json(delivery.body), delivery.attempts, task.request_id,
                         task.caller_id, secret)


async def _signed(url: str, body: str, attempts: int, request_id: str, caller_id, secret: str | None,
                  token: str = "", auth_scheme: str = "", auth_credentials: str = ""):
    """A try's (url, raw body, headers, attempts): the body (JSON text) in its canonical form, signed with the
    caller's secret (made now on the caller's first delivery)."""
    from reach_platform import engine

    raw = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    if caller_id and secret is None:
        secret = await engine.db(_secret_of, caller_id)
    return url, raw, _headers(raw, request_id, token=token, auth_scheme=auth_scheme,
                              auth_credentials=auth_credentials, secret=secret), attempts


def _secret_of(caller_id) -> str:
    from django.contrib.auth import get_user_model

    return caller_secret(get_user_model().objects.get(pk=caller_id))


def _attempt_start(delivery_id: int):
    """Count the attempt; returns what to send, or None when the delivery is no longer pending."""
    delivery = CallbackDelivery.objects.select_related("task", "push_config").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != CallbackDelivery.Status.PENDING:
        return None  # delivered, dead, or its A2A push config was deleted
    raw = json.dumps(delivery.body, sort_keys=True, separators=(",", ":")).encode()
    config = delivery.push_config
    headers = _headers(raw, delivery.task.request_id, token=config.token if config else "",
                       auth_scheme=config.auth_scheme if config else "",
                       auth_credentials=config.auth_credentials if config else "",
                       secret=caller_secret(delivery.task.caller) if delivery.task.caller_id else None)
    attempts = delivery.attempts + 1
    CallbackDelivery.objects.filter(pk=delivery.pk).update(attempts=attempts)
    return delivery.url, raw, headers, attempts


def _headers(raw: bytes, request_id: str, *, token: str, auth_scheme: str, auth_credentials: str,
             secret: str | None) -> dict:
    """A delivery's headers: its request_id, an A2A push notification's token and authentication (A2A 4.3.3),
    and the caller's signature of the body."""
    headers = {"Content-Type": "application/json", "X-Reach-Request-Id": request_id}
    if token:
        headers[PUSH_TOKEN_HEADER] = token
    if auth_scheme:
        headers["Authorization"] = f"{auth_scheme} {auth_credentials}".strip()
    if secret is not None:
        headers[SIGNATURE_HEADER] = sign(secret, raw)
    return headers


def _attempt_end(delivery_id: int, ok: bool, error: str, attempts: int) -> None:
    from routing.tasks import CALLBACK_RETRIES, deliver_callback

    if ok:
        CallbackDelivery.objects.filter(pk=delivery_id).update(status=CallbackDelivery.Status.DELIVERED,
                                                               delivered_at=timezone.now(), last_error="")
        return
    if attempts > CALLBACK_RETRIES:
        CallbackDelivery.objects.filter(pk=delivery_id).update(last_error=error)
        delivery_dead_letter(delivery_id)
        return
    import random

    base = settings.REACH["CALLBACK_BACKOFF_S"]
    countdown = base * 2 ** (attempts - 1) + random.uniform(0, base)
    CallbackDelivery.objects.filter(pk=delivery_id).update(
        last_error=error, next_attempt_at=timezone.now() + timedelta(seconds=countdown))
    deliver_callback.apply_async((delivery_id,), countdown=countdown)


_START = """
WITH d AS (UPDATE routing_callbackdelivery SET attempts = attempts + 1 WHERE id = %s AND status = 'pending'
           RETURNING url, body, attempts, task_id, push_config_id)
SELECT d.url, d.body::text, d.attempts, t.request_id, t.caller_id, s.secret, p.token, p.auth_scheme, p.auth_credentials
FROM d JOIN routing_task t ON t.id = d.task_id
LEFT JOIN routing_callersecret s ON s.caller_id = t.caller_id
LEFT JOIN routing_a2apushconfig p ON p.id = d.push_config_id"""
_DELIVERED = ("UPDATE routing_callbackdelivery SET status = 'delivered', delivered_at = %s, last_error = '' "
              "WHERE id = ANY(%s)")


async def _receipts(delivery_ids: list[int]) -> None:
    """Mark deliveries delivered: the receipts of a loop's concurrent deliveries, one statement a batch."""
    from routing import rowsql

    await rowsql.afetch(_DELIVERED, [timezone.now(), delivery_ids])


async def _attempt_start_on_loop(delivery_id: int):
    """``_attempt_start`` as one statement on the loop; in a thread when the caller has no signing secret yet
    (it is made then) or under ``engine.run_in_caller_thread``."""
    from reach_platform import engine
    from routing import rowsql

    if engine.in_caller_thread():
        return await engine.db(_attempt_start, delivery_id)
    rows = await rowsql.afetch(_START, [delivery_id])
    if not rows:
        return None  # delivered, dead, or its A2A push config was deleted
    url, body, attempts, request_id, caller_id, secret, token, auth_scheme, auth_credentials = rows[0]
    return await _signed(url, body, attempts, request_id, caller_id, secret, token or "", auth_scheme or "",
                         auth_credentials or "")


async def deliver(delivery_id: int, *, first: tuple[CallbackDelivery, str | None] | None = None) -> bool:
    """One try of a delivery (signed POST, no redirects): delivered, or retried later with back-off by a
    worker (CALLBACK_RETRIES times), then dead-lettered. True when delivered (or nothing left to do). The
    bookkeeping of a try that succeeds is two statements on the loop; one for a first try the outcome's
    statement counted already (``first``: the unsaved-as-such row and the caller's secret it read), and the
    receipts of concurrent deliveries share theirs (``engine.batched``)."""
    from reach_platform import engine

    start = await (_first_start(*first) if first is not None else _attempt_start_on_loop(delivery_id))
    if start is None:
        return True
    url, raw, headers, attempts = start
    try:
        # resolved and checked again now, and the connection goes to the address that passed (DNS rebinding)
        status = await netguard.apost(url, allowed_networks=_allowed_networks(), body=raw, headers=headers,
                                      timeout=5, what="callback_url", setting=ALLOWED_SETTING)
        ok, error = status < 300, f"HTTP {status}"
    except InvalidInput as exc:
        ok, error = False, exc.message[:300]
    except (engine.CallTimeout, engine.ConnectFailed) as exc:
        ok, error = False, str(exc)[:300]
    if ok and not engine.in_caller_thread():
        await engine.batched("callback-receipts", _receipts, delivery_id)
    else:
        await engine.db(_attempt_end, delivery_id, ok, error, attempts)
    return ok


def delivery_attempt(delivery_id: int) -> bool:
    """``deliver`` for sync code (a worker's retry, the admin, a shell)."""
    from reach_platform import engine

    if transaction.get_connection().in_atomic_block:
        return engine.run_in_caller_thread(lambda: deliver(delivery_id))
    return engine.run(deliver(delivery_id))


def outbox_sweep(*, stale_s: float = 60.0) -> int:
    """Restart deliveries whose try never happened (their process died between the commit and the try)."""
    cutoff = timezone.now() - timedelta(seconds=stale_s)
    stale = list(CallbackDelivery.objects.filter(status=CallbackDelivery.Status.PENDING,
                                                 next_attempt_at__lt=cutoff).values_list("pk", flat=True)[:500])
    from routing.tasks import deliver_callback

    for pk in stale:
        CallbackDelivery.objects.filter(pk=pk).update(next_attempt_at=timezone.now())
        deliver_callback.delay(pk)
    return len(stale)


def delivery_dead_letter(delivery_id: int) -> None:
    """Give up on a delivery; its task joins the manual review queue (a reviewer replays or dismisses it)."""
    from routing.choices import ReviewReason
    from routing.models import Task
    from routing.signals import review_item_opened

    with transaction.atomic():
        if CallbackDelivery.objects.filter(pk=delivery_id, status=CallbackDelivery.Status.PENDING).update(
                status=CallbackDelivery.Status.DEAD, dead_at=timezone.now()):
            task_id = CallbackDelivery.objects.values_list("task_id", flat=True).get(pk=delivery_id)
            Task.objects.filter(pk=task_id).update(review_reason=ReviewReason.DEAD_LETTER)
            review_item_opened.send(sender=Task, task_id=task_id)


def delivery_replay(delivery: CallbackDelivery, *, actor=None) -> None:
    """Replay a dead letter (admin action): back to PENDING with a fresh retry allowance, and an audit row."""
    from routing.tasks import deliver_callback

    with transaction.atomic():
        if CallbackDelivery.objects.filter(pk=delivery.pk, status=CallbackDelivery.Status.DEAD).update(
                status=CallbackDelivery.Status.PENDING, attempts=0, dead_at=None, next_attempt_at=timezone.now()):
            audit(action="callback.replayed", target=delivery, actor=actor, before={"status": "dead"},
                  after={"status": "pending"})
            transaction.on_commit(lambda: deliver_callback.delay(delivery.pk))
