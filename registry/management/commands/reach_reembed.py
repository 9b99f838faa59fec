"""python manage.py reach_reembed [--embedder SPEC]: rebuild every vector after the embedder changes."""

from __future__ import annotations

import re

from django.core.management.base import BaseCommand
from django.db.models import Q
from tqdm import tqdm

from registry.choices import VersionState
from registry.embedding import embedder_tag, get_embedder
from registry.embedding_service import capability_versions_embed
from registry.models import CapabilityVector, CapabilityVersion
from registry.signals import capability_vectors_changed


class Command(BaseCommand):
    help = "Re-embed the examples, negative cases and descriptions of every ACTIVE capability version."

    def add_arguments(self, parser):
        parser.add_argument("--embedder", default=None, help="Embedder spec (default: settings REACH_EMBEDDER).")
        parser.add_argument("--keep-others", action="store_true",
                            help="Keep vectors of other embedders (default: delete them).")
        parser.add_argument("--missing", action="store_true",
                            help="Only ACTIVE versions without a centroid for the embedder, or embedded by an older "
                                 "revision of it (implies --keep-others).")

    def handle(self, *args, embedder=None, keep_others=False, missing=False, **options):
        emb = get_embedder(embedder)
        qs = CapabilityVersion.objects.filter(state=VersionState.ACTIVE)
        if missing:
            keep_others = True
            current = CapabilityVector.objects.filter(embedder=emb.name, kind="centroid").values("version_id")
            # outdated: embedded by another revision of this embedder (embedded_with names only the last embedder, so
            # a version last embedded by another one is not outdated for this one while its vectors are there)
            older = Q(embedded_with__regex=rf"^{re.escape(emb.name)}( r[0-9]+)?$") & ~Q(embedded_with=embedder_tag(emb))
            qs = qs.filter(~Q(pk__in=current) | older)
        versions = list(qs)
        if missing and not versions:
            self.stdout.write("Every ACTIVE version has its vectors.")
            return
        step = 500  # versions per encoder call and transaction
        for start in tqdm(range(0, len(versions), step), desc=f"Embedding with {emb.name}", unit=f"{step} versions",
                          disable=options["verbosity"] == 0):
            capability_versions_embed(versions=versions[start:start + step], embedder=emb, chunk=step)
        if not keep_others:
            CapabilityVector.objects.exclude(embedder=emb.name).delete()
        capability_vectors_changed.send(sender=CapabilityVersion, version_ids=[v.pk for v in versions])
        self.stdout.write(f"Re-embedded {len(versions)} version(s) with {emb.name}.")
