"""Our tasks as A2A v1.0 objects (Task, TaskStatus, artifacts), shared by the A2A door, its streams and its push
notifications."""

from __future__ import annotations

import json

from routing.choices import TERMINAL, TaskStatus

STATE: dict[str, str] = {TaskStatus.PENDING: "TASK_STATE_SUBMITTED", TaskStatus.ROUTED: "TASK_STATE_WORKING",
         TaskStatus.RUNNING: "TASK_STATE_WORKING", TaskStatus.ACCEPTED: "TASK_STATE_WORKING",
         TaskStatus.SUCCEEDED: "TASK_STATE_COMPLETED", TaskStatus.FAILED: "TASK_STATE_FAILED",
         TaskStatus.CANCELLED: "TASK_STATE_CANCELED", TaskStatus.DEAD_LETTERED: "TASK_STATE_FAILED",
         TaskStatus.NEEDS_CONFIRMATION: "TASK_STATE_INPUT_REQUIRED",
         TaskStatus.INPUT_REQUIRED: "TASK_STATE_INPUT_REQUIRED",
         # a person decides (the review queue): still in progress for the A2A client
         TaskStatus.MANUAL_REVIEW: "TASK_STATE_SUBMITTED"}
# where an A2A stream ends: a terminal state, one that waits for the client (A2A 3.2.2 "interrupted"), or one
# that waits for a person (manual review may take hours: the client subscribes again, or has a push config)
STREAM_ENDS = (*TERMINAL, TaskStatus.NEEDS_CONFIRMATION, TaskStatus.INPUT_REQUIRED, TaskStatus.MANUAL_REVIEW)
PART_KEYS = ("text", "data", "raw", "url")


def state_of(status: str) -> str:
    return STATE.get(status, "TASK_STATE_WORKING")


def _timestamp(value) -> str:
    return value.isoformat().replace("+00:00", "Z") if value else ""


def result_parts(result) -> list[dict]:
    """The parts of a result: an A2A agent's own parts carried through as it sent them (``routing.a2a_transport``
    keeps them under ``parts``), else the result as one data part (a text part for a string)."""
    if isinstance(result, dict) and isinstance(result.get("parts"), list) and result["parts"] and all(
            isinstance(p, dict) and any(k in p for k in PART_KEYS) for p in result["parts"]):
        return result["parts"]
    if isinstance(result, str):
        return [{"text": result, "mediaType": "text/plain"}]
    return [{"data": result, "mediaType": "application/json"}]


def answered_by_message(task) -> bool:
    """The agent behind the gateway answered with an A2A Message rather than a task (routing.a2a_transport)."""
    return task.status == TaskStatus.SUCCEEDED and isinstance(task.result, dict) \
        and task.result.get("kind") == "message" and bool(result_parts(task.result))


def a2a_message(task) -> dict:
    return {"role": "ROLE_AGENT", "messageId": f"{task.request_id}-answer", "taskId": task.request_id,
            "contextId": context_of(task), "parts": result_parts(task.result)}


def artifact(task) -> dict:
    return {"artifactId": f"{task.request_id}-result", "name": "result", "parts": result_parts(task.result)}


def _status_message(task) -> dict | None:
    parts: list[dict]
    if task.status in (TaskStatus.FAILED, TaskStatus.DEAD_LETTERED):
        parts = [{"text": str((task.error or {}).get("message") or "the task failed")}]
    elif task.status == TaskStatus.INPUT_REQUIRED:
        parts = [{"text": str((task.result or {}).get("question") or "the agent needs more input")}]
    elif task.status == TaskStatus.NEEDS_CONFIRMATION:
        candidates = [c.get("capability") for c in (task.decision or {}).get("candidates", [])]
        parts = [{"text": "Which capability do you mean? Answer with one of: " + ", ".join(map(str, candidates))},
                 {"data": {"candidates": (task.decision or {}).get("candidates", [])}, "mediaType":
                  "application/json"}]
    elif task.status == TaskStatus.MANUAL_REVIEW:
        parts = [{"text": "No agent matched with enough confidence: a person will route this request."}]
    else:
        return None
    return {"role": "ROLE_AGENT", "messageId": f"{task.request_id}-status-{task.status}", "taskId": task.request_id,
            "contextId": context_of(task), "parts": parts}


def context_of(task) -> str:
    return task.user_key or task.request_id


def status_of(task) -> dict:
    status: dict = {"state": state_of(task.status), "timestamp": _timestamp(task.updated_at or task.created_at)}
    message = _status_message(task)
    if message is not None:
        status["message"] = message
    return status


def a2a_task(task, *, artifacts: bool = True) -> dict:
    """Our task as an A2A Task (id = our request_id; contextId = the caller's user_key)."""
    out: dict = {"id": task.request_id, "contextId": context_of(task), "status": status_of(task)}
    if artifacts and task.status == TaskStatus.SUCCEEDED:
        out["artifacts"] = [artifact(task)]
    return out


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
