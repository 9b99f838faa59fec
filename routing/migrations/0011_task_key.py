"""request_ids become per caller: ``Task.key`` (unique) takes over as the task's id outside the caller's API; the
existing tasks keep their request_id as their key."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("routing", "0010_input_required")]

    operations = [
        migrations.AddField(model_name="task", name="key", field=models.CharField(max_length=100, null=True)),
        migrations.RunSQL("UPDATE routing_task SET key = request_id", reverse_sql=migrations.RunSQL.noop),
        migrations.AlterField(model_name="task", name="key", field=models.CharField(max_length=100, unique=True)),
        migrations.AlterField(model_name="task", name="request_id", field=models.CharField(max_length=100)),
        migrations.AddConstraint(model_name="task", constraint=models.UniqueConstraint(
            fields=["caller", "request_id"], name="task_request_id_per_caller")),
    ]
