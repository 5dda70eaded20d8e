"""The stored schema of each type, and how it may evolve.

Each table's fields are recorded in ``_sprout_schema`` (name -> each field's kind, target
type and nullability). When a type is opened again:

* a new field with a default (or Optional) becomes a new column, existing rows taking the
  default; a new list of dataclasses becomes a new link table;
* a field whose kind, target type or nullability changed, a removed field, or a new field
  without a default is an incompatible change: :class:`SchemaError` names the field and
  nothing is changed;
* indexes declared since are created.

All of it happens in one transaction. ``drop`` removes a type's table, link tables and
record (``Database.drop``).
"""

import json

from .codegen import _encode_datetime
from .errors import SchemaError
from .sql import SCHEMA_TABLE, link_table


def _encode_default(f, value):
    if value is None:
        return None
    if f.kind == "datetime":
        return _encode_datetime(value)
    if f.kind == "date":
        return value.isoformat()
    if f.kind == "enum":
        return value.name
    if f.kind == "json":
        return json.dumps(value, separators=(",", ":"))
    if f.kind == "ref":
        raise SchemaError(f"a new reference field {f.name!r} can only default to None")
    if f.kind == "float":
        return float(value)
    return value


def _table_exists(backend, name):
    if backend.dialect.name == "sqlite":
        return bool(backend.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)))
    return bool(backend.rows("SELECT 1 FROM information_schema.tables WHERE table_name = %s AND table_schema = current_schema()", (name,)))


def ensure(backend, model):
    """Create or evolve the tables of ``model``; SchemaError on incompatible changes."""
    d = backend.dialect
    p = d.param
    backend.execute(f'CREATE TABLE IF NOT EXISTS "{SCHEMA_TABLE}" (name TEXT PRIMARY KEY, fields TEXT NOT NULL)')
    current = {f.name: f.signature() for f in model.fields}
    qualname = model.cls.__qualname__
    with backend.transaction():
        row = backend.rows(f'SELECT fields FROM "{SCHEMA_TABLE}" WHERE name = {p}', (model.table,))
        if not row:
            if _table_exists(backend, model.table):
                raise SchemaError(f"a table {model.table!r} exists but was not made by sprout.store; "
                                  "name the type otherwise (__sprout_table__)")
            for statement in d.create_table(model):
                backend.execute(statement)
            backend.execute(f'INSERT INTO "{SCHEMA_TABLE}" (name, fields) VALUES ({p}, {p})', (model.table, json.dumps(current)))
            return
        stored = json.loads(row[0][0])
        for name, signature in current.items():
            if name in stored and stored[name] != signature:
                raise SchemaError(
                    f"{qualname}.{name} changed from {_describe(stored[name])} to {_describe(signature)}: "
                    f"rows stored as the old type cannot be read as the new one; nothing was changed"
                )
        removed = [name for name in stored if name not in current]
        if removed:
            raise SchemaError(f"{qualname} no longer has the stored field(s) {', '.join(removed)}; nothing was changed")
        added = [f for f in model.fields if f.name not in stored]
        for f in added:
            if f.kind == "reflist":
                backend.execute(
                    f'CREATE TABLE "{link_table(model, f)}" (owner {d.types["int"]} NOT NULL, '
                    f'position {d.types["int"]} NOT NULL, target {d.types["int"]} NOT NULL, PRIMARY KEY (owner, position))'
                )
                continue
            if not f.nullable and not f.has_default:
                raise SchemaError(f"{qualname}.{f.name} is new and has no default for the rows already stored; "
                                  "give it one; nothing was changed")
            default = _encode_default(f, f.default_value() if f.has_default else None)
            backend.execute(d.add_column(model, f, d.literal(f, default)))
        for statement in d.indexes(model):
            backend.execute(statement)
        if added:
            backend.execute(f'UPDATE "{SCHEMA_TABLE}" SET fields = {p} WHERE name = {p}', (json.dumps(current), model.table))


def drop(backend, model):
    """Drop ``model``'s table, its link tables and its schema record; whether it existed.
    A table of that name not made by sprout.store is left alone (SchemaError)."""
    p = backend.dialect.param
    backend.execute(f'CREATE TABLE IF NOT EXISTS "{SCHEMA_TABLE}" (name TEXT PRIMARY KEY, fields TEXT NOT NULL)')
    with backend.transaction():
        row = backend.rows(f'SELECT fields FROM "{SCHEMA_TABLE}" WHERE name = {p}', (model.table,))
        if not row:
            if _table_exists(backend, model.table):
                raise SchemaError(f"the table {model.table!r} was not made by sprout.store: it is not dropped")
            return False
        # The link tables the stored version of the type has (it may differ from the current).
        stored = json.loads(row[0][0])
        for name, signature in sorted(stored.items()):
            if signature.startswith("reflist:"):
                backend.execute(f'DROP TABLE IF EXISTS "{model.table}__{name}"')
        backend.execute(f'DROP TABLE IF EXISTS "{model.table}"')
        backend.execute(f'DELETE FROM "{SCHEMA_TABLE}" WHERE name = {p}', (model.table,))
        return True


def _describe(signature):
    kind, target, null = signature.split(":")
    name = target or kind
    return f"{name}{' or None' if null == 'null' else ''}"

