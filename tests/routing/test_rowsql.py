"""The invoke path's hand-written statements are prepared: parsed and planned once per connection, not per call."""

from __future__ import annotations

import pytest
from django.db import connection

from reach_platform import engine
from routing import rowsql

SQL = "SELECT %s::int + 41"
PREPARED = "SELECT count(*) FROM pg_prepared_statements WHERE statement = 'SELECT $1::int + 41'"


@pytest.mark.django_db
def test_a_statement_run_through_rowsql_is_prepared_on_djangos_connection():
    # given Django's connection (Django connects with prepared statements disabled)
    assert rowsql.fetch(SQL, [1]) == [(42,)]
    assert rowsql.fetch(SQL, [2]) == [(43,)]
    with connection.cursor() as cursor:
        cursor.execute(PREPARED)
        assert cursor.fetchone()[0] == 1
        # and the ORM's own statements are not prepared behind its back
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%django_migrations%%'")
        assert cursor.fetchone()[0] == 0


@pytest.mark.django_db(transaction=True)
def test_the_loops_connections_prepare_what_asks_for_it_unless_prepares_are_off(settings):
    async def run_twice_and_count():
        pool = await engine.pg()
        async with pool.connection() as conn:
            for value in (1, 2):
                await conn.execute(SQL, [value], prepare=rowsql._prepare())
            return (await (await conn.execute(PREPARED)).fetchone())[0]

    assert engine.run(run_twice_and_count(), timeout=30) == 1
    # with REACH_DB_PREPARE off (e.g. behind a transaction pooler) nothing is prepared
    settings.REACH = {**settings.REACH, "DB_PREPARE": False}
    assert engine.prepare_threshold() is None and rowsql._prepare() is None


@pytest.mark.django_db
def test_rows_built_positionally_equal_keyword_built_ones():
    # the invoke path builds its new rows positionally (rowsql.build): the same instance as the keyword form
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from routing.models import Task, TaskEvent

    caller = get_user_model().objects.create_user("rowsql-build")
    values = dict(request_id="r-1", key="r-1", caller=caller, mode="sync", payload={"a": 1}, top_k=3,
                  retry_budget=2, call_path=["x"], options={"action": "read"})
    built, reference = rowsql.build(Task, **values), Task(**values)
    for field in Task._meta.concrete_fields:
        if field.name not in ("created_at", "updated_at"):
            assert getattr(built, field.attname) == getattr(reference, field.attname), field.name
    assert built.caller is caller and built._state.adding
    built.save()
    event = rowsql.build(TaskEvent, task=built, at=timezone.now(), from_status="", to_status="pending")
    assert event.task is built and event.task_id == built.pk and event.detail == {}
    with pytest.raises(TypeError, match="unexpected keyword arguments: \\['nope'\\]"):
        rowsql.build(TaskEvent, task=built, nope=1)
