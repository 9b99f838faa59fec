from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=True)
def recalibrate() -> dict:
    from routing.calibration_service import calibration_refresh

    return calibration_refresh()
