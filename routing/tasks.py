from __future__ import annotations

from celery import shared_task

from routing import snapshot

RECALIBRATE_PENDING_KEY = "reach:recalibrate:pending"
RECALIBRATE_PENDING_TTL = 600  # s: a lost task (its message gone before it ran) holds back new ones at most this long;
# an expiry while the task still waits in a long queue only lets a second one in (harmless)


def recalibrate_soon() -> bool:
    """Enqueue one recalibration unless one is already waiting to start: an import embeds in tasks of 500
    versions, and each one's vectors-changed signal would otherwise queue a fit of the whole registry (20 fits for
    10,000 capabilities, each a minute). The waiting task reads the registry when it starts, so it covers every
    change made before then; a change after its start enqueues the next one. Returns whether a task was enqueued."""
    if not snapshot.redis_client().set(RECALIBRATE_PENDING_KEY, "1", nx=True, ex=RECALIBRATE_PENDING_TTL):
        return False
    recalibrate.delay()
    return True


@shared_task(acks_late=True)
def recalibrate() -> dict:
    from routing.calibration_service import calibration_refresh

    snapshot.redis_client().delete(RECALIBRATE_PENDING_KEY)  # from now on a change needs a run of its own
    return calibration_refresh()


CALLBACK_RETRIES = 3  # after the first try; then the delivery is dead-lettered


@shared_task(acks_late=True)
def deliver_callback(delivery_id: int) -> bool:
    """One try of a callback delivery (the first try usually runs at once on the engine loop of the process
    that committed the outcome; retries come here with their back-off)."""
    from routing.callbacks import delivery_attempt

    return delivery_attempt(delivery_id)


@shared_task(acks_late=True)
def sweep_outbox() -> int:
    from routing.callbacks import outbox_sweep

    return outbox_sweep()


CLAIMED_HEADER = "reach_claimed"  # a message header: the task's row as claimed (``routing.invoke._claimed``)


@shared_task(bind=True, acks_late=True)
def execute_task(self, task_id: int) -> str:
    """An async task: run on this worker's engine loop. The message is acked when the run ends (acks late), so
    a worker killed mid-task gets it redelivered; the task's lease decides what a redelivery does. The message's
    ``reach_claimed`` header, when it has one, carries the task's row as claimed (``routing.invoke.run_queued``):
    a header, not an argument, so that workers and web processes of two releases understand each other's
    messages during a rolling deploy (one that does not know the header runs the task by its id)."""
    from reach_platform import engine
    from routing.invoke import run_queued

    return engine.run(run_queued(task_id, getattr(self.request, CLAIMED_HEADER, None)))


@shared_task(acks_late=True)
def reap_stuck_tasks() -> int:
    from routing.reaper import tasks_reap

    return tasks_reap()


@shared_task(acks_late=True)
def run_schedule(schedule_id: int) -> str:
    from reach_platform.errors import ApplicationError
    from routing.schedules import schedule_run

    try:
        task = schedule_run(schedule_id=schedule_id)
    except ApplicationError as exc:  # recorded on the task where one was created
        return exc.code
    return task.status if task else "disabled"


@shared_task(acks_late=True)
def poll_async_tasks() -> int:
    from routing.lifecycle import tasks_poll

    return tasks_poll()


@shared_task(acks_late=True)
def close_idle_sessions() -> int:
    from routing.reaper import sessions_close_idle

    return sessions_close_idle()
