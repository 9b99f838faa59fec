from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from reach_platform.errors import NotFound
from registry.api.serializers import CapabilityVersionOutput
from registry.models import CapabilityVersion
from reviews import services
from routing.services import task_for_caller


class ApproveInput(serializers.Serializer):
    confidence_weight = serializers.FloatField(min_value=0, max_value=1)
    canary_share = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0.01,
                                          max_value=0.99)


class RejectInput(serializers.Serializer):
    comment = serializers.CharField(max_length=4000)


class FeedbackInput(serializers.Serializer):
    correct = serializers.BooleanField()
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


def _version(pk: int) -> CapabilityVersion:
    version = CapabilityVersion.objects.select_related("capability__agent__team").filter(pk=pk).first()
    if version is None:
        raise NotFound(f"No capability version {pk}.")
    return version


class SubmitView(APIView):
    @extend_schema(request=None, responses={200: CapabilityVersionOutput})
    def post(self, request, pk: int):
        version = services.capability_version_submit(version=_version(pk), actor=request.user)
        return Response(CapabilityVersionOutput(version).data)


class ApproveView(APIView):
    @extend_schema(request=ApproveInput, responses={200: CapabilityVersionOutput})
    def post(self, request, pk: int):
        data = ApproveInput(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.capability_version_approve(version=_version(pk), actor=request.user,
                                                       **data.validated_data)
        return Response(CapabilityVersionOutput(version).data)


class RejectView(APIView):
    @extend_schema(request=RejectInput, responses={200: CapabilityVersionOutput})
    def post(self, request, pk: int):
        data = RejectInput(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.capability_version_reject(version=_version(pk), actor=request.user, **data.validated_data)
        return Response(CapabilityVersionOutput(version).data)


class FeedbackView(APIView):
    @extend_schema(request=FeedbackInput, responses={201: dict})
    def post(self, request, request_id: str):
        data = FeedbackInput(data=request.data)
        data.is_valid(raise_exception=True)
        task = task_for_caller(request_id=request_id, caller=request.user)
        feedback = services.task_feedback(task=task, actor=request.user, **data.validated_data)
        return Response({"id": feedback.pk, "capability": feedback.capability, "correct": feedback.correct},
                        status=201)


class QueueFilter(serializers.Serializer):
    status = serializers.ChoiceField(choices=["open", "waiting", "claimed", "resolved", "all"], required=False,
                                     default="open")
    reason = serializers.ChoiceField(choices=["low_score", "all_failed", "dead_letter"], required=False)
    capability_guess = serializers.CharField(required=False, max_length=120)
    older_than = serializers.ChoiceField(choices=["1h", "24h", "7d"], required=False)
    newer_than = serializers.ChoiceField(choices=["1h", "24h", "7d"], required=False)


class RedispatchInput(serializers.Serializer):
    capability = serializers.CharField(max_length=120)


class PromoteFeedbackInput(serializers.Serializer):
    capability = serializers.CharField(max_length=120)
    feedback_ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=2**63 - 1), min_length=1,
                                         max_length=1000)


class AnswerInput(serializers.Serializer):
    answer = serializers.JSONField()


class ReasonInput(serializers.Serializer):
    reason = serializers.CharField(max_length=2000)


def _waiting(key: str):
    """A queue item by its task's key (the queue lists it; request_ids are per caller, keys are unique)."""
    from routing.models import Task

    task = Task.objects.filter(key=key).first()
    if task is None:
        raise NotFound(f"No task with key '{key}'.")
    return task


class QueueListView(APIView):
    """Items waiting for a person, oldest first. Filters: status (open, waiting, claimed, resolved, all), reason
    (low_score, all_failed, dead_letter), capability_guess, older_than / newer_than (1h, 24h, 7d)."""

    @extend_schema(parameters=[QueueFilter], responses={200: dict})
    def get(self, request):
        from reviews.selectors import queue_items

        params = QueueFilter(data=request.query_params)
        params.is_valid(raise_exception=True)
        qs = queue_items(reader=request.user, **{k: v for k, v in params.validated_data.items() if v})
        items = [{"key": t.key, "request_id": t.request_id, "reason": t.review_reason, "status": t.status,
                  "task_text": t.task_text, "capability_guess": t.capability_guess,
                  "score": (t.decision or {}).get("score"), "created_at": t.created_at,
                  "claimed_by": t.review_claim.reviewer.get_username() if t.claimed or t.resolved else None,
                  "resolution": t.review_claim.resolution if t.resolved else None} for t in qs[:200]]
        return Response({"count": qs.count(), "results": items})


class ClaimView(APIView):
    @extend_schema(request=None, responses={200: dict})
    def post(self, request, key: str):
        claim = services.queue_claim(task=_waiting(key), reviewer=request.user)
        return Response({"key": key, "reviewer": claim.reviewer.get_username()})


class AnswerView(APIView):
    @extend_schema(request=AnswerInput, responses={200: dict})
    def post(self, request, key: str):
        data = AnswerInput(data=request.data)
        data.is_valid(raise_exception=True)
        task = services.queue_answer(task=_waiting(key), reviewer=request.user, **data.validated_data)
        return Response({"key": task.key, "status": task.status})


class QueueRejectView(APIView):
    @extend_schema(request=ReasonInput, responses={200: dict})
    def post(self, request, key: str):
        data = ReasonInput(data=request.data)
        data.is_valid(raise_exception=True)
        task = services.queue_reject(task=_waiting(key), reviewer=request.user, **data.validated_data)
        return Response({"key": task.key, "status": task.status})


class RedispatchView(APIView):
    @extend_schema(request=RedispatchInput, responses={202: dict})
    def post(self, request, key: str):
        data = RedispatchInput(data=request.data)
        data.is_valid(raise_exception=True)
        child = services.queue_redispatch(task=_waiting(key), reviewer=request.user, **data.validated_data)
        return Response({"key": key, "redispatched_as": child.key, "status": child.status},
                        status=202)


class ReplayView(APIView):
    @extend_schema(request=None, responses={200: dict})
    def post(self, request, key: str):
        replayed = services.queue_replay(task=_waiting(key), reviewer=request.user)
        return Response({"key": key, "replayed": replayed})


class ReleaseView(APIView):
    @extend_schema(request=None, responses={200: dict})
    def post(self, request, key: str):
        services.queue_release(task=_waiting(key), reviewer=request.user)
        return Response({"key": key, "released": True})


class PromoteCanaryView(APIView):
    @extend_schema(request=None, responses={200: CapabilityVersionOutput})
    def post(self, request, pk: int):
        version = services.capability_version_promote(version=_version(pk), actor=request.user)
        return Response(CapabilityVersionOutput(version).data)


class RollbackCanaryView(APIView):
    @extend_schema(request=ReasonInput, responses={200: CapabilityVersionOutput})
    def post(self, request, pk: int):
        data = ReasonInput(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.capability_version_rollback(version=_version(pk), actor=request.user,
                                                       reason=data.validated_data["reason"])
        return Response(CapabilityVersionOutput(version).data)


class CanaryStatsView(APIView):
    @extend_schema(responses={200: dict})
    def get(self, request, pk: int):
        version = _version(pk)
        stats = services.canary_compare(version)
        return Response({**stats, "verdict": services.canary_verdict(stats) if version.is_canary else None})


class FeedbackListView(APIView):
    """Labelled routing examples (reviewers only); filter by capability, correct, promoted (true/false)."""

    @extend_schema(responses={200: dict})
    def get(self, request):
        from reach_platform.errors import PermissionDenied
        from registry.permissions import is_reviewer
        from reviews.models import RoutingFeedback

        if not is_reviewer(request.user):
            raise PermissionDenied("Only reviewers may read routing feedback.", code="not_a_reviewer")
        qs = RoutingFeedback.objects.all()
        if request.query_params.get("capability"):
            qs = qs.filter(capability=request.query_params["capability"])
        if request.query_params.get("correct") in ("true", "false"):
            qs = qs.filter(correct=request.query_params["correct"] == "true")
        if request.query_params.get("promoted") in ("true", "false"):
            qs = qs.filter(promoted_to__isnull=request.query_params["promoted"] == "false")
        rows = list(qs.values("id", "task__request_id", "request_text", "capability", "correct", "comment",
                              "source", "promoted_to_id", "created_at")[:500])
        return Response({"count": qs.count(), "results": rows})


class FeedbackPromoteView(APIView):
    @extend_schema(request=PromoteFeedbackInput, responses={201: CapabilityVersionOutput})
    def post(self, request):
        from registry.models import Capability

        data = PromoteFeedbackInput(data=request.data)
        data.is_valid(raise_exception=True)
        capability = Capability.objects.select_related("agent").filter(name=data.validated_data["capability"]).first()
        if capability is None:
            raise NotFound(f"No capability '{data.validated_data['capability']}'.")
        draft = services.feedback_promote(capability=capability, feedback_ids=data.validated_data["feedback_ids"],
                                          actor=request.user)
        return Response(CapabilityVersionOutput(draft).data, status=201)
