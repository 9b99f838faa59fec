from __future__ import annotations

from rest_framework import serializers

from registry.choices import Liveness, Transport
from registry.models import Agent, CapabilityVersion, Instance

# The largest values the columns hold (PostgreSQL integer and bigint).
INT_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1


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
    reg_version = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX)
    started_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    display_name = serializers.CharField(max_length=200, required=False, default="")
    versions = serializers.ListField(child=serializers.CharField(max_length=40), required=False, default=list,
                                     max_length=50, help_text="Capability versions this instance serves "
                                                              "(default: all).")


class HeartbeatInput(serializers.Serializer):
    instance_id = serializers.CharField(max_length=100)
    in_flight = serializers.IntegerField(min_value=0, max_value=INT_MAX, default=0)
    load = serializers.FloatField(min_value=0, max_value=1e6, default=0.0)


class HeartbeatOutput(serializers.Serializer):
    instance_id = serializers.CharField()
    liveness = serializers.ChoiceField(choices=Liveness.choices)


class DeregisterInput(serializers.Serializer):
    instance_id = serializers.CharField(max_length=100)


class InstanceOutput(serializers.ModelSerializer):
    agent: serializers.SlugRelatedField = serializers.SlugRelatedField(slug_field="endpoint_id", read_only=True)

    class Meta:
        model = Instance
        fields = ["id", "agent", "instance_id", "url", "transport", "health_url", "status_url", "weight",
                  "max_concurrency", "max_qps", "versions", "reg_version", "started_at", "last_heartbeat_at", "liveness",
                  "in_flight", "load", "deregistered_at"]


class AgentOutput(serializers.ModelSerializer):
    team: serializers.SlugRelatedField = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    environment: serializers.SlugRelatedField = serializers.SlugRelatedField(slug_field="name", read_only=True)
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


class AgentUpdateInput(serializers.Serializer):
    display_name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10000)
    status = serializers.ChoiceField(choices=["active", "disabled"], required=False)


class DraftFields(serializers.Serializer):
    """What a team writes in a capability version (all optional: a draft copies the active version)."""

    description = serializers.CharField(required=False, allow_blank=True, max_length=10000)
    action = serializers.CharField(required=False, max_length=40)
    domains = serializers.ListField(child=serializers.CharField(max_length=60), required=False, max_length=50)
    tags = serializers.ListField(child=serializers.CharField(max_length=60), required=False, max_length=50)
    keywords = serializers.ListField(child=serializers.CharField(max_length=100), required=False, max_length=200)
    languages = serializers.ListField(child=serializers.CharField(max_length=10), required=False, max_length=20)
    examples = serializers.ListField(child=serializers.CharField(max_length=2000), required=False, max_length=1000)
    negative_cases = serializers.ListField(child=serializers.CharField(max_length=2000), required=False,
                                           max_length=1000)
    reject_conditions = serializers.ListField(child=serializers.DictField(), required=False, max_length=50)
    input_schema = serializers.DictField(required=False)
    output_schema = serializers.DictField(required=False)
    idempotent = serializers.BooleanField(required=False)
    timeout_ms = serializers.IntegerField(required=False, min_value=1, max_value=3_600_000)
    max_retries = serializers.IntegerField(required=False, min_value=0, max_value=10)
    avg_latency_ms = serializers.FloatField(required=False, min_value=0, max_value=1e9)
    p95_latency_ms = serializers.FloatField(required=False, min_value=0, max_value=1e9)
    avg_tokens_per_call = serializers.IntegerField(required=False, min_value=0, max_value=INT_MAX)
    cost_per_call = serializers.DecimalField(required=False, max_digits=12, decimal_places=6, min_value=0)
    price_per_1k_input_tokens = serializers.DecimalField(required=False, max_digits=12, decimal_places=6,
                                                         min_value=0)
    price_per_1k_output_tokens = serializers.DecimalField(required=False, max_digits=12, decimal_places=6,
                                                          min_value=0)
    model_name = serializers.CharField(required=False, allow_blank=True, max_length=120)


class DraftCreateInput(DraftFields):
    capability = serializers.CharField(max_length=120)
    version = serializers.CharField(max_length=40, required=False, default="")
