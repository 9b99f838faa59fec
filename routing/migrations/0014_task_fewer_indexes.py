"""The task row's indexes that nothing reads are dropped, and those kept get explicit names (``Task.Meta``).

The kept ones are renamed in place, not rebuilt: on a table of millions of tasks this migration takes no longer
than dropping a few indexes."""

from django.conf import settings
from django.db import migrations, models

_DROPPED = [
    # (name, definition to restore it with)
    ("routing_task_key_f3e2a50f_like", "(key varchar_pattern_ops)"),
    ("routing_task_status_fc1088e6_like", "(status varchar_pattern_ops)"),
    ("routing_task_text_hash_a2c5f637", "(text_hash)"),
    ("routing_task_text_hash_a2c5f637_like", "(text_hash varchar_pattern_ops)"),
    ("routing_task_agent_endpoint_55960443_like", "(agent_endpoint varchar_pattern_ops)"),
    ("routing_task_trace_id_8ad8d483_like", "(trace_id varchar_pattern_ops)"),
    ("routing_task_review_reason_a2bcaf4c", "(review_reason)"),
    ("routing_task_review_reason_a2bcaf4c_like", "(review_reason varchar_pattern_ops)"),
    ("routing_task_caller_id_d794cae2", "(caller_id)"),
]
_RENAMED = [  # (Django's generated name, the name Task.Meta gives it)
    ("routing_task_status_fc1088e6", "task_status"),
    ("routing_task_agent_endpoint_55960443", "task_agent_endpoint"),
    ("routing_task_trace_id_8ad8d483", "task_trace_id"),
]

_FORWARD = [f"DROP INDEX IF EXISTS {name}" for name, _ in _DROPPED] + [
    f"ALTER INDEX IF EXISTS {old} RENAME TO {new}" for old, new in _RENAMED] + [
    "ALTER TABLE routing_task RENAME CONSTRAINT routing_task_key_f3e2a50f_uniq TO task_key_unique"]
_BACKWARD = [f"CREATE INDEX IF NOT EXISTS {name} ON routing_task {columns}" for name, columns in _DROPPED] + [
    f"ALTER INDEX IF EXISTS {new} RENAME TO {old}" for old, new in _RENAMED] + [
    "ALTER TABLE routing_task RENAME CONSTRAINT task_key_unique TO routing_task_key_f3e2a50f_uniq"]


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0007_vector_indexes_over_centroids"),
        ("routing", "0013_a2a_push_config"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(_FORWARD, reverse_sql=_BACKWARD)],
            state_operations=[
                migrations.AlterField(model_name="task", name="key", field=models.CharField(max_length=100)),
                migrations.AlterField(model_name="task", name="caller", field=models.ForeignKey(
                    db_index=False, null=True, on_delete=models.deletion.SET_NULL, related_name="+",
                    to=settings.AUTH_USER_MODEL)),
                migrations.AlterField(model_name="task", name="status", field=models.CharField(
                    choices=[("pending", "Pending"), ("routed", "Routed"), ("accepted", "Accepted"),
                             ("running", "Running"), ("succeeded", "Succeeded"), ("failed", "Failed"),
                             ("needs_confirmation", "Needs confirmation"),
                             ("input_required", "Input required (the agent asks the caller)"),
                             ("manual_review", "Manual review"), ("cancelled", "Cancelled"),
                             ("dead_lettered", "Dead-lettered")], default="pending", max_length=24)),
                migrations.AlterField(model_name="task", name="text_hash",
                                      field=models.CharField(blank=True, max_length=32)),
                migrations.AlterField(model_name="task", name="agent_endpoint",
                                      field=models.CharField(blank=True, max_length=100)),
                migrations.AlterField(model_name="task", name="trace_id",
                                      field=models.CharField(blank=True, max_length=64)),
                migrations.AlterField(model_name="task", name="review_reason", field=models.CharField(
                    blank=True, choices=[("low_score", "Scored below the confirm band"),
                                         ("all_failed", "Every candidate failed"),
                                         ("dead_letter", "Callback dead-lettered")],
                    help_text="Why the task is (or was) in the manual review queue.", max_length=16)),
                migrations.AddConstraint(model_name="task", constraint=models.UniqueConstraint(
                    fields=("key",), name="task_key_unique")),
                migrations.AddIndex(model_name="task", index=models.Index(fields=["status"], name="task_status")),
                migrations.AddIndex(model_name="task", index=models.Index(fields=["agent_endpoint"],
                                                                          name="task_agent_endpoint")),
                migrations.AddIndex(model_name="task", index=models.Index(fields=["trace_id"],
                                                                          name="task_trace_id")),
            ],
        ),
    ]
