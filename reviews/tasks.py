from celery import shared_task


@shared_task(name="reviews.tasks.canaries_evaluate", ignore_result=True)
def canaries_evaluate() -> int:
    """Beat: compare every active canary with its stable version; roll back the ones doing worse."""
    from reviews.services import canaries_evaluate as run

    return run()
