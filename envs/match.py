"""Subset matching of JSON-like values, shared by patches, checks and witnesses.

A pattern matches a value when every key of the pattern is present with an
equal value; `"*"` matches any non-null scalar. `find_object` looks for a
matching object anywhere inside a nested value.
"""

from __future__ import annotations

from typing import Any, Iterator

ANY = "*"


def equal(pattern: Any, value: Any) -> bool:
    if pattern == ANY:
        # an unavailable-field marker is an object, so it never satisfies "*"
        return value is not None and not isinstance(value, (dict, list))
    if isinstance(pattern, bool) or isinstance(value, bool):
        # SQLite stores booleans as 0/1
        return isinstance(pattern, (bool, int)) and isinstance(value, (bool, int)) and bool(pattern) == bool(value)
    if isinstance(pattern, (int, float)) and isinstance(value, (int, float)):
        return abs(pattern - value) < 1e-9
    if isinstance(pattern, str) and isinstance(value, str):
        return pattern.casefold() == value.casefold()
    return pattern == value


def matches(pattern: dict, value: Any) -> bool:
    return isinstance(value, dict) and all(k in value and equal(p, value[k]) for k, p in pattern.items())


def objects(value: Any) -> Iterator[dict]:
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from objects(v)
    elif isinstance(value, list):
        for v in value:
            yield from objects(v)


def find_object(pattern: dict, value: Any) -> dict | None:
    return next((o for o in objects(value) if matches(pattern, o)), None)


def scalars(value: Any) -> Iterator[str | int | float]:
    if isinstance(value, dict):
        for v in value.values():
            yield from scalars(v)
    elif isinstance(value, list):
        for v in value:
            yield from scalars(v)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield value
