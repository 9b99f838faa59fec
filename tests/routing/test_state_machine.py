"""The one task state machine: racing writers move a task once, and a terminal state fires one callback."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from routing.choices import ALLOWED_TRANSITIONS, TERMINAL, ReviewReason, TaskStatus
from routing.lifecycle import task_agent_report
from routing.manual import task_resolve_by_hand
from routing.models import CallbackDelivery, Task, TaskEvent
from routing.reaper import tasks_reap
from routing.transitions import IllegalTransition, Timeline

pytestmark = pytest.mark.django_db(transaction=True)
ROUNDS = 8  # each race is run this many times: a lost compare-and-set shows up as a second terminal event


def _task(user, request_id: str, status: str, **fields) -> Task:
    return Task.objects.create(request_id=request_id, caller=user, status=status, mode="async", payload={},
                               callback_url="http://127.0.0.1:9/hook", **fields)


def _race(*actions) -> list:
    """Run the actions at the same moment, each in its own thread (with its own database connection)."""
    barrier = threading.Barrier(len(actions))
    results: list = [None] * len(actions)

    def run(i, action):
        barrier.wait()
        try:
            results[i] = action()
        except Exception as exc:  # a loser may be refused: that is an outcome too
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results


def _terminal_events(task: Task) -> list[TaskEvent]:
    return list(TaskEvent.objects.filter(task=task, to_status__in=TERMINAL).exclude(from_status__in=TERMINAL))


def test_every_state_may_only_take_its_allowed_steps(user):
    task = Task.objects.create(request_id="sm-steps", caller=user, payload={})
    timeline = Timeline(task)
    with pytest.raises(IllegalTransition):
        timeline.move(TaskStatus.SUCCEEDED)  # pending -> succeeded skips routing
    timeline.move(TaskStatus.ROUTED)
    timeline.move(TaskStatus.RUNNING)
    timeline.move(TaskStatus.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        timeline.move(TaskStatus.FAILED)  # a success is final
    assert timeline.commit()
    assert [e.to_status for e in task.events.all()] == ["routed", "running", "succeeded"]
    assert all(not ALLOWED_TRANSITIONS[s] for s in (TaskStatus.SUCCEEDED, TaskStatus.CANCELLED))


def test_a_stale_writer_writes_nothing(user):
    task = _task(user, "sm-stale", TaskStatus.RUNNING)
    stale = Task.objects.get(pk=task.pk)
    first = Timeline(task)
    first.move(TaskStatus.SUCCEEDED)
    task.result = {"answer": 1}
    assert first.commit(fields=["result"])
    second = Timeline(stale)  # read while still RUNNING
    second.move(TaskStatus.FAILED)
    stale.error = {"code": "late"}
    assert not second.commit(fields=["error"])
    assert stale.status == TaskStatus.SUCCEEDED and stale.error is None  # reloaded, not overwritten
    assert Task.objects.get(pk=task.pk).result == {"answer": 1}
    assert CallbackDelivery.objects.filter(task=task).count() == 1


def test_reaper_racing_a_late_success_moves_the_task_once(user):
    for n in range(ROUNDS):
        task = _task(user, f"sm-reap-{n}", TaskStatus.ACCEPTED, deadline_at=timezone.now() - timedelta(seconds=1))
        results = _race(lambda: tasks_reap(),
                        lambda t=task: task_agent_report(task=Task.objects.get(pk=t.pk), status="succeeded",
                                                         result={"late": True}, source="test"))
        task.refresh_from_db()
        assert len(_terminal_events(task)) == 1, results
        assert CallbackDelivery.objects.filter(task=task).count() == 1
        reaped = results[0] == 1
        assert task.status == (TaskStatus.FAILED if reaped else TaskStatus.SUCCEEDED)
        assert (task.result is None) == reaped


def test_two_concurrent_agent_reports_move_the_task_once(user):
    for n in range(ROUNDS):
        task = _task(user, f"sm-reports-{n}", TaskStatus.RUNNING)
        _race(lambda t=task: task_agent_report(task=Task.objects.get(pk=t.pk), status="succeeded",
                                               result={"by": "callback"}, source="callback"),
              lambda t=task: task_agent_report(task=Task.objects.get(pk=t.pk), status="failed", error="boom",
                                               source="poll"))
        task.refresh_from_db()
        assert task.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED)
        assert len(_terminal_events(task)) == 1
        deliveries = list(CallbackDelivery.objects.filter(task=task))
        assert len(deliveries) == 1 and deliveries[0].body["status"] == task.status


def test_a_review_answer_racing_a_late_agent_report_settles_the_task_once(user):
    """The original task waits in the review queue; a reviewer re-dispatched it, and the re-dispatched task's
    late success (which settles the original) races the reviewer's answer by hand."""
    for n in range(ROUNDS):
        origin = _task(user, f"sm-review-{n}", TaskStatus.MANUAL_REVIEW, review_reason=ReviewReason.LOW_SCORE)
        child = _task(user, f"sm-review-{n}.r1", TaskStatus.RUNNING, parent_request_id=origin.request_id,
                      options={"redispatch_of": origin.request_id})
        _race(lambda o=origin: task_resolve_by_hand(task=Task.objects.get(pk=o.pk), status=TaskStatus.SUCCEEDED,
                                                    result={"by": "reviewer"}),
              lambda c=child: task_agent_report(task=Task.objects.get(pk=c.pk), status="succeeded",
                                                result={"by": "agent"}, source="callback"))
        origin.refresh_from_db()
        assert origin.status == TaskStatus.SUCCEEDED
        assert len(_terminal_events(origin)) == 1
        assert CallbackDelivery.objects.filter(task=origin).count() == 1
        assert origin.result in ({"by": "reviewer"}, {"by": "agent"})
        assert CallbackDelivery.objects.filter(task=child).count() == 1
