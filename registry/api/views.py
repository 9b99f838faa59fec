from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from reach_platform.errors import NotFound
from registry import selectors, services
from registry.api.serializers import (
    AgentOutput,
    AgentUpdateInput,
    CapabilityVersionOutput,
    DeregisterInput,
    DraftCreateInput,
    DraftFields,
    HeartbeatInput,
    HeartbeatOutput,
    InstanceOutput,
    RegisterInput,
)
from registry.authentication import AgentKeyAuthentication, IsAgent
from registry.filters import AgentFilter, CapabilityVersionFilter, InstanceFilter
from registry.models import Agent, CapabilityVersion, Instance


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
    @extend_schema(request=HeartbeatInput, responses={200: HeartbeatOutput})
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
    queryset = Agent.objects.none()  # the model, for the schema; reads go through the selector
    serializer_class = AgentOutput
    filterset_class = AgentFilter
    lookup_field = "endpoint_id"

    def get_queryset(self):
        return selectors.agent_list(user=self.request.user)

    @extend_schema(request=AgentUpdateInput, responses={200: AgentOutput})
    def partial_update(self, request, endpoint_id=None):
        """Change an agent's display name, description or status (its own team or an admin only)."""
        data = AgentUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        agent = services.agent_update(agent=self.get_object(), actor=request.user, **data.validated_data)
        return Response(AgentOutput(selectors.agent_list(user=request.user).get(pk=agent.pk)).data)


class InstanceViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Instance.objects.none()
    serializer_class = InstanceOutput
    filterset_class = InstanceFilter

    def get_queryset(self):
        return selectors.instance_list(user=self.request.user)


class CapabilityVersionViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = CapabilityVersion.objects.none()
    serializer_class = CapabilityVersionOutput
    filterset_class = CapabilityVersionFilter

    def get_queryset(self):
        return selectors.capability_version_list(user=self.request.user)

    @extend_schema(request=DraftCreateInput, responses={201: CapabilityVersionOutput})
    def create(self, request):
        """Draft a new version of a capability (copied from its active version, with the fields given)."""
        from registry.models import Capability

        data = DraftCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        name = fields.pop("capability")
        capability = Capability.objects.select_related("agent").filter(name=name).first()
        if capability is None:
            raise NotFound(f"No capability '{name}'.")
        draft = services.capability_version_draft_create(capability=capability, actor=request.user, **fields)
        return Response(CapabilityVersionOutput(draft).data, status=201)

    @extend_schema(request=DraftFields, responses={200: CapabilityVersionOutput})
    def partial_update(self, request, pk=None):
        """Edit a draft (its own team only; anything past DRAFT is immutable)."""
        data = DraftFields(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.capability_version_draft_update(version=self.get_object(), actor=request.user,
                                                           **data.validated_data)
        return Response(CapabilityVersionOutput(version).data)
