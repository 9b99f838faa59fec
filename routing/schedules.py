"""Schedules: validation, the django-celery-beat entry that fires them, and one run."""

from __future__ import annotations

import json

from celery.schedules import crontab
from django.db import transaction
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from reach_platform.errors import InvalidInput
from registry.audit import audit, snapshot
from routing.models import Schedule


def schedule_validate(schedule: Schedule) -> None:
    if bool(schedule.cron) == bool(schedule.every_seconds):
        raise InvalidInput("Give either a cron expression or every_seconds, not both.", code="invalid_schedule")
    if bool(schedule.capability) == bool(schedule.task_text):
        raise InvalidInput("Give either a capability or a task text, not both.", code="invalid_schedule")
    if not isinstance(schedule.payload, dict):
        raise InvalidInput("The payload must be a JSON object.", code="invalid_schedule")
    if schedule.cron:
        _cron_fields(schedule.cron)


def _cron_fields(expression: str) -> dict[str, str]:
    parts = expression.split()
    if len(parts) != 5:
        raise InvalidInput(f"'{expression}' is not a five-field cron expression (minute hour day month weekday).",
                           code="invalid_schedule")
    fields = dict(zip(["minute", "hour", "day_of_month", "month_of_year", "day_of_week"], parts, strict=True))
    try:
        crontab(**fields)
    except (ValueError, KeyError) as exc:
        raise InvalidInput(f"Invalid cron expression '{expression}': {exc}", code="invalid_schedule")
    return fields


SCHEDULE_AUDIT_FIELDS = ["name", "capability", "task_text", "payload", "caller", "cron", "every_seconds",
                         "enabled"]


@transaction.atomic
def schedule_save(*, schedule: Schedule, actor=None) -> Schedule:
    """Validate and save, and create or update the beat entry that fires it (with an audit row)."""
    schedule_validate(schedule)
    current = Schedule.objects.filter(pk=schedule.pk).first() if schedule.pk else None
    schedule.save()
    audit(action="schedule.changed" if current else "schedule.created", target=schedule, actor=actor,
          before=snapshot(current, SCHEDULE_AUDIT_FIELDS) if current else None,
          after=snapshot(schedule, SCHEDULE_AUDIT_FIELDS))
    defaults = {"task": "routing.tasks.run_schedule", "kwargs": json.dumps({"schedule_id": schedule.pk}),
                "enabled": schedule.enabled, "crontab": None, "interval": None}
    if schedule.cron:
        defaults["crontab"], _ = CrontabSchedule.objects.get_or_create(**_cron_fields(schedule.cron), timezone="UTC")
    else:
        defaults["interval"], _ = IntervalSchedule.objects.get_or_create(every=schedule.every_seconds,
                                                                         period=IntervalSchedule.SECONDS)
    periodic, _ = PeriodicTask.objects.update_or_create(name=f"reach schedule {schedule.pk}: {schedule.name}"[:200],
                                                        defaults=defaults)
    if schedule.periodic_task_id != periodic.pk:
        schedule.periodic_task = periodic
        schedule.save(update_fields=["periodic_task"])
    return schedule


@transaction.atomic
def schedule_delete(*, schedule: Schedule, actor=None) -> None:
    audit(action="schedule.deleted", target=schedule, actor=actor, before=snapshot(schedule, SCHEDULE_AUDIT_FIELDS))
    if schedule.periodic_task_id:
        PeriodicTask.objects.filter(pk=schedule.periodic_task_id).delete()
    schedule.delete()


def schedule_run(*, schedule_id: int, fired_at=None):
    """One run: a normal task. The request id carries the firing second, so a double fire runs once."""
    from routing.services import InvokeHeaders, task_invoke

    schedule = Schedule.objects.select_related("caller").filter(pk=schedule_id, enabled=True).first()
    if schedule is None:
        return None
    fired_at = fired_at or timezone.now()
    Schedule.objects.filter(pk=schedule.pk).update(last_run_at=fired_at)
    return task_invoke(caller=schedule.caller, payload=schedule.payload, task=schedule.task_text or None,
                       capability=schedule.capability or None,
                       request_id=f"schedule-{schedule.pk}-{fired_at:%Y%m%dT%H%M%S}",
                       headers=InvokeHeaders(parent_request_id=f"schedule:{schedule.pk}"))
