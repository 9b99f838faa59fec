"""Routing's service functions, by the module that holds them (read them in call order there):

- ``routing.invoke``: the invoke path (admit -> resolve -> execute -> record), sync and async alike;
- ``routing.lifecycle``: agent reports on ACKed tasks (callbacks, polling);
- ``routing.manual``: answers, rejections and re-dispatches from the review queue;
- ``routing.reaper``: stuck tasks and idle sessions;
- ``routing.selectors``: reads;
- ``routing.transitions``: the one task state machine every status change goes through.
"""

from routing.invoke import InvokeHeaders, task_invoke
from routing.lifecycle import task_agent_report, task_callback, tasks_poll
from routing.manual import RESOLVABLE, task_redispatch, task_resolve_by_hand
from routing.reaper import sessions_close_idle, tasks_reap
from routing.selectors import task_for_caller

__all__ = ["RESOLVABLE", "InvokeHeaders", "sessions_close_idle", "task_agent_report", "task_callback",
           "task_for_caller", "task_invoke", "task_redispatch", "task_resolve_by_hand", "tasks_poll", "tasks_reap"]
