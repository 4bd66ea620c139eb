"""A pydantic ValidationError as the one-line-per-field messages every config error prints, and the values
pydantic accepts that a config must not."""
from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ValidationError


def field_errors(err: ValidationError, prefix: str = "") -> list[str]:
    """`section.field: what is wrong (got value)` for each error; an unknown key is `unknown field`."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "") or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown field")
            continue
        got = e.get("input")
        shown = f" (got {got!r})" if isinstance(got, (int, float, str, bool, type(None))) else ""
        lines.append(f"{loc}: {e['msg'].removeprefix('Value error, ')}{shown}")
    return lines


def coercion_problems(raw: Any, value: Any, path: str = "") -> list[str]:
    """`path: what is wrong (got value)` for each value of `raw` (a config as given) that pydantic's lax mode took
    but a config must not: true/false for a number (`rounds: true` ran one round) and NaN or inf for any number.

    `value` is what `raw` validated to: walking both, every model, family `Params` and plugin schema is checked
    without a base class of its own, and defaults (never in `raw`) are not.
    """
    if isinstance(value, BaseModel):
        value = {**(value.model_extra or {}),
                 **{field.alias or name: getattr(value, name) for name, field in type(value).model_fields.items()}}
    if isinstance(value, dict) and isinstance(raw, dict):
        return [p for key in raw if key in value for p in coercion_problems(raw[key], value[key], _join(path, key))]
    if isinstance(value, (list, tuple)) and isinstance(raw, (list, tuple)) and len(raw) == len(value):
        return [p for i, (r, v) in enumerate(zip(raw, value)) for p in coercion_problems(r, v, _join(path, i))]
    if isinstance(raw, bool) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return [f"{path}: expected a number, not a boolean (got {raw!r})"]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{path}: must be a finite number (got {raw!r})"]
    return []


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)
