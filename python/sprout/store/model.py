"""What a dataclass becomes in storage: one column per field, typed, read once per class.

A field's type hint decides its *kind*:

=================  ==============  ===================================================
type hint          kind            stored as
=================  ==============  ===================================================
int                int             an integer
float              float           a double (ints are accepted)
bool               bool            an integer 0/1 (SQLite), a boolean (PostgreSQL)
str                str             text
bytes              bytes           a blob (bytearray and memoryview are accepted)
datetime           datetime        ISO 8601 text, microseconds, aware values in UTC
date               date            ISO 8601 text
an Enum            enum            the member's name
a dataclass        ref             the referenced row's id (saved with its parent)
list[dataclass]    reflist         rows of a link table (position, id)
list[V] / dict     json            JSON text; V is int, float, str, bool (or Optional)
Optional[X]        X, nullable     NULL for None
=================  ==============  ===================================================

Options come from field metadata, set with :func:`field` (``index``, ``unique``, ``lazy``)
and :func:`version` (an optimistic-concurrency version). Text, blob and JSON columns are
placed after the others, so reading the small fields of a row never touches the overflow
pages of its large values.
"""

import dataclasses
import datetime as _dt
import enum
import re
import types
import typing
from typing import Any

from .errors import SchemaError

META = "sprout.store"
LARGE_KINDS = ("str", "bytes", "json")
ORDERED_KINDS = ("int", "float", "str", "bytes", "datetime", "date")
JSON_VALUES = (int, float, str, bool)
_UNIONS = (typing.Union, getattr(types, "UnionType", typing.Union))


def field(*, index=False, unique=False, lazy=False, **kwargs):
    """A dataclass field with storage options: ``index`` (an index on its column),
    ``unique`` (a unique index), ``lazy`` (for a nested dataclass: loaded on first access).
    Other arguments (``default``, ``default_factory``, ...) go to :func:`dataclasses.field`."""
    metadata = dict(kwargs.pop("metadata", None) or {})
    metadata[META] = {"index": index or unique, "unique": unique, "lazy": lazy}
    return dataclasses.field(metadata=metadata, **kwargs)


def version():
    """An ``int`` field counting a row's updates: saving an object whose version is behind
    the row's raises :class:`ConflictError` instead of overwriting (optimistic concurrency)."""
    return dataclasses.field(default=0, metadata={META: {"version": True}})


@dataclasses.dataclass
class Field:
    name: str
    kind: str
    py_type: Any
    nullable: bool
    index: bool = False
    unique: bool = False
    lazy: bool = False
    is_version: bool = False
    element: Any = None  # json: element type; ref/reflist: the dataclass
    source: Any = None  # the dataclasses.Field, for its default

    @property
    def has_default(self):
        return self.source.default is not dataclasses.MISSING or self.source.default_factory is not dataclasses.MISSING

    def default_value(self):
        if self.source.default is not dataclasses.MISSING:
            return self.source.default
        if self.source.default_factory is not dataclasses.MISSING:
            return self.source.default_factory()
        return None

    def describe(self):
        """The type as the user wrote it, for messages."""
        return _type_name(self.py_type) + (" or None" if self.nullable else "")

    def signature(self):
        """What must not change between versions of the type for stored rows to stay valid."""
        target = self.element.__qualname__ if self.kind in ("ref", "reflist") else _type_name(self.element) if self.element else ""
        return f"{self.kind}:{target}:{'null' if self.nullable else 'notnull'}"


@dataclasses.dataclass
class Model:
    cls: type
    table: str
    fields: list  # every field, storage order
    declared: list  # every field's name, in the order the dataclass declares them
    columns: list  # fields with a column of their own (all but reflists), storage order
    reflists: list
    version: Field | None
    slots: bool

    def by_name(self, name):
        for f in self.fields:
            if f.name == name:
                return f
        return None


def _type_name(t):
    if t is None:
        return "None"
    return getattr(t, "__qualname__", None) or str(t).replace("typing.", "")


def table_name(cls):
    explicit = getattr(cls, "__sprout_table__", None)
    if explicit:
        name = explicit
    else:
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,55}", name):
        raise SchemaError(f"{name!r} cannot name a table: use letters, digits and _")
    return name


def _unwrap_optional(hint):
    if typing.get_origin(hint) in _UNIONS:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
        raise SchemaError(f"unions other than Optional[X] cannot be stored: {hint}")
    return hint, False


def _json_element(hint, where):
    inner, _ = _unwrap_optional(hint)
    if inner in JSON_VALUES or inner is Any:
        return hint
    raise SchemaError(f"{where}: elements must be int, float, str or bool (or Optional of one), not {_type_name(hint)}")


def _kind(hint, where):
    """(kind, element) of a type hint without Optional."""
    if hint is bool:
        return "bool", None
    if hint is int:
        return "int", None
    if hint is float:
        return "float", None
    if hint is str:
        return "str", None
    if hint is bytes:
        return "bytes", None
    if hint is _dt.datetime:
        return "datetime", None
    if hint is _dt.date:
        return "date", None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "enum", hint
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return "ref", hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        if len(args) != 1:
            raise SchemaError(f"{where}: write list[X] with the element type")
        element = args[0]
        if dataclasses.is_dataclass(element) and isinstance(element, type):
            return "reflist", element
        return "json", _json_element(element, where)
    if origin is dict:
        if len(args) != 2 or args[0] is not str:
            raise SchemaError(f"{where}: dictionaries must be dict[str, V]")
        return "json", _json_element(args[1], where)
    raise SchemaError(f"{where}: {_type_name(hint)} cannot be stored (see sprout.store's supported types)")


_MODELS = {}


def model_of(cls):
    """The storage model of dataclass ``cls`` (computed once)."""
    cached = _MODELS.get(cls)
    if cached is not None:
        return cached
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise SchemaError(f"{cls!r} is not a dataclass: declare it with @dataclass")
    try:
        hints = typing.get_type_hints(cls)
    except Exception as e:  # an unresolvable forward reference
        raise SchemaError(f"the type hints of {cls.__qualname__} cannot be resolved: {e}") from e
    fields = []
    version_field = None
    for f in dataclasses.fields(cls):
        if f.name == "id":
            raise SchemaError(f"{cls.__qualname__}.id: 'id' is the store's own row id; name the field otherwise")
        where = f"{cls.__qualname__}.{f.name}"
        hint, nullable = _unwrap_optional(hints[f.name])
        kind, element = _kind(hint, where)
        options = f.metadata.get(META, {})
        if kind == "reflist" and nullable:
            raise SchemaError(f"{where}: a list of dataclasses cannot be Optional (use an empty list)")
        spec = Field(
            name=f.name, kind=kind, py_type=hint, nullable=nullable,
            index=bool(options.get("index")), unique=bool(options.get("unique")),
            lazy=bool(options.get("lazy")), is_version=bool(options.get("version")), element=element, source=f,
        )
        if spec.lazy and kind != "ref":
            raise SchemaError(f"{where}: only a nested dataclass can be lazy")
        if spec.index and kind in ("reflist", "json"):
            raise SchemaError(f"{where}: {kind} fields cannot be indexed")
        if spec.is_version:
            if kind != "int" or nullable:
                raise SchemaError(f"{where}: a version field must be a plain int")
            if version_field is not None:
                raise SchemaError(f"{cls.__qualname__} has two version fields")
            version_field = spec
        fields.append(spec)
    ordered = [f for f in fields if f.kind not in LARGE_KINDS] + [f for f in fields if f.kind in LARGE_KINDS]
    model = Model(
        cls=cls,
        table=table_name(cls),
        fields=ordered,
        declared=[f.name for f in fields],
        columns=[f for f in ordered if f.kind != "reflist"],
        reflists=[f for f in ordered if f.kind == "reflist"],
        version=version_field,
        slots="__slots__" in cls.__dict__,
    )
    _MODELS[cls] = model
    return model
