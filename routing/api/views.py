from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.authentication import AgentKeyAuthentication, IsAgent
from routing import lifecycle, resolver, selectors
from routing.api.headers import invoke_headers
from routing.api.serializers import (
    CallbackInput,
    InvokeInput,
    ResolveInput,
    TaskDetailOutput,
    TaskOutput,
    task_output,
)
from routing.choices import TERMINAL, TaskStatus
from routing.invoke import task_invoke

HTTP_STATUS: dict[str, int] = {TaskStatus.SUCCEEDED: 200, TaskStatus.FAILED: 502, TaskStatus.NEEDS_CONFIRMATION: 200,
               TaskStatus.MANUAL_REVIEW: 202, TaskStatus.ACCEPTED: 202, TaskStatus.RUNNING: 202,
               TaskStatus.PENDING: 202, TaskStatus.ROUTED: 202}


class ResolveView(APIView):
    """A dry run of the routing decision: no task, no call, no side effect."""

    @extend_schema(request=ResolveInput, responses={200: dict})
    def post(self, request):
        data = ResolveInput(data=request.data)
        data.is_valid(raise_exception=True)
        resolution = resolver.resolve(**data.validated_data)
        return Response(resolution.as_dict())


class InvokeView(APIView):
    @extend_schema(request=InvokeInput, responses={200: TaskOutput, 202: TaskOutput, 502: TaskOutput})
    def post(self, request):
        data = InvokeInput(data=request.data)
        data.is_valid(raise_exception=True)
        task = task_invoke(caller=request.user, headers=invoke_headers(request.headers), **data.validated_data)
        status = 202 if task.mode == "async" and task.status not in TERMINAL else HTTP_STATUS.get(task.status, 200)
        return Response(task_output(task), status=status)


class TaskCallbackView(APIView):
    """An http-async agent reports on a task it ACKed (agent credentials)."""

    authentication_classes = [AgentKeyAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(request=CallbackInput, responses={200: TaskOutput})
    def post(self, request, request_id: str):
        data = CallbackInput(data=request.data)
        data.is_valid(raise_exception=True)
        task = lifecycle.task_callback(entry=request.auth, request_id=request_id, **data.validated_data)
        return Response(TaskOutput(task).data)


class TaskView(APIView):
    @extend_schema(responses={200: TaskDetailOutput})
    def get(self, request, request_id: str):
        task = selectors.task_for_caller(request_id=request_id, caller=request.user)
        return Response(TaskDetailOutput(task).data)


class A2APushView(APIView):
    """An A2A agent pushes an update on an async task it took (an A2A StreamResponse). Authenticated by the push
    token the gateway gave in the push config (``X-A2A-Notification-Token``, or ``Authorization: Bearer``), not
    by an account."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request=dict, responses={200: dict})
    def post(self, request, task_pk: int, instance_pk: int):
        token = request.headers.get("X-A2A-Notification-Token", "")
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        if not token and scheme.lower() == "bearer":
            token = credentials.strip()
        task = lifecycle.task_a2a_push(task_pk=task_pk, instance_pk=instance_pk, token=token, event=request.data)
        return Response({"status": task.status})
