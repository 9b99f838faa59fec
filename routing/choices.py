from django.db import models


class TaskStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    ROUTED = "routed", "Routed"
    ACCEPTED = "accepted", "Accepted"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    NEEDS_CONFIRMATION = "needs_confirmation", "Needs confirmation"
    INPUT_REQUIRED = "input_required", "Input required (the agent asks the caller)"
    MANUAL_REVIEW = "manual_review", "Manual review"
    CANCELLED = "cancelled", "Cancelled"
    DEAD_LETTERED = "dead_lettered", "Dead-lettered"


TERMINAL = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.DEAD_LETTERED)
# States a repeated request_id answers from without executing anything.
SETTLED = (*TERMINAL, TaskStatus.NEEDS_CONFIRMATION, TaskStatus.MANUAL_REVIEW, TaskStatus.INPUT_REQUIRED)


class Decision(models.TextChoices):
    EXECUTE = "execute", "Execute"
    CONFIRM = "confirm", "Confirm"
    MANUAL_REVIEW = "manual_review", "Manual review"


class AttemptOutcome(models.TextChoices):
    SUCCESS = "success", "Success"
    TIMEOUT = "timeout", "Timeout"
    CONNECT_ERROR = "connect_error", "Connection failed"
    SERVER_ERROR = "server_error", "5xx"
    CLIENT_ERROR = "client_error", "4xx"
    BAD_OUTPUT = "bad_output", "Output breaks output_schema"
    FINGERPRINT = "fingerprint_mismatch", "Answered with another endpoint id"
    ACCEPTED = "accepted", "Accepted (async)"
    INPUT_REQUIRED = "input_required", "The agent asks for input (A2A)"


class Mode(models.TextChoices):
    SYNC = "sync", "Synchronous"
    ASYNC = "async", "Asynchronous"


class ReviewReason(models.TextChoices):
    """Why a task waits for a person (BRIEF §5: low score, every candidate failed, callback dead-lettered)."""

    LOW_SCORE = "low_score", "Scored below the confirm band"
    ALL_FAILED = "all_failed", "Every candidate failed"
    DEAD_LETTER = "dead_letter", "Callback dead-lettered"


# The one task state machine (routing.transitions applies it): the states each state may move to.
# A resumed async run routes again (RUNNING -> ROUTED); a refusal retried with its request_id runs again
# (FAILED -> PENDING); a person may still answer a task on which every candidate failed (FAILED -> SUCCEEDED).
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    TaskStatus.PENDING: frozenset({TaskStatus.ROUTED, TaskStatus.NEEDS_CONFIRMATION, TaskStatus.MANUAL_REVIEW,
                                   TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.ROUTED: frozenset({TaskStatus.RUNNING, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.ROUTED, TaskStatus.ACCEPTED, TaskStatus.SUCCEEDED, TaskStatus.FAILED,
                                   TaskStatus.MANUAL_REVIEW, TaskStatus.CANCELLED, TaskStatus.INPUT_REQUIRED}),
    # an A2A agent asked the caller: the caller's answer (a repeat of the request_id with "answer") runs it again
    TaskStatus.INPUT_REQUIRED: frozenset({TaskStatus.PENDING, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    # an A2A agent that took an async task may come back with a question (by push or when read)
    TaskStatus.ACCEPTED: frozenset({TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED,
                                    TaskStatus.CANCELLED, TaskStatus.INPUT_REQUIRED}),
    TaskStatus.NEEDS_CONFIRMATION: frozenset({TaskStatus.PENDING, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.MANUAL_REVIEW: frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.FAILED: frozenset({TaskStatus.PENDING, TaskStatus.SUCCEEDED}),
    TaskStatus.SUCCEEDED: frozenset(),
    TaskStatus.CANCELLED: frozenset(),
    TaskStatus.DEAD_LETTERED: frozenset(),
}
# States whose task waits on an agent or a worker: the reaper fails them past their deadline.
IN_FLIGHT = (TaskStatus.PENDING, TaskStatus.ROUTED, TaskStatus.RUNNING, TaskStatus.ACCEPTED)
