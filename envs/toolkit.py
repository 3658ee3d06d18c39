"""What an environment's `tools.py` imports: the two tool decorators, the
error a tool raises to refuse a call, and small row helpers.

A tool is a plain function whose first parameter is the episode's
`sqlite_utils.Database` and whose other parameters are typed. Its docstring
is the public description; an optional Google-style `Args:` section gives
each parameter's description.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable

import sqlite_utils
from sqlite_utils.db import quote_identifier


class ToolError(Exception):
    """A refusal the agent observes as `{"error": {"code", "message"}}`.
    The call's writes are rolled back."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def read_tool(fn: Callable) -> Callable:
    fn.__hera_tool__ = "read"
    return fn


def write_tool(fn: Callable) -> Callable:
    fn.__hera_tool__ = "write"
    return fn


def one(db: sqlite_utils.Database, table: str, **where: Any) -> dict:
    """The single row of `table` matching `where`, or a `not_found` ToolError."""
    rows = find(db, table, **where)
    if not rows:
        shown = ", ".join(f"{k}={v!r}" for k, v in where.items())
        raise ToolError("not_found", f"No {table} record with {shown}.")
    return rows[0]


def find(db: sqlite_utils.Database, table: str, **where: Any) -> list[dict]:
    """Rows of `table` whose columns equal `where`, in primary-key order."""
    clause = " and ".join(f"[{k}] = ?" for k in where)
    sql = f"select * from {quote_identifier(table)}" + (f" where {clause}" if clause else "") + " order by rowid"
    try:  # one statement: `db[table].rows_where` asks the schema twice first, on every call of every tool
        cursor = db.execute(sql, list(where.values()))
    except sqlite3.OperationalError as exc:
        if str(exc).startswith("no such table"):
            return []
        raise
    names = [c[0] for c in cursor.description]
    return [dict(zip(names, row)) for row in cursor]
