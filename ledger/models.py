"""Money: a cost entry for every attempt, and budgets per team and per caller."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from registry.models import CapabilityVersion, Instance, Team


class CostEntry(models.Model):
    """What one attempt cost. Unit prices are copied in, so an entry keeps the price it was made at."""

    created_at = models.DateTimeField(db_index=True)
    week = models.CharField(max_length=8, help_text="ISO week, YYYY-Www.")
    request_id = models.CharField(max_length=100)
    agent_endpoint = models.CharField(max_length=100)
    team_slug = models.SlugField()
    version = models.ForeignKey(CapabilityVersion, null=True, on_delete=models.SET_NULL, related_name="+")
    instance = models.ForeignKey(Instance, null=True, on_delete=models.SET_NULL, related_name="+")
    caller = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    model_name = models.CharField(max_length=120, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    tokens_estimated = models.BooleanField(default=False, help_text="From the declared profile, not the agent.")
    latency_ms = models.FloatField(default=0)
    attempt_number = models.PositiveSmallIntegerField(default=1)
    is_retry = models.BooleanField(default=False)
    is_fallback = models.BooleanField(default=False)
    outcome = models.CharField(max_length=24)
    price_per_1k_input = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    price_per_1k_output = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)

    class Meta:
        indexes = [models.Index(fields=["week", "agent_endpoint"]), models.Index(fields=["week", "team_slug"])]
        verbose_name_plural = "cost entries"

    def __str__(self) -> str:
        return f"{self.request_id}#{self.attempt_number} {self.agent_endpoint} {self.cost}"


class Budget(models.Model):
    """A monthly spending cap for a team or a caller: work past it is refused (402), 80 % warns."""

    team = models.OneToOneField(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="budget")
    caller = models.OneToOneField(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                                  related_name="reach_budget")
    monthly_limit = models.DecimalField(max_digits=14, decimal_places=4)
    warn_ratio = models.FloatField(default=0.8)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(team__isnull=False) ^ models.Q(caller__isnull=False),
                                              name="budget_for_team_xor_caller")]

    def __str__(self) -> str:
        return f"budget of {self.team or self.caller}: {self.monthly_limit}/month"
