"""Typed queries: field references, conditions and the query builder.

``table.fields.age >= 18`` is a condition, checked as it is built: a field that does not
exist, a comparison with a value of the wrong type, an ordering of an unordered field or a
substring test on a non-text field raises :class:`QueryError` at once, never in the database.
Conditions combine with ``&``, ``|`` and ``~`` (or :class:`And`, :class:`Or`, :class:`Not`).
:class:`Contains`, :class:`In` and :class:`IsNull` are also methods of a field reference.
"""

import datetime as _dt

from .codegen import _encode_datetime
from .errors import QueryError
from .model import ORDERED_KINDS


class Condition:
    """A boolean expression over one table's fields."""

    def __and__(self, other):
        return And(self, other)

    def __or__(self, other):
        return Or(self, other)

    def __invert__(self):
        return Not(self)

    def __bool__(self):
        raise QueryError("a condition has no truth value: combine conditions with &, | and ~, not and/or/not")

    def sql(self, dialect, params):
        """SQL for this condition, appending its parameters to ``params``."""
        raise NotImplementedError


class FieldRef:
    """A typed reference to one field of a stored type, for building conditions."""

    __slots__ = ("table", "field")

    def __init__(self, table, field):
        self.table = table
        self.field = field

    def __repr__(self):
        return f"{self.table.model.cls.__qualname__}.{self.field.name}"

    __hash__ = object.__hash__

    @property
    def column(self):
        return f'"{self.field.name}"'

    def operand(self, value, what="compared with"):
        """``value`` as stored in this field's column; QueryError when it cannot be."""
        f = self.field
        k = f.kind
        wrong = lambda expected: QueryError(f"{self!r} is {expected}: it cannot be {what} {value!r}")
        if k == "int":
            if type(value) is not int:
                raise wrong("an int")
            return value
        if k == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise wrong("a float")
            return float(value)
        if k == "bool":
            if type(value) is not bool:
                raise wrong("a bool")
            return value
        if k == "str":
            if not isinstance(value, str):
                raise wrong("a str")
            return value
        if k == "bytes":
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise wrong("bytes")
            return bytes(value)
        if k == "datetime":
            if not isinstance(value, _dt.datetime):
                raise wrong("a datetime")
            return _encode_datetime(value)
        if k == "date":
            if not isinstance(value, _dt.date) or isinstance(value, _dt.datetime):
                raise wrong("a date")
            return value.isoformat()
        if k == "enum":
            if not isinstance(value, f.element):
                raise wrong(f"a {f.element.__qualname__}")
            return value.name
        if k == "ref":
            if not isinstance(value, f.element):
                raise wrong(f"a {f.element.__qualname__}")
            ident = self.table.db.table(f.element).id_of(value)
            if ident is None:
                raise QueryError(f"{self!r} can only be compared with a saved {f.element.__qualname__}")
            return ident
        raise QueryError(f"{self!r} is a {f.describe()}: it cannot be {what} anything")

    def _compare(self, op, value):
        if value is None:
            if op not in ("=", "!="):
                raise QueryError(f"{self!r} cannot be ordered against None")
            return IsNull(self) if op == "=" else Not(IsNull(self))
        if op not in ("=", "!=") and self.field.kind not in ORDERED_KINDS:
            raise QueryError(f"{self!r} is a {self.field.describe()}, which has no order")
        return Compare(self, op, self.operand(value))

    def __eq__(self, value):
        return self._compare("=", value)

    def __ne__(self, value):
        return self._compare("!=", value)

    def __lt__(self, value):
        return self._compare("<", value)

    def __le__(self, value):
        return self._compare("<=", value)

    def __gt__(self, value):
        return self._compare(">", value)

    def __ge__(self, value):
        return self._compare(">=", value)

    def between(self, low, high):
        return And(self >= low, self <= high)

    def contains(self, text):
        return Contains(self, text)

    def in_(self, values):
        return In(self, values)

    def is_null(self):
        return IsNull(self)

    def asc(self):
        return Order(self, False)

    def desc(self):
        return Order(self, True)


class Fields:
    """``table.fields``: a FieldRef per field of the table's type."""

    def __init__(self, table):
        self._table = table

    def __getattr__(self, name):
        f = self._table.model.by_name(name)
        if f is None:
            names = ", ".join(self._table.model.declared)
            raise QueryError(f"{self._table.model.cls.__qualname__} has no field {name!r} (its fields: {names})")
        ref = FieldRef(self._table, f)
        setattr(self, name, ref)
        return ref


class Compare(Condition):
    def __init__(self, field, op, value):
        self.field, self.op, self.value = field, op, value

    def sql(self, dialect, params):
        params.append(self.value)
        return f"{self.field.column} {self.op} {dialect.param}"


class Contains(Condition):
    """The text field contains ``text`` (case-sensitive)."""

    def __init__(self, field, text):
        if field.field.kind != "str":
            raise QueryError(f"{field!r} is a {field.field.describe()}: Contains needs a str field")
        if not isinstance(text, str):
            raise QueryError(f"Contains({field!r}, ...) needs a str, not {type(text).__name__}")
        self.field, self.text = field, text

    def sql(self, dialect, params):
        params.append(self.text)
        return dialect.contains(self.field.column)


class In(Condition):
    """The field equals one of ``values``."""

    def __init__(self, field, values):
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise QueryError(f"In({field!r}, ...) needs a collection of values")
        self.field = field
        self.values = [field.operand(v, "one of") for v in values]

    def sql(self, dialect, params):
        if not self.values:
            return "0 = 1"
        return dialect.in_list(self.field.column, self.values, params)


class IsNull(Condition):
    """The field holds None."""

    def __init__(self, field):
        if not field.field.nullable:
            raise QueryError(f"{field!r} is a {field.field.describe()}: it is never None")
        self.field = field

    def sql(self, dialect, params):
        return f"{self.field.column} IS NULL"


class And(Condition):
    def __init__(self, *parts):
        for p in parts:
            if not isinstance(p, Condition):
                raise QueryError(f"And(...) combines conditions, not {p!r}")
        self.parts = parts

    def sql(self, dialect, params):
        return "(" + " AND ".join(p.sql(dialect, params) for p in self.parts) + ")"


class Or(Condition):
    def __init__(self, *parts):
        for p in parts:
            if not isinstance(p, Condition):
                raise QueryError(f"Or(...) combines conditions, not {p!r}")
        self.parts = parts

    def sql(self, dialect, params):
        return "(" + " OR ".join(p.sql(dialect, params) for p in self.parts) + ")"


class Not(Condition):
    def __init__(self, part):
        if not isinstance(part, Condition):
            raise QueryError(f"Not(...) negates a condition, not {part!r}")
        self.part = part

    def sql(self, dialect, params):
        return f"NOT ({self.part.sql(dialect, params)})"


class Order:
    def __init__(self, field, descending):
        if field.field.kind not in ORDERED_KINDS + ("bool", "enum"):
            raise QueryError(f"{field!r} is a {field.field.describe()}: it cannot order a query")
        self.field, self.descending = field, descending


class Query:
    """A query over one table; each method returns a new query. Run it with :meth:`all`,
    :meth:`first`, :meth:`count`, :meth:`ids`, :meth:`delete` or by iterating.

    :meth:`filter` adds a Python predicate, applied after the database has answered: every
    row matching the rest of the query is read and decoded to be tested, so keep the
    database's part as selective as you can; with a predicate, ``limit`` and ``offset``
    are applied in Python too, and :meth:`count` reads every matching row."""

    def __init__(self, table, where=None, orders=(), limit=None, offset=0, predicates=()):
        self.table, self._where, self._orders = table, where, tuple(orders)
        self._limit, self._offset, self._predicates = limit, offset, tuple(predicates)

    def _with(self, **changes):
        state = dict(where=self._where, orders=self._orders, limit=self._limit, offset=self._offset, predicates=self._predicates)
        state.update(changes)
        return Query(self.table, **state)

    def where(self, condition):
        if not isinstance(condition, Condition):
            raise QueryError(f"where() takes a condition, not {condition!r}")
        return self._with(where=condition if self._where is None else And(self._where, condition))

    def order_by(self, *keys):
        orders = []
        for key in keys:
            if isinstance(key, FieldRef):
                key = Order(key, False)
            if not isinstance(key, Order) or key.field.table is not self.table:
                raise QueryError(f"order_by() takes fields of this table (or field.desc()), not {key!r}")
            orders.append(key)
        return self._with(orders=self._orders + tuple(orders))

    def limit(self, n):
        if type(n) is not int or n < 0:
            raise QueryError(f"limit must be a non-negative int, not {n!r}")
        return self._with(limit=n)

    def offset(self, n):
        if type(n) is not int or n < 0:
            raise QueryError(f"offset must be a non-negative int, not {n!r}")
        return self._with(offset=n)

    def filter(self, predicate):
        if not callable(predicate):
            raise QueryError("filter() takes a function of one object returning a bool")
        return self._with(predicates=self._predicates + (predicate,))

    def compile(self, dialect, select, paged=True):
        """(sql, params) with ``select`` as the SELECT list."""
        params = []
        sql = f'SELECT {select} FROM "{self.table.model.table}"'
        if self._where is not None:
            sql += " WHERE " + self._where.sql(dialect, params)
        if self._orders and paged:
            sql += " ORDER BY " + ", ".join(f"{o.field.column}{' DESC' if o.descending else ''}" for o in self._orders) + ", id"
        elif paged and (self._limit is not None or self._offset):
            sql += " ORDER BY id"
        if paged and not self._predicates:
            if self._limit is not None:
                sql += f" LIMIT {int(self._limit)}"
            if self._offset:
                sql += f"{'' if self._limit is not None else ' LIMIT -1' if dialect.name == 'sqlite' else ''} OFFSET {int(self._offset)}"
        return sql, params

    def all(self):
        return self.table.run(self)

    def __iter__(self):
        return iter(self.all())

    def first(self):
        found = self.limit(1).all() if not self._predicates else self.all()[:1]
        return found[0] if found else None

    def count(self):
        return self.table.count_query(self)

    def ids(self):
        return self.table.ids_of_query(self)

    def delete(self):
        """Delete every matching row; returns how many."""
        return self.table.delete_query(self)
