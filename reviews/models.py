"""People's decisions about routing: labelled feedback that can become new examples."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from registry.models import CapabilityVersion
from routing.models import Task


class RoutingFeedback(models.Model):
    """A labelled routing example from real traffic: request text -> the capability it was routed to, and
    whether that was right (from a caller, or a reviewer's resolution)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="feedback")
    request_text = models.TextField(blank=True)
    capability = models.CharField(max_length=120, blank=True, help_text="Where it was routed ('' for none).")
    correct = models.BooleanField()
    comment = models.TextField(blank=True)
    source = models.CharField(max_length=20, default="caller")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    promoted_to = models.ForeignKey(CapabilityVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+", help_text="The draft version this example was promoted into.")

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "routing feedback"
        verbose_name_plural = "routing feedback"

    def __str__(self) -> str:
        return f"{'right' if self.correct else 'wrong'}: {self.capability or 'none'} for {self.task_id}"


class ReviewClaim(models.Model):
    """A reviewer's hold on one manual-review item (a task in MANUAL_REVIEW); at most one per task."""

    class Resolution(models.TextChoices):
        ANSWERED = "answered", "Answered by hand"
        REDISPATCHED = "redispatched", "Re-dispatched to a chosen agent"
        REPLAYED = "replayed", "Callback replayed"
        REJECTED = "rejected", "Rejected"

    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="review_claim")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    claimed_at = models.DateTimeField(auto_now_add=True)
    resolution = models.CharField(max_length=12, choices=Resolution.choices, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.task_id} claimed by {self.reviewer}"


class ReviewItem(Task):
    """The manual review queue: a view over routing's tasks that need a person (low score, every candidate
    failed, dead-lettered callback) plus the claim row above."""

    class Meta:
        proxy = True
        verbose_name = "manual review item"
        verbose_name_plural = "manual review queue"
        ordering = ["created_at"]
