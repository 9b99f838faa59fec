from django.db import migrations


def centroid_indexes(apps, schema_editor):
    """Rebuild every HNSW index over the centroids alone (see registry.vectors): the nearest-capability search is
    over centroids, and an index over every text row cost a 10,000-capability import 171 s.
    Where this server's pgvector cannot run HNSW there are none (0004), and none are made."""
    from registry.vectors import KNOWN_DIMS, create_hnsw_index_sql, pgvector_compute_enabled

    if not pgvector_compute_enabled():
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'registry_capvec_hnsw_%%'")
        names = [row[0] for row in cursor.fetchall()]
    dims = set(KNOWN_DIMS)
    for name in names:
        suffix = name.rsplit("_", 1)[-1]
        if suffix.isdigit():
            dims.add(int(suffix))
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')
    for dim in sorted(dims):
        schema_editor.execute(create_hnsw_index_sql(dim))


class Migration(migrations.Migration):
    dependencies = [("registry", "0006_a2a_cards")]
    operations = [migrations.RunPython(centroid_indexes, migrations.RunPython.noop)]
