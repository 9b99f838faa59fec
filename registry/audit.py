"""Explicit audit rows, written inside the caller's transaction."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.forms.models import model_to_dict

from reach_platform.request_context import current_request_id
from registry.models import AuditLog


def snapshot(obj, fields: list[str] | None = None) -> dict[str, Any]:
    data = model_to_dict(obj, fields=fields)
    return {k: _plain(v) for k, v in data.items()}


def _plain(value: Any) -> Any:
    if hasattr(value, "pk"):
        return value.pk
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict | str | int | float | bool) or value is None:
        return value
    return str(value)


def audit(*, action: str, target, actor=None, actor_label: str = "", before=None, after=None,
          request_id: str = "") -> AuditLog:
    """One audit row; ``request_id`` defaults to the id of the HTTP request being served (RequestIdMiddleware)."""
    row = audit_row(action=action, target=target, actor=actor, actor_label=actor_label, before=before, after=after,
                    request_id=request_id)
    row.save()
    return row


def audit_rows_write(rows: list[AuditLog]) -> None:
    """Write audit rows built with ``audit_row`` in a few statements (an import of thousands of versions)."""
    AuditLog.objects.bulk_create(rows, batch_size=1000)


def audit_row(*, action: str, target, actor=None, actor_label: str = "", before=None, after=None,
              request_id: str = "") -> AuditLog:
    """The audit row ``audit`` writes, not yet saved: services that change many rows write theirs in bulk
    (``audit_rows_write``) inside the same transaction."""
    if actor is not None and not getattr(actor, "is_authenticated", False):
        actor = None
    return AuditLog(
        actor=actor,
        actor_label=actor_label or (actor.get_username() if actor else "system"),
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        target_repr=str(target)[:300],
        before=before,
        after=after,
        request_id=request_id or current_request_id(),
    )


def _model_fields(obj) -> list[str]:
    return [f.name for f in obj._meta.concrete_fields if f.name not in ("id", "created_at", "updated_at")]


@transaction.atomic
def object_save(*, obj, actor, fields: list[str] | None = None) -> None:
    """Save a row a person edited in the admin, with an audit row (``<model>.created`` / ``<model>.changed``,
    before and after). For models whose writes have no service of their own: budgets, capabilities, caller
    secrets, an admin's edit of an agent's protected fields."""
    names = fields or _model_fields(obj)
    current = type(obj).objects.filter(pk=obj.pk).first() if obj.pk else None
    before = snapshot(current, names) if current is not None else None
    obj.save()
    audit(action=f"{obj._meta.model_name}.{'changed' if current is not None else 'created'}", target=obj,
          actor=actor, before=before, after=snapshot(obj, names))


@transaction.atomic
def object_delete(*, obj, actor, fields: list[str] | None = None) -> None:
    before = snapshot(obj, fields or _model_fields(obj))
    audit(action=f"{obj._meta.model_name}.deleted", target=obj, actor=actor, before=before)
    obj.delete()
