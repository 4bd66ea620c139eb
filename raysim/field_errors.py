"""A pydantic ValidationError as the one-line-per-field messages every config error prints."""
from __future__ import annotations

from pydantic import ValidationError


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
