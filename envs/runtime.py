"""Per-episode environment state and tool execution.

`EnvInstance` gives one episode its own in-memory SQLite database, copied
from a template built once per environment hash. Read-only tools run with
`PRAGMA query_only`, so they cannot write; a state-changing tool that fails
is undone by restoring a snapshot taken just before it, so a failed call
never leaves a partial write. `diff()` compares the current state with the
initial one.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any

import sqlite_utils
from pydantic import ValidationError

from envs.match import matches, objects
from envs.spec import Tool, load_tools, shipped, tool_infos
from envs.toolkit import ToolError
from envs import untrusted
from envs.untrusted import ToolProcess
from state.records import EnvironmentSpec, Observation, RowChange, StateDiff, ToolInfo, ToolPatch

# a json column holds its value's JSON text; snapshots decode it
_SQL_TYPES = {"text": str, "integer": int, "real": float, "boolean": int, "json": str}
_template_lock = threading.RLock()


_templates: dict[str, sqlite3.Connection] = {}
_initial_rows: dict[str, dict[str, list[dict]]] = {}


def _template(spec: EnvironmentSpec) -> sqlite3.Connection:
    with _template_lock:
        if spec.hash not in _templates:
            _templates[spec.hash] = _build(spec)
        return _templates[spec.hash]


def _build(spec: EnvironmentSpec) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    db = sqlite_utils.Database(conn)
    for table in spec.tables:
        db[table.name].create(
            {c.name: _SQL_TYPES[c.type] for c in table.columns},
            pk=table.primary_key,
            not_null={c.name for c in table.columns if not c.nullable},
        )
        encoded = [c.name for c in table.columns if c.type == "json"]
        db[table.name].insert_all(_encode(row, encoded) for row in spec.rows.get(table.name, ()))
    conn.commit()
    return conn


def build_database(spec: EnvironmentSpec) -> sqlite3.Connection:
    """A fresh in-memory database holding the spec's initial state."""
    template = _template(spec)
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    with _template_lock:
        template.backup(conn)
    return conn


def initial_rows(spec: EnvironmentSpec) -> dict[str, list[dict]]:
    """The template's rows, read once per environment hash; callers must not modify them."""
    with _template_lock:
        if spec.hash not in _initial_rows:
            _initial_rows[spec.hash] = snapshot(_template(spec), spec)
        return _initial_rows[spec.hash]


def snapshot(conn: sqlite3.Connection, spec: EnvironmentSpec) -> dict[str, list[dict]]:
    out = {}
    for t in spec.tables:
        rows = _rows(conn.execute(f"select * from [{t.name}] order by [{t.primary_key}]"))
        encoded = [c.name for c in t.columns if c.type == "json"]
        out[t.name] = [_decode(r, encoded) for r in rows] if encoded else rows
    return out


def _encode(row: dict, columns: list[str]) -> dict:
    return {**row, **{c: json.dumps(row[c]) for c in columns if row.get(c) is not None}}


def _decode(row: dict, columns: list[str]) -> dict:
    out = dict(row)
    for c in columns:
        if isinstance(out[c], str):
            try:
                out[c] = json.loads(out[c])
            except json.JSONDecodeError:
                pass  # a tool wrote text that is not JSON: the diff shows it as written
    return out


def _rows(cursor: sqlite3.Cursor) -> list[dict]:
    names = [c[0] for c in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def diff_rows(spec: EnvironmentSpec, before: dict[str, Any], after: dict[str, Any]) -> StateDiff:
    changes = []
    for table in spec.tables:
        pk = table.primary_key
        old = {r[pk]: _plain(r) for r in before.get(table.name, ())}
        new = {r[pk]: _plain(r) for r in after.get(table.name, ())}
        for key in sorted(old.keys() | new.keys(), key=str):
            if old.get(key) != new.get(key):
                changes.append(RowChange(table=table.name, key=key, before=old.get(key), after=new.get(key)))
    return StateDiff(changes=tuple(changes))


def _plain(row: dict) -> dict:
    return {k: int(v) if isinstance(v, bool) else v for k, v in row.items()}


UNAVAILABLE = "field_unavailable"


def _redact(value: Any, patch: ToolPatch) -> Any:
    value = json.loads(json.dumps(value))
    for obj in objects(value):
        if matches(patch.where, obj):
            for field in patch.fields:
                if field in obj:
                    obj[field] = {"error": UNAVAILABLE, "message": patch.message or f"{field} is not available."}
    return value


class EnvInstance:
    """One episode's environment: fresh state, public tools, a call log."""

    def __init__(self, spec: EnvironmentSpec):
        self.spec = spec
        self.calls: list[Observation] = []
        self._remote: ToolProcess | None = None
        if not shipped(spec.tools_source):
            self._remote = ToolProcess(spec)
            return
        self.tools: dict[str, Tool] = load_tools(spec)
        self.conn = build_database(spec)
        self.db = sqlite_utils.Database(self.conn)

    @property
    def public_tools(self) -> list[ToolInfo]:
        return list(tool_infos(self.spec).values())

    def call(self, name: str, args: dict[str, Any] | None = None) -> Observation:
        args = dict(args or {})
        obs = self._remote.call(name, args) if self._remote else self._run(name, args)
        self.calls.append(obs)
        return obs

    def _run(self, name: str, args: dict[str, Any]) -> Observation:
        tool = self.tools.get(name)
        if tool is None:
            return Observation(tool=name, args=args, ok=False, error_code="unknown_tool", message=f"There is no tool named {name!r}.")
        fail = lambda code, msg: Observation(  # noqa: E731
            tool=name, args=args, ok=False, error_code=code, message=msg, read_only=tool.read_only
        )
        try:
            params = tool.params.model_validate(args).model_dump()
        except ValidationError as exc:
            err = exc.errors()[0]
            return fail("invalid_arguments", f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}")
        patches = [p for p in self.spec.tool_patches if p.tool == name]
        for patch in patches:
            if patch.op == "fail" and matches(patch.when, params):
                return fail(patch.error_code, patch.message or f"{name} is unavailable.")
        try:
            output = self._execute(tool, params)
        except ToolError as exc:
            return fail(exc.code, exc.message)
        for patch in patches:
            if patch.op == "redact":
                output = _redact(output, patch)
        return Observation(tool=name, args=args, ok=True, output=output, read_only=tool.read_only)

    def _execute(self, tool: Tool, params: dict[str, Any]) -> Any:
        # The project's own tools run here; a query still running after the call timeout is interrupted.
        deadline = time.monotonic() + untrusted.CALL_TIMEOUT_S
        self.conn.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
        if tool.read_only:
            self.conn.execute("PRAGMA query_only = 1")
            try:
                return _guarded(tool, params, self.db)
            finally:
                self.conn.execute("PRAGMA query_only = 0")
        saved = sqlite3.connect(":memory:")
        self.conn.commit()
        self.conn.backup(saved)
        try:
            output = _guarded(tool, params, self.db)
            self.conn.commit()
            return output
        except ToolError:
            self.conn.rollback()
            saved.backup(self.conn)
            raise
        finally:
            saved.close()

    def rows(self) -> dict[str, list[dict]]:
        return self._remote.rows() if self._remote else snapshot(self.conn, self.spec)

    def diff(self) -> StateDiff:
        return diff_rows(self.spec, initial_rows(self.spec), self.rows())

    def close(self) -> None:
        (self._remote or self.conn).close()


def _guarded(tool: Tool, params: dict[str, Any], db: sqlite_utils.Database) -> Any:
    try:
        return _json_plain(tool.fn(db, **params))
    except ToolError:
        raise
    except OverflowError as exc:
        # A number too large for SQLite or for the tool's arithmetic is the caller's argument, refused like a wrong
        # type: as a crash the episode would be dropped as an environment fault, unscored.
        raise ToolError("invalid_arguments", f"a number out of range ({exc})") from None
    except Exception as exc:
        # A crash in tool code is an environment defect: recorded on the
        # observation as internal_error (never the agent's fault) and undone.
        raise ToolError("internal_error", f"{tool.name} failed: {type(exc).__name__}: {exc}") from None


def _json_plain(value: Any) -> Any:
    """`value` as JSON gives it back; text no UTF-8 record can hold (a lone surrogate) is no JSON either."""
    try:
        return json.loads(json.dumps(value, ensure_ascii=False).encode())
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise ToolError("internal_error", f"tool returned a value that is not JSON: {exc}") from None
