"""Worker settings as TOML, inline tables and arrays of them included (conftest's `to_toml`
writes each value as JSON, which TOML reads for strings, numbers, booleans and plain arrays,
but not for tables: `static = {...}`, `volumes = [{...}]`)."""


import json


def toml_value(value):
    """A TOML value: dicts as inline tables (keys quoted), lists element by element, and the
    rest as JSON, whose strings, numbers and booleans are TOML's too."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def to_toml(sections):
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"
