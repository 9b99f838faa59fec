"""Explicit audit rows, written inside the caller's transaction."""

from __future__ import annotations

from typing import Any

from django.forms.models import model_to_dict

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
    if actor is not None and not getattr(actor, "is_authenticated", False):
        actor = None
    return AuditLog.objects.create(
        actor=actor,
        actor_label=actor_label or (actor.get_username() if actor else "system"),
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        target_repr=str(target)[:300],
        before=before,
        after=after,
        request_id=request_id,
    )
