"""Thin Celery tasks: load ids, call one service."""

from __future__ import annotations

from celery import shared_task

from registry import services


@shared_task(acks_late=True, autoretry_for=(Exception,), retry_backoff=True, max_retries=3)
def embed_capability_version(version_id: int) -> int:
    from registry.embedding_service import capability_version_embed
    from registry.models import CapabilityVersion

    version = CapabilityVersion.objects.filter(pk=version_id).first()
    if version is None:
        return 0
    count = capability_version_embed(version=version)
    from registry.signals import capability_vectors_changed

    capability_vectors_changed.send(sender=CapabilityVersion, version_ids=[version_id])
    return count


@shared_task(acks_late=True, autoretry_for=(Exception,), retry_backoff=True, max_retries=3)
def embed_capability_versions(version_ids: list[int]) -> int:
    """Many versions at once (an import): their texts go to the encoder in batches and the routing calibration is
    refitted once, not once per version."""
    from registry.embedding_service import capability_versions_embed
    from registry.models import CapabilityVersion

    versions = list(CapabilityVersion.objects.filter(pk__in=version_ids).order_by("pk"))
    if not versions:
        return 0
    count = capability_versions_embed(versions=versions)
    from registry.signals import capability_vectors_changed

    capability_vectors_changed.send(sender=CapabilityVersion, version_ids=[v.pk for v in versions])
    return count


@shared_task(acks_late=True)
def liveness_sweep() -> dict:
    """Beat task: move silent instances to SUSPECT/OFFLINE and probe the ones in doubt (never on a request path)."""
    changed = services.liveness_sweep()
    for instance_id in services.instances_to_probe():
        probe_instance.delay(instance_id)
    return changed


@shared_task(acks_late=True)
def probe_instance(instance_id: int) -> bool:
    from registry.models import Instance

    instance = Instance.objects.filter(pk=instance_id).first()
    if instance is None or not instance.health_url:
        return False
    ok = services.probe_health(instance.health_url)
    services.instance_probe_record(instance_id=instance_id, ok=ok)
    return ok
