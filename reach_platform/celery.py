"""The Celery app: Redis broker, late acks, tasks discovered in every app's ``tasks.py``."""

import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

app = Celery("reach_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from reach_platform.serving import tune_gc  # noqa: E402
from reach_platform.tracing import configure_from_env  # noqa: E402

configure_from_env()


@worker_init.connect
def _tune_gc(**_) -> None:
    """A worker holds hundreds of calls in flight on its engine loop, as a web process does (serving.tune_gc)."""
    tune_gc()
