from __future__ import annotations

from rest_framework import serializers

from reach_platform import netguard
from reach_platform.errors import ApplicationError
from routing.models import Attempt, Task, TaskEvent


class ResolveInput(serializers.Serializer):
    task = serializers.CharField(required=False, allow_blank=False, max_length=4000)
    capability = serializers.CharField(required=False, max_length=120)
    payload = serializers.JSONField(required=False, default=None)
    action = serializers.CharField(required=False, max_length=40)
    domains = serializers.ListField(child=serializers.CharField(max_length=60), required=False, max_length=50)
    top_k = serializers.IntegerField(required=False, min_value=1, max_value=20)
    cost_preference = serializers.FloatField(required=False, min_value=0, max_value=1, default=0.0)

    def validate(self, attrs):
        if not attrs.get("task") and not attrs.get("capability"):
            raise serializers.ValidationError("Give either 'task' or 'capability'.")
        if attrs.get("payload") is not None and not isinstance(attrs["payload"], dict):
            raise serializers.ValidationError({"payload": "must be a JSON object"})
        return attrs


# request_ids travel in URL paths and in the X-Reach-Request-Id header to agents: printable ASCII, no '/'.
REQUEST_ID = r"^[A-Za-z0-9._:@~+=-]+$"


class InvokeInput(ResolveInput):
    payload = serializers.JSONField(required=False, default=dict)
    request_id = serializers.RegexField(REQUEST_ID, required=False, min_length=1, max_length=100, error_messages={
        "invalid": "request_id may hold only ASCII letters, digits and . _ : @ ~ + = -"})
    mode = serializers.ChoiceField(choices=["sync", "async"], default="sync")
    callback_url = serializers.URLField(required=False, allow_blank=True, default="", max_length=500)
    user_key = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    confirm = serializers.CharField(required=False, max_length=120)
    # the answer to an A2A agent's question (a task in input_required): text or a JSON object
    answer = serializers.JSONField(required=False)

    def validate_callback_url(self, value: str) -> str:
        """Shape only (scheme, host, port range, IDNA); the address guard resolves it in the service."""
        if value:
            try:
                netguard.parse_url(value, what="callback_url", code="callback_url_refused")
            except ApplicationError as exc:
                raise serializers.ValidationError(exc.message)
        return value


class EventOutput(serializers.ModelSerializer):
    class Meta:
        model = TaskEvent
        fields = ["at", "from_status", "to_status", "detail"]


class AttemptOutput(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["number", "version", "instance", "started_at", "latency_ms", "timeout_ms", "outcome",
                  "status_code", "error", "is_retry", "is_fallback", "usage"]


class TaskOutput(serializers.ModelSerializer):
    agent = serializers.SerializerMethodField()
    capability_version = serializers.SerializerMethodField()
    candidates = serializers.SerializerMethodField()
    attempts = serializers.IntegerField(source="attempts_count")
    links = serializers.SerializerMethodField()

    class Meta:
        model = Task
        fields = ["request_id", "status", "fallback", "agent", "capability_version", "result", "error",
                  "candidates", "decision", "attempts", "trace_id", "created_at", "updated_at", "links"]

    def get_agent(self, obj) -> str | None:
        return obj.agent_endpoint or None

    def get_capability_version(self, obj) -> str | None:
        return obj.capability_label or None

    def get_candidates(self, obj) -> list[dict] | None:
        return obj.decision.get("candidates", []) if obj.status == "needs_confirmation" else None

    def get_links(self, obj) -> dict[str, str]:
        return {"self": f"/api/v1/tasks/{obj.request_id}"}


def _iso(value) -> str | None:
    """What DRF's DateTimeField renders (ISO 8601, UTC as Z)."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def task_output(obj: Task) -> dict:
    """TaskOutput(obj).data without building a serializer: the invoke path answers with this on every request
    (a ModelSerializer costs about 1 ms per instance on this machine). The test suite holds the two equal."""
    return {"request_id": obj.request_id, "status": obj.status, "fallback": obj.fallback,
            "agent": obj.agent_endpoint or None, "capability_version": obj.capability_label or None,
            "result": obj.result, "error": obj.error,
            "candidates": obj.decision.get("candidates", []) if obj.status == "needs_confirmation" else None,
            "decision": obj.decision, "attempts": obj.attempts_count, "trace_id": obj.trace_id,
            "created_at": _iso(obj.created_at), "updated_at": _iso(obj.updated_at),
            "links": {"self": f"/api/v1/tasks/{obj.request_id}"}}


class TaskDetailOutput(TaskOutput):
    events = EventOutput(many=True, read_only=True)
    attempt_list = AttemptOutput(source="attempts", many=True, read_only=True)

    class Meta(TaskOutput.Meta):
        fields = [*TaskOutput.Meta.fields, "events", "attempt_list"]


class CallbackInput(serializers.Serializer):
    status = serializers.ChoiceField(choices=["running", "succeeded", "failed"])
    result = serializers.JSONField(required=False, default=None)
    error = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
