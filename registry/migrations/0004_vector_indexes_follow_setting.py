from django.db import migrations


def sync_vector_indexes(apps, schema_editor):
    """Drop the HNSW indexes where this server's pgvector cannot run them (they crash it on insert), create them
    where it can (registry.vectors.pgvector_compute_enabled)."""
    from registry.vectors import create_hnsw_index_sql, pgvector_compute_enabled

    if pgvector_compute_enabled():
        for dim in (384, 512, 768):
            schema_editor.execute(create_hnsw_index_sql(dim))
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'registry_capvec_hnsw_%%'")
        names = [row[0] for row in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    dependencies = [("registry", "0003_instance_versions")]
    operations = [migrations.RunPython(sync_vector_indexes, migrations.RunPython.noop)]
