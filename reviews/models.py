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
