from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=True)
def recalibrate() -> dict:
    from routing.calibration_service import calibration_refresh

    return calibration_refresh()


CALLBACK_RETRIES = 3  # after the first try; then the delivery is dead-lettered


@shared_task(bind=True, acks_late=True, max_retries=CALLBACK_RETRIES)
def deliver_callback(self, delivery_id: int) -> bool:
    import random

    from django.conf import settings

    from routing.callbacks import delivery_attempt, delivery_dead_letter

    if delivery_attempt(delivery_id):
        return True
    if self.request.retries >= CALLBACK_RETRIES:
        delivery_dead_letter(delivery_id)
        return False
    base = settings.REACH["CALLBACK_BACKOFF_S"]
    raise self.retry(countdown=base * 2 ** self.request.retries + random.uniform(0, base))


@shared_task(acks_late=True)
def execute_task(task_id: int) -> str:
    from routing.services import task_execute

    return task_execute(task_id=task_id)


@shared_task(acks_late=True)
def reap_stuck_tasks() -> int:
    from routing.services import tasks_reap

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
    from routing.services import tasks_poll

    return tasks_poll()


@shared_task(acks_late=True)
def close_idle_sessions() -> int:
    from routing.services import sessions_close_idle

    return sessions_close_idle()
