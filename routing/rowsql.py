"""Hand-written statements for the invoke path's few hot writes (the claim of a task, the state machine's
compare-and-set with its rows), built once per shape and run as prepared statements.

Django's compilers build an INSERT anew for every call and bind its values one field at a time on the client:
with four INSERTs per invoke that was the largest part of a gateway process's CPU (bench/gateway_profile.py
under yappi). Here the rows of a table travel as one JSON parameter that PostgreSQL unpacks into the table's
row type (``jsonb_populate_recordset``), so a statement's text depends only on which tables it writes, and
PostgreSQL parses and plans it once per connection (``prepare=True``).
"""

from __future__ import annotations

import datetime
import decimal
import json
from functools import cache
from typing import TypeVar, cast

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, IntegrityError, connection, connections, models

from reach_platform import engine, jsonsafe

M = TypeVar("M", bound=models.Model)


@cache
def _ops_connection():
    """A database wrapper for what needs no connection (adapting a value to its column), made once per process and
    never connected. Django's ``connection`` is a proxy: every attribute read finds this thread's wrapper again, and
    on the engine loop that wrapper is a context variable, so each request's task built one of its own (60 us) and
    then looked it up for every field it wrote (2 % of a gateway process's CPU, bench/slow_agents.py under py-spy)."""
    return connections.create_connection(DEFAULT_DB_ALIAS)


@cache
def _columns(model: type[models.Model]) -> tuple[tuple[str, str, models.Field], ...]:
    """(attribute, column, field) of the columns an INSERT writes: every concrete field but the primary key."""
    return tuple((f.attname, str(f.column), f) for f in model._meta.concrete_fields if not f.primary_key)


@cache
def _init_plan(model: type[models.Model]) -> tuple[tuple[str, str, models.Field, bool], ...]:
    return tuple((f.attname, f.name, f, bool(f.many_to_one)) for f in model._meta.concrete_fields)


def build(model: type[M], **values) -> M:
    """``model(**values)`` for the invoke path's new rows (the task, its events and attempts), built
    as Django builds a loaded row: every concrete field's value in order, positionally (the other fields get their
    defaults, a related object given by its field name is cached as the keyword form caches it). Django's keyword
    path looks each field up in the keywords and through its descriptor: 55 against 29 us for a task, 19 against
    11 us for an event (bench/slow_agents.py's gateway process spent 6 % of its samples in ``Model.__init__``)."""
    args, related, used = [], [], 0
    for attname, name, field, many_to_one in _init_plan(model):
        if attname in values:
            args.append(values[attname])
        elif name in values:
            value = values[name]
            if many_to_one:
                args.append(None if value is None else value.pk)
                related.append((field, value))
            else:
                args.append(value)
        else:
            args.append(field.get_default())
            continue
        used += 1
    if used != len(values):
        known = {n for a, name, _, _ in _init_plan(model) for n in (a, name)}
        raise TypeError(f"{model.__name__}() got unexpected keyword arguments: {sorted(set(values) - known)}")
    obj = model(*args)
    for field, value in related:
        field.set_cached_value(obj, value)  # type: ignore[attr-defined]  # a ForeignKey (many_to_one)
    return obj


@cache
def insert_from_json(model: type[models.Model], *, when: str = "") -> str:
    """``INSERT INTO <table> (...) SELECT ... FROM`` the rows of one JSON parameter (``%s``); ``when`` adds a
    WHERE clause (e.g. that a compare-and-set matched)."""
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(column) for _, column, _ in _columns(model))
    picked = ", ".join(f"r.{connection.ops.quote_name(column)}" for _, column, _ in _columns(model))
    where = f" WHERE {when}" if when else ""
    return (f"INSERT INTO {table} ({names}) SELECT {picked} "
            f"FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb) AS r{where}")


def _plain(value):
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def plain_json(value) -> str:
    """``value`` as the JSON that ``rows_json`` writes into a jsonb column."""
    return jsonsafe.dumps(value, default=_plain).decode()


def rows_json(model: type[models.Model], objs, *, add: bool = True) -> str:
    """The rows of ``objs`` (unsaved instances of ``model``) as one JSON array, keyed by column. Fields fill in
    what they would on save (``auto_now_add``). A JSON field's value is nested as it is (a jsonb column takes it
    whole)."""
    rows = []
    for obj in objs:
        row = {}
        for attname, column, field in _columns(model):
            row[column] = field.pre_save(obj, add) if add else getattr(obj, attname)
        rows.append(row)
    return plain_json(rows)


@cache
def _assignments(model: type[models.Model], names: tuple[str, ...]) -> tuple[str, tuple[models.Field, ...]]:
    fields = tuple(cast(models.Field, model._meta.get_field(name)) for name in names)
    return ", ".join(f"{connection.ops.quote_name(str(f.column))} = %s{'::jsonb' if _is_json(f) else ''}"
                     for f in fields), fields


def _is_json(field: models.Field) -> bool:
    return isinstance(field, models.JSONField)


def update_values(model: type[models.Model], obj, names) -> tuple[str, list]:
    """The ``"col" = %s, ...`` assignments (built once per set of fields) and their values for the fields
    ``names`` of ``obj``, adapted as Django would write them; a JSON field's value goes as JSON text written by
    orjson (as ``rows_json`` writes them; Django's adapter ran the standard library's encoder)."""
    sql, fields = _assignments(model, tuple(names))
    ops = _ops_connection()
    return sql, [_json_text(getattr(obj, field.attname), field.null) if _is_json(field)
                 else field.get_db_prep_save(getattr(obj, field.attname), ops) for field in fields]


def _json_text(value, nullable: bool) -> str | None:
    """None is SQL NULL where the column takes it (as Django writes it), else JSON null."""
    return None if value is None and nullable else jsonsafe.dumps(value, default=_plain).decode()


@cache
def returning(model: type[models.Model]) -> str:
    """``RETURNING`` every concrete column of ``model``, in the order ``instance`` reads them."""
    return "RETURNING " + ", ".join(connection.ops.quote_name(str(f.column)) for f in model._meta.concrete_fields)


def from_rows_json(model: type[M], text: str, pk) -> M:
    """The instance whose row ``rows_json`` wrote (its only row) and the INSERT saved under ``pk``, as a query would
    have loaded it: each value parsed by its field."""
    (row,) = json.loads(text)
    names, values = ["pk"], [pk]
    for attname, column, field in _columns(model):
        names.append(attname)
        values.append(row[column] if isinstance(field, models.JSONField) else field.to_python(row[column]))
    obj = model(**dict(zip(names, values, strict=True)))
    obj._state.adding, obj._state.db = False, DEFAULT_DB_ALIAS
    return obj


def instance(model: type[models.Model], values: tuple):
    """A model instance from a row of ``returning(model)``, as a query would have loaded it (a JSON column, text on
    the loop's connections, parsed by its field)."""
    fields = model._meta.concrete_fields
    converted = [json.loads(v, cls=f.decoder) if isinstance(v, str) and isinstance(f, models.JSONField) else v
                 for f, v in zip(fields, values, strict=True)]
    return model.from_db(DEFAULT_DB_ALIAS, [f.attname for f in fields], converted)


def _prepare() -> bool | None:
    return True if settings.REACH["DB_PREPARE"] else None


def fetch(sql: str, params: list) -> list[tuple]:
    """Run one statement on this thread's Django connection with server-side parameters, prepared (parsed and
    planned once per connection and statement text, unless ``REACH_DB_PREPARE`` is off), and return its rows.
    Errors come as Django's (an ``IntegrityError`` stays one). Outside a transaction the statement is its own."""
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:  # as Django connects: prepare=True would be ignored (engine.prepare_threshold)
        raw.prepare_threshold = engine.prepare_threshold()
    with connection.wrap_database_errors, psycopg.Cursor(raw) as cursor:
        cursor.execute(sql, params, prepare=_prepare())
        return cursor.fetchall() if cursor.description is not None else []


async def _afetch(pool, sql: str, params: list) -> list[tuple]:
    async with pool.connection() as conn:
        cursor = await conn.execute(sql, params, prepare=_prepare())
        return await cursor.fetchall() if cursor.description is not None else []


async def afetch(sql: str, params: list) -> list[tuple]:
    """``fetch`` awaited on the engine loop, on a connection of the loop's pool (``engine.pg``): the statement is
    its own transaction. Under ``engine.run_in_caller_thread`` it runs in the caller's thread and transaction."""
    if engine.in_caller_thread():
        return await engine.db(fetch, sql, params)
    pool = await engine.pg()
    try:
        return await engine.off_gate(_afetch(pool, sql, params))
    except psycopg.IntegrityError as exc:
        raise IntegrityError(*exc.args) from exc
    except psycopg.Error as exc:
        raise DatabaseError(*exc.args) from exc
