"""Specialized code per type, as Mirage generated it: for each dataclass, Python source for an
encoder (object -> column values, checking each value against its declared type) and a
decoder (row -> object, bypassing ``__init__``), compiled once at first use. The hot path
then runs straight-line code with no reflection over fields.

The generated source is kept on the functions (``encode.source``) for reading and debugging.
"""

import datetime as _dt
import json

from .errors import ValidationError

_UTC = _dt.UTC


def _encode_datetime(v):
    if v.tzinfo is not None:
        v = v.astimezone(_UTC)
    return v.isoformat(timespec="microseconds")


def _element_test(element):
    """A test of one element of a JSON field whose elements are ``element``."""
    import typing

    if element is typing.Any:
        return lambda item: True
    args = typing.get_args(element)
    inner = next((a for a in args if a is not type(None)), element)
    nullable = type(None) in args
    exact = {
        int: lambda x: type(x) is int,
        bool: lambda x: type(x) is bool,
        float: lambda x: type(x) in (int, float),
        str: lambda x: isinstance(x, str),
    }[inner]
    return (lambda x: x is None or exact(x)) if nullable else exact


def _check_json(v, test, description, where):
    for item in v.values() if isinstance(v, dict) else v:
        if not test(item):
            raise ValidationError(*where, f"a collection of {description}", item)


def _check_json_keys(v, where):
    for k in v:
        if type(k) is not str:
            raise ValidationError(*where, "a dict with str keys", k)


_ENVIRONMENT = {
    "ValidationError": ValidationError,
    "_encode_datetime": _encode_datetime,
    "_check_json": _check_json,
    "_check_json_keys": _check_json_keys,
    "_dumps": json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode,
    "_loads": json.loads,
    "_datetime": _dt.datetime,
    "_date": _dt.date,
    "_from_iso_datetime": _dt.datetime.fromisoformat,
    "_from_iso_date": _dt.date.fromisoformat,
    "_bytes": bytes,
    "_float": float,
}


def _element_name(element):
    return str(element).replace("typing.", "") if not isinstance(element, type) else element.__name__


def _encode_lines(f, i, type_name):
    """Source lines turning ``v`` (field f) into its column value ``c{i}``."""
    where = f"({type_name!r}, {f.name!r}"
    bad = lambda expected: f"raise ValidationError({type_name!r}, {f.name!r}, {expected!r}, v)"
    k = f.kind
    lines = []
    if k == "int":
        lines += ["if v.__class__ is not int and (not isinstance(v, int) or isinstance(v, bool)):", f"    {bad('an int')}", f"c{i} = v"]
    elif k == "float":
        lines += ["if v.__class__ is not float:", "    if isinstance(v, bool) or not isinstance(v, (int, float)):",
                  f"        {bad('a float')}", "    v = _float(v)", f"c{i} = v"]
    elif k == "bool":
        lines += ["if v.__class__ is not bool:", f"    {bad('a bool')}", f"c{i} = v"]
    elif k == "str":
        lines += ["if v.__class__ is not str and not isinstance(v, str):", f"    {bad('a str')}", f"c{i} = v"]
    elif k == "bytes":
        lines += ["if v.__class__ is not bytes:", "    if not isinstance(v, (bytearray, memoryview)):",
                  f"        {bad('bytes')}", "    v = _bytes(v)", f"c{i} = v"]
    elif k == "datetime":
        lines += ["if not isinstance(v, _datetime):", f"    {bad('a datetime')}", f"c{i} = _encode_datetime(v)"]
    elif k == "date":
        lines += ["if not isinstance(v, _date) or isinstance(v, _datetime):", f"    {bad('a date')}", f"c{i} = v.isoformat()"]
    elif k == "enum":
        lines += [f"if not isinstance(v, E{i}):", f"    {bad(f.element.__qualname__)}", f"c{i} = v.name"]
    elif k == "json":
        container = "dict" if f.py_type.__origin__ is dict else "list"
        lines += [f"if not isinstance(v, {container}):", f"    {bad('a ' + container)}"]
        if container == "dict":
            lines += [f"_check_json_keys(v, {where}))"]
        lines += [f"_check_json(v, J{i}, {_element_name(f.element)!r}, {where}))", f"c{i} = _dumps(v)"]
    elif k == "ref":
        lines += [f"if not isinstance(v, R{i}):", f"    {bad(f.element.__qualname__)}", f"c{i} = save_ref(v)"]
    else:
        raise AssertionError(k)
    if f.nullable:
        return ["if v is None:", f"    c{i} = None", "else:"] + ["    " + line for line in lines]
    return lines


_CODE = {}  # (source, file name) -> code object: compiled once per process (and by a forking parent)


def _compiled(source, filename):
    code = _CODE.get((source, filename))
    if code is None:
        code = _CODE[(source, filename)] = compile(source, filename, "exec")
    return code


def make_encoder(model):
    """``encode(obj, save_ref) -> tuple`` of the model's column values, in column order."""
    type_name = model.cls.__qualname__
    env = dict(_ENVIRONMENT)
    body = []
    for i, f in enumerate(model.columns):
        env[f"E{i}"] = f.element if f.kind == "enum" else None
        env[f"J{i}"] = _element_test(f.element) if f.kind == "json" else None
        env[f"R{i}"] = f.element if f.kind == "ref" else None
        body.append(f"v = obj.{f.name}")
        body += _encode_lines(f, i, type_name)
    values = ", ".join(f"c{i}" for i in range(len(model.columns)))
    source = ("def encode(obj, save_ref):\n" + "".join(f"    {line}\n" for line in body)
              + f"    return ({values}{',' if len(model.columns) == 1 else ''})\n")
    exec(_compiled(source, f"<sprout.store encoder of {type_name}>"), env)
    encode = env["encode"]
    encode.source = source
    return encode


def _decode_expression(f, i):
    """The expression turning column ``row[i]`` into the field's value."""
    r = f"row[{i}]"
    k = f.kind
    if k in ("int", "float", "str", "ref"):
        expr = r
    elif k == "bool":
        expr = f"({r} == 1)"  # 0/1 in SQLite, a boolean in PostgreSQL
    elif k == "bytes":
        expr = f"_bytes({r})"
    elif k == "datetime":
        expr = f"_from_iso_datetime({r})"
    elif k == "date":
        expr = f"_from_iso_date({r})"
    elif k == "enum":
        expr = f"E{i}[{r}]"
    elif k == "json":
        expr = f"_loads({r})"
    else:
        raise AssertionError(k)
    if f.nullable and expr != r:
        return f"(None if {r} is None else {expr})"
    return expr


def make_decoder(model, identity_key=None):
    """``decode(row) -> obj`` for rows ``(id, column...)`` in column order; reference fields
    hold the referenced row's id until the table resolves them. With ``identity_key`` (not
    for slotted classes) the object also records which row it came from, as
    ``(row id, id(obj))`` under that key of its ``__dict__``."""
    type_name = model.cls.__qualname__
    env = dict(_ENVIRONMENT)
    env["_new"] = object.__new__
    env["_set"] = object.__setattr__
    env["C"] = model.cls
    lines = ["obj = _new(C)"]
    if model.slots:
        for i, f in enumerate(model.columns):
            env[f"E{i + 1}"] = f.element if f.kind == "enum" else None
            lines.append(f"_set(obj, {f.name!r}, {_decode_expression(f, i + 1)})")
        for f in model.reflists:
            lines.append(f"_set(obj, {f.name!r}, [])")
    else:
        items = []
        for i, f in enumerate(model.columns):
            env[f"E{i + 1}"] = f.element if f.kind == "enum" else None
            items.append(f"{f.name!r}: {_decode_expression(f, i + 1)}")
        items += [f"{f.name!r}: []" for f in model.reflists]
        if identity_key is not None:
            env["K"] = identity_key  # a name, not a literal: the source is the same for every database
            items.append("K: (row[0], id(obj))")
        lines.append("obj.__dict__.update({" + ", ".join(items) + "})")
    lines.append("return obj")
    source = "def decode(row):\n" + "".join(f"    {line}\n" for line in lines)
    exec(_compiled(source, f"<sprout.store decoder of {type_name}>"), env)
    decode = env["decode"]
    decode.source = source
    return decode
