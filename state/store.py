"""Where the ledger, the call journal and the checkpoints live: SQLite files under the runs root (the default), or
one PostgreSQL database named by a URL (`hera --store URL`, `$HERA_STORE`), each store in a schema of its own
(`ledger`, `journal`, and one per checkpoint file: `checkpoints`, `evolution`, `coevolution`).

`Tables` is the small interface the ledger and the journal write through: rows as dicts, tables and columns made
on first use (the ledger's runs and rounds gain fields as the code grows), an upsert on a primary key, an insert
that may ignore a duplicate, reads with a `?`-placeholder condition, and a write transaction that serialises
whoever else takes one on the same key (`begin immediate` in SQLite, an advisory lock in PostgreSQL)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Protocol

import sqlite_utils

URL = re.compile(r"^postgres(?:ql)?://")
DDL_TRIES = 600  # a table or column made in SQLite while other processes make theirs: tried 50 ms apart, 30 s


class StoreError(RuntimeError):
    """The store cannot be opened or used: its URL, and what failed."""


def store_url(value: str | None = None) -> str | None:
    """The PostgreSQL store the runs of this process use (`value`, else $HERA_STORE), or None for SQLite files under the
    runs root."""
    url = (os.environ.get("HERA_STORE", "") if value is None else value).strip() or None
    if url and not URL.match(url):
        raise StoreError(f"HERA_STORE={redacted(url)!r}: expected a PostgreSQL URL, postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    return url


def is_url(target: str | os.PathLike | None) -> bool:
    return target is not None and bool(URL.match(str(target)))


def redacted(url: str) -> str:
    """`url` without its password: what messages and run records may show."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def pg_connect(url: str, schema: str):
    """An autocommit connection to `url` whose tables live in `schema` (made when missing)."""
    import psycopg
    from psycopg.rows import dict_row

    try:
        conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        with conn.transaction():
            conn.execute("select pg_advisory_xact_lock(hashtext('hera-ddl'))")  # two processes making one schema
            conn.execute(f'create schema if not exists "{schema}"')
        conn.execute(f'set search_path to "{schema}"')
    except psycopg.Error as exc:
        raise StoreError(f"{redacted(url)}: cannot open the PostgreSQL store ({str(exc).strip().splitlines()[0]})") from None
    return conn


class Tables(Protocol):
    where: str  # what messages name the store by

    def insert(self, table: str, row: dict, ignore: bool = False, pk: str | None = None) -> bool: ...
    def upsert(self, table: str, row: dict, pk: str | tuple[str, ...]) -> None: ...
    def select(self, table: str, where: str | None = None, args: list | None = None, *, select: str = "*",
               order_by: str | None = None, limit: int | None = None) -> list[dict]: ...
    def execute(self, sql: str, args: list) -> None: ...
    def transaction(self, key: str) -> Any: ...


def _columns(pk: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return () if pk is None else (pk,) if isinstance(pk, str) else tuple(pk)


def _query(table: str, where: str | None, select: str, order_by: str | None, limit: int | None) -> str:
    return (f'select {select} from "{table}"' + (f" where {where}" if where else "") + (f" order by {order_by}" if order_by else "")
            + (f" limit {int(limit)}" if limit else ""))


class SqliteTables:
    """Tables in one SQLite file: plain statements on the hot path; sqlite-utils makes a table or adds columns only
    when a statement fails for want of them."""

    def __init__(self, conn: sqlite3.Connection, where: str):
        self.conn, self.where, self.db = conn, where, sqlite_utils.Database(conn)

    def _run(self, table: str, sql: str, row: dict, pk: tuple[str, ...]) -> sqlite3.Cursor:
        try:
            return self.conn.execute(sql, list(row.values()))
        except sqlite3.OperationalError as exc:
            if not (str(exc).startswith("no such table") or "has no column named" in str(exc)):
                raise
        for tries_left in reversed(range(DDL_TRIES)):
            try:
                if table in self.db.table_names():
                    self.db[table].add_missing_columns([row])
                else:
                    self.db[table].create({k: _sqlite_type(v) for k, v in row.items()}, pk=(pk[0] if len(pk) == 1 else pk) or None)
                break
            except sqlite3.OperationalError as exc:
                # another process changing the schema at once: "database is locked" at once, busy timeout or not, or
                # it made the table or column first; read the schema again
                if not tries_left or not any(s in str(exc) for s in ("locked", "already exists", "duplicate column")):
                    raise
                time.sleep(0.05)
        return self.conn.execute(sql, list(row.values()))

    def insert(self, table: str, row: dict, ignore: bool = False, pk: str | None = None) -> bool:
        """Whether the row was added (`ignore`: not when it repeats the primary key `pk`, given when the table is made)."""
        row = {k: _plain(v) for k, v in row.items()}
        verb = "insert or ignore" if ignore else "insert"
        return self._run(table, f'{verb} into "{table}" ({_names(row)}) values ({", ".join("?" * len(row))})', row, _columns(pk)).rowcount > 0

    def upsert(self, table: str, row: dict, pk: str | tuple[str, ...]) -> None:
        row, keys = {k: _plain(v) for k, v in row.items()}, _columns(pk)
        self._run(table, _upsert_sql(table, row, keys, "?"), row, keys)

    def select(self, table, where=None, args=None, *, select="*", order_by=None, limit=None) -> list[dict]:
        try:
            cursor = self.conn.execute(_query(table, where, select, order_by, limit), args or [])
        except sqlite3.OperationalError as exc:
            if str(exc).startswith("no such table"):
                return []
            raise
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, r)) for r in cursor.fetchall()]

    def execute(self, sql: str, args: list) -> None:
        self.conn.execute(sql, args)

    @contextmanager
    def transaction(self, key: str) -> Iterator[None]:
        """A write transaction taken at once: a second process's waits for it, then reads what it wrote."""
        self.conn.execute("begin immediate")
        try:
            yield
        except BaseException:
            self.conn.execute("rollback")
            raise
        self.conn.execute("commit")


class PostgresTables:
    """Tables in one schema of a PostgreSQL database. Each table has a `rowid` (insertion order, as in SQLite), left
    out of the rows read."""

    def __init__(self, conn, where: str):
        self.conn, self.where = conn, where
        self._known: dict[str, set[str]] = {}

    def _columns(self, table: str) -> set[str]:
        if table not in self._known:
            rows = self.conn.execute("select column_name from information_schema.columns where table_schema = current_schema() "
                                     "and table_name = %s", [table]).fetchall()
            if not rows:
                return set()
            self._known[table] = {r["column_name"] for r in rows}
        return self._known[table]

    def _ensure(self, table: str, row: dict, pk: tuple[str, ...]) -> None:
        known = self._columns(table)
        missing = [c for c in row if c not in known]
        if known and not missing:
            return
        with self.conn.transaction():
            self.conn.execute("select pg_advisory_xact_lock(hashtext('hera-ddl'))")
            columns = ", ".join(f'"{c}" {_pg_type(v)}' for c, v in row.items())
            key = f", primary key ({_names(pk)})" if pk else ""
            self.conn.execute(f'create table if not exists "{table}" (rowid bigserial, {columns}{key})')
            for c in missing:
                self.conn.execute(f'alter table "{table}" add column if not exists "{c}" {_pg_type(row[c])}')
        self._known.pop(table, None)

    def insert(self, table: str, row: dict, ignore: bool = False, pk: str | None = None) -> bool:
        row = {k: _pg_value(v) for k, v in row.items()}
        self._ensure(table, row, _columns(pk))
        conflict = " on conflict do nothing" if ignore else ""
        return self.conn.execute(f'insert into "{table}" ({_names(row)}) values ({", ".join(["%s"] * len(row))}){conflict}',
                                 list(row.values())).rowcount > 0

    def upsert(self, table: str, row: dict, pk: str | tuple[str, ...]) -> None:
        row, keys = {k: _pg_value(v) for k, v in row.items()}, _columns(pk)
        self._ensure(table, row, keys)
        self.conn.execute(_upsert_sql(table, row, keys, "%s"), list(row.values()))

    def select(self, table, where=None, args=None, *, select="*", order_by=None, limit=None) -> list[dict]:
        if not self._columns(table):
            return []
        rows = self.conn.execute(_query(table, where and where.replace("?", "%s"), select, order_by, limit), args or []).fetchall()
        return [{k: v for k, v in r.items() if k != "rowid"} for r in rows] if select == "*" else rows

    def execute(self, sql: str, args: list) -> None:
        self.conn.execute(sql.replace("?", "%s"), args)

    @contextmanager
    def transaction(self, key: str) -> Iterator[None]:
        """A transaction holding an advisory lock on `key`: a second writer on the same key waits for it."""
        with self.conn.transaction():
            self.conn.execute("select pg_advisory_xact_lock(hashtext(%s))", [key])
            yield


def _names(columns) -> str:
    return ", ".join(f'"{c}"' for c in columns)


def _upsert_sql(table: str, row: dict, keys: tuple[str, ...], mark: str) -> str:
    columns = _names(row)
    updates = ", ".join(f'"{c}" = excluded."{c}"' for c in row if c not in keys)
    action = f"do update set {updates}" if updates else "do nothing"
    return (f'insert into "{table}" ({columns}) values ({", ".join([mark] * len(row))}) '
            f"on conflict ({_names(keys)}) {action}")


def _plain(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (dict, list, tuple)) else value


def _pg_value(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else _plain(value)


def _sqlite_type(value: Any) -> type:
    return int if isinstance(value, (bool, int)) else float if isinstance(value, float) else str


def _pg_type(value: Any) -> str:
    return "bigint" if isinstance(value, (bool, int)) else "double precision" if isinstance(value, float) else "text"


_shared: dict[tuple[str, str], tuple[Tables, threading.Lock]] = {}
_shared_lock = threading.Lock()


def postgres_tables(url: str, schema: str) -> tuple[Tables, threading.Lock]:
    """The tables of `schema` in the database at `url`: one connection and lock per process, shared by threads."""
    with _shared_lock:
        if (url, schema) not in _shared:
            _shared[(url, schema)] = (PostgresTables(pg_connect(url, schema), f"{redacted(url)} (schema {schema})"), threading.Lock())
        return _shared[(url, schema)]
