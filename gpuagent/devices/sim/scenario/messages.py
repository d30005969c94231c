"""JSON Schema errors in words: each as (path in the file, message), the way an operator writes the file.

jsonschema's own messages quote the schema (``'x' is not valid under any of the given schemas``); these
name the key, say what was expected and, for a misspelt key, the key that was meant. For a ``oneOf``
(a value that is a number or a curve) the message comes from the branch the value was meant for.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import jsonschema

from gpuagent.config import key_text
from gpuagent.devices.sim.scenario.values import show


def path_sort_key(path: str) -> list[tuple[int, int | str]]:
    """Orders paths as the file does: ``gpus[2]`` before ``gpus[10]``. A key YAML reads as a number
    (``2: x``) makes a numeric part where another path has a name: numbers sort first, never compared
    with names (which raised TypeError instead of reporting the scenario's errors)."""
    return [(0, int(x)) if x.isdigit() else (1, x) for x in re.split(r"[.\[\]]+", path) if x]


def format_path(parts: Any) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


_TYPE_WORDS = {
    "number": "a number", "integer": "an integer", "string": "a string", "array": "a list",
    "object": "a mapping", "boolean": "true or false", "null": "nothing",
}


def explain(err: jsonschema.ValidationError) -> tuple[str, str]:
    """(path, message) for a schema error, descending into the matching branch of a oneOf."""
    if err.validator in ("oneOf", "anyOf") and err.context:
        branches: dict[int, list[jsonschema.ValidationError]] = {}
        for sub in err.context:
            branches.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
        fitting = [
            errs for errs in branches.values()
            if not any(e.validator == "type" and not e.relative_path for e in errs)
        ]
        if fitting:
            best = max(fitting[0], key=lambda e: len(e.absolute_path))
            return explain(best)
        titles = [s.get("title") for s in err.validator_value if isinstance(s, dict) and s.get("title")]
        what = " or ".join(titles) if titles else err.schema.get("title", "another type")
        return format_path(err.absolute_path), f"expected {what}, got {show(err.instance)}"
    path = list(err.absolute_path)
    v, value, inst = err.validator, err.validator_value, err.instance
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extras = [k for k in inst if k not in err.schema.get("properties", {})]
        key = key_text(extras[0]) if extras else "?"  # named only if key-shaped: the file may be any file
        hint = difflib.get_close_matches(key, allowed, n=1)
        if hint:
            msg = f"unknown key (did you mean '{hint[0]}'?)"
        else:
            msg = f"unknown key; allowed: {', '.join(allowed)}"
        return format_path([*path, key]), msg
    if v == "required":
        missing = [k for k in value if k not in inst]
        return format_path(path), f"missing required key '{missing[0] if missing else value[0]}'"
    if v == "enum":
        noun = path[-1] if path and isinstance(path[-1], str) else "value"
        return format_path(path), f"unknown {noun} {show(inst)}; known: {', '.join(map(str, value))}"
    if v == "const":
        return format_path(path), f"must be {value!r}, got {show(inst)}"
    if v == "type":
        title = err.schema.get("title")
        types = [value] if isinstance(value, str) else value
        what = title or " or ".join(_TYPE_WORDS.get(t, t) for t in types)
        return format_path(path), f"expected {what}, got {show(inst)}"
    bounds = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if v in bounds:
        return format_path(path), f"must be {bounds[v]} {value}, got {show(inst)}"
    if v == "minItems":
        return format_path(path), f"needs at least {value} item{'s' if value != 1 else ''}"
    if v == "maxItems":
        return format_path(path), f"takes at most {value} item{'s' if value != 1 else ''}"
    if v == "minLength":
        return format_path(path), "must not be empty"
    if v == "maxLength":
        return format_path(path), f"is longer than {value} characters"
    if v == "pattern":
        return format_path(path), f"{show(inst)} is not {err.schema.get('title', 'valid here')}"
    if v == "uniqueItems":
        return format_path(path), "has duplicate items"
    if v in ("minProperties", "maxProperties") and "fault" in format_path(path):
        kinds = ", ".join(err.schema.get("properties", {}))
        return format_path(path), f"a fault is a mapping with exactly one key, one of: {kinds}"
    if v == "minProperties":
        return format_path(path), "must not be empty"
    return format_path(path), err.message
