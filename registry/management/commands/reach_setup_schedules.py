"""python manage.py reach_setup_schedules: create (or update) the platform's periodic Celery beat tasks."""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django_celery_beat.models import IntervalSchedule, PeriodicTask

# name -> (task, every seconds). Liveness is swept every 10 s (the heartbeat interval); the sweep probes an
# instance in doubt at most every PROBE_INTERVAL_S (30 s).
PLATFORM_SCHEDULES = {
    "reach: liveness sweep": ("registry.tasks.liveness_sweep", 10),
    "reach: reap stuck tasks": ("routing.tasks.reap_stuck_tasks", 30),
    "reach: poll async agents": ("routing.tasks.poll_async_tasks", 5),
    "reach: close idle sessions": ("routing.tasks.close_idle_sessions", 60),
    "reach: canary watch": ("reviews.tasks.canaries_evaluate", 30),
    "reach: outbox sweep": ("routing.tasks.sweep_outbox", 30),
}


class Command(BaseCommand):
    help = "Create the periodic tasks Agent-Reach needs (idempotent)."

    def handle(self, *args, **options):
        for name, (task, seconds) in PLATFORM_SCHEDULES.items():
            interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period=IntervalSchedule.SECONDS)
            PeriodicTask.objects.update_or_create(name=name, defaults={"task": task, "interval": interval,
                                                                       "enabled": True})
        self.stdout.write(f"{len(PLATFORM_SCHEDULES)} platform schedule(s) in place.")
