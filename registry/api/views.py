from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors, services
from registry.api.serializers import (
    AgentOutput,
    CapabilityVersionOutput,
    DeregisterInput,
    HeartbeatInput,
    InstanceOutput,
    RegisterInput,
)
from registry.authentication import AgentKeyAuthentication, IsAgent
from registry.filters import AgentFilter, CapabilityVersionFilter, InstanceFilter


class AgentCommandView(APIView):
    authentication_classes = [AgentKeyAuthentication]
    permission_classes = [IsAgent]


class RegisterView(AgentCommandView):
    @extend_schema(request=RegisterInput, responses={201: InstanceOutput})
    def post(self, request):
        data = RegisterInput(data=request.data)
        data.is_valid(raise_exception=True)
        instance = services.agent_register(entry=request.auth, **data.validated_data)
        return Response(InstanceOutput(instance).data, status=201)


class HeartbeatView(AgentCommandView):
    @extend_schema(request=HeartbeatInput, responses={200: InstanceOutput})
    def post(self, request):
        data = HeartbeatInput(data=request.data)
        data.is_valid(raise_exception=True)
        instance = services.agent_heartbeat(entry=request.auth, **data.validated_data)
        return Response({"instance_id": instance.instance_id, "liveness": instance.liveness})


class DeregisterView(AgentCommandView):
    @extend_schema(request=DeregisterInput, responses={200: InstanceOutput})
    def post(self, request):
        data = DeregisterInput(data=request.data)
        data.is_valid(raise_exception=True)
        instance = services.agent_deregister(entry=request.auth, **data.validated_data)
        return Response(InstanceOutput(instance).data)


class AgentViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = AgentOutput
    filterset_class = AgentFilter
    lookup_field = "endpoint_id"

    def get_queryset(self):
        return selectors.agent_list()


class InstanceViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = InstanceOutput
    filterset_class = InstanceFilter

    def get_queryset(self):
        return selectors.instance_list()


class CapabilityVersionViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = CapabilityVersionOutput
    filterset_class = CapabilityVersionFilter

    def get_queryset(self):
        return selectors.capability_version_list()
