"""People's decisions about routing: labelled feedback that can become new examples."""

from __future__ import annotations

from django.conf import settings
from django.db import models

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

    def __str__(self) -> str:
        return f"{'right' if self.correct else 'wrong'}: {self.capability or 'none'} for {self.task_id}"


class ReviewClaim(models.Model):
    """A reviewer's hold on one manual-review item (a task in MANUAL_REVIEW); at most one per task."""

    class Resolution(models.TextChoices):
        ANSWERED = "answered", "Answered by hand"
        REJECTED = "rejected", "Rejected"

    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="review_claim")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    claimed_at = models.DateTimeField(auto_now_add=True)
    resolution = models.CharField(max_length=12, choices=Resolution.choices, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.task_id} claimed by {self.reviewer}"
