from __future__ import annotations

from rest_framework import serializers

from registry.choices import Transport
from registry.models import Agent, CapabilityVersion, Instance


class RegisterInput(serializers.Serializer):
    endpoint_id = serializers.SlugField(max_length=100)
    environment = serializers.SlugField(max_length=50)
    instance_id = serializers.CharField(max_length=100)
    url = serializers.URLField(max_length=500)
    transport = serializers.ChoiceField(choices=Transport.choices, default=Transport.HTTP)
    health_url = serializers.URLField(max_length=500, required=False, allow_blank=True, default="")
    status_url = serializers.URLField(max_length=500, required=False, allow_blank=True, default="")
    weight = serializers.IntegerField(min_value=0, max_value=10000, default=100)
    max_concurrency = serializers.IntegerField(min_value=1, max_value=100000, default=16)
    max_qps = serializers.FloatField(min_value=0.01, max_value=1e6, default=100.0)
    reg_version = serializers.IntegerField(min_value=0)
    started_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    display_name = serializers.CharField(max_length=200, required=False, default="")


class HeartbeatInput(serializers.Serializer):
    instance_id = serializers.CharField(max_length=100)
    in_flight = serializers.IntegerField(min_value=0, default=0)
    load = serializers.FloatField(min_value=0, max_value=1e6, default=0.0)


class DeregisterInput(serializers.Serializer):
    instance_id = serializers.CharField(max_length=100)


class InstanceOutput(serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="endpoint_id", read_only=True)

    class Meta:
        model = Instance
        fields = ["id", "agent", "instance_id", "url", "transport", "health_url", "status_url", "weight",
                  "max_concurrency", "max_qps", "reg_version", "started_at", "last_heartbeat_at", "liveness",
                  "in_flight", "load", "deregistered_at"]


class AgentOutput(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    environment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    instances = InstanceOutput(many=True, read_only=True)

    class Meta:
        model = Agent
        fields = ["id", "endpoint_id", "display_name", "description", "team", "environment", "status",
                  "instances", "created_at", "updated_at"]


class CapabilityVersionOutput(serializers.ModelSerializer):
    capability = serializers.CharField(source="capability.name", read_only=True)
    agent = serializers.CharField(source="capability.agent.endpoint_id", read_only=True)

    class Meta:
        model = CapabilityVersion
        exclude = ["source_digest", "submitted_by", "reviewed_by"]
