"""The errors sprout.store raises, each naming what was wrong."""


class StoreError(Exception):
    """Base of every sprout.store error."""


class ConnectError(StoreError):
    """The database cannot be opened: not a database, unreachable server, bad URL."""


class SchemaError(StoreError):
    """A type cannot be stored, or its stored schema changed incompatibly (nothing changed)."""


class ValidationError(StoreError, TypeError):
    """A value does not match its declared type; nothing was written."""

    def __init__(self, type_name, field, expected, value):
        self.field = field
        super().__init__(f"{type_name}.{field} must be {expected}, not {type(value).__name__} ({value!r:.60})")


class QueryError(StoreError, TypeError):
    """A query names a field that does not exist or compares it with the wrong type."""


class ConflictError(StoreError):
    """Optimistic concurrency: the row changed since this object was read."""


class NotFound(StoreError, KeyError):
    """No row has that id."""

    def __str__(self):
        return str(self.args[0]) if self.args else "not found"
