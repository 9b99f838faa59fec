"""Keep routing's caches and calibration in step with the registry."""

from __future__ import annotations

from django.db.models.signals import post_save
from django.dispatch import receiver

from registry.models import CapabilityVersion, Instance
from registry.signals import capability_vectors_changed
from routing.snapshot import bump_generation


@receiver(capability_vectors_changed)
def _vectors_changed(sender, version_ids, **kwargs):
    from django.conf import settings

    from routing.tasks import recalibrate_soon

    bump_generation()
    if settings.REACH.get("RECALIBRATE_INLINE"):
        from routing.calibration_service import calibration_refresh

        calibration_refresh()
    else:
        recalibrate_soon()


@receiver(post_save, sender=CapabilityVersion)
@receiver(post_save, sender=Instance)
def _registry_changed(sender, **kwargs):
    bump_generation()  # once the change commits
