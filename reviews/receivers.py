"""What reviews does when routing reports: watch canaries, reopen queue items."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# at most one canary evaluation per version per this many milliseconds, across processes
EVALUATE_EVERY_MS = 1000


def on_attempts_recorded(sender, version_ids, **kwargs) -> None:
    """After attempts on a canary, compare it with its stable version (throttled; beat sweeps too). Sent on the
    engine loop too (an outcome committed there): the comparison then runs in a database thread."""
    from reach_platform import engine
    from routing import snapshot

    versions = snapshot.last().versions
    canaries = [vid for vid in version_ids if (info := versions.get(vid)) is not None and info.is_canary]
    if not canaries:
        return
    if engine.on_loop():
        engine.spawn(engine.db(_watch_canaries, canaries))
    else:
        _watch_canaries(canaries)


def _watch_canaries(version_ids: list[int]) -> None:
    from registry.generation import redis_client
    from reviews.services import canary_evaluate

    for vid in version_ids:
        if redis_client().set(f"reach:canary-check:{vid}", 1, nx=True, px=EVALUATE_EVERY_MS):
            try:
                canary_evaluate(vid)
            except Exception:  # never fail the caller's request over the canary watch
                logger.exception("canary evaluation failed", extra={"version_id": vid})


def on_review_item_opened(sender, task_id, **kwargs) -> None:
    from reviews.services import queue_reopen

    queue_reopen(task_id)


def connect() -> None:
    from routing.signals import attempts_recorded, review_item_opened

    attempts_recorded.connect(on_attempts_recorded, dispatch_uid="reach-canary-watch")
    review_item_opened.connect(on_review_item_opened, dispatch_uid="reach-review-reopen")
