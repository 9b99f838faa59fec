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


class AnswerInput(serializers.Serializer):
    answer = serializers.JSONField()


class ReasonInput(serializers.Serializer):
    reason = serializers.CharField(max_length=2000)


def _waiting(request_id: str):
    from routing.models import Task

    task = Task.objects.filter(request_id=request_id).first()
    if task is None:
        raise NotFound(f"No task with request_id '{request_id}'.")
    return task


class QueueListView(APIView):
    """Items waiting for a reviewer, oldest first."""

    @extend_schema(responses={200: dict})
    def get(self, request):
        from routing.models import Task

        items = (Task.objects.filter(status="manual_review").order_by("created_at")
                 .values("request_id", "task_text", "created_at", "decision__score")[:200])
        return Response({"count": len(items), "results": list(items)})


class ClaimView(APIView):
    @extend_schema(request=None, responses={200: dict})
    def post(self, request, request_id: str):
        claim = services.queue_claim(task=_waiting(request_id), reviewer=request.user)
        return Response({"request_id": request_id, "reviewer": claim.reviewer.get_username()})


class AnswerView(APIView):
    @extend_schema(request=AnswerInput, responses={200: dict})
    def post(self, request, request_id: str):
        data = AnswerInput(data=request.data)
        data.is_valid(raise_exception=True)
        task = services.queue_answer(task=_waiting(request_id), reviewer=request.user, **data.validated_data)
        return Response({"request_id": task.request_id, "status": task.status})


class QueueRejectView(APIView):
    @extend_schema(request=ReasonInput, responses={200: dict})
    def post(self, request, request_id: str):
        data = ReasonInput(data=request.data)
        data.is_valid(raise_exception=True)
        task = services.queue_reject(task=_waiting(request_id), reviewer=request.user, **data.validated_data)
        return Response({"request_id": task.request_id, "status": task.status})
