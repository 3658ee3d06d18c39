"""The call journal: the replies of model calls made inside checkpointed runs,
so that a run resumed after a crash re-reads the calls it already made
instead of asking (and paying) again.

A call is named by its scope (the run's thread id and the episode it
belongs to, or else the checkpointed graph task that made it: thread id
and checkpoint namespace; all stable across a resume), its request, and
how many identical requests its scope made before it. A resumed run asks the same questions in the same
order, so it finds the same names; a fresh run never finds one, and calls
outside a checkpointed run are not journaled at all. Failed calls are not
kept. A scope's first call asks whether the journal holds any call of that
scope (`scopes`, written before its calls), unless the caller asked ahead
(`look_ahead`: an evaluation does, in the trip that claims the episode);
when it holds none, as in every fresh run, the scope's calls are not looked
up one by one. The journal lives in `runs/calls.db`, or in the PostgreSQL
store (`state.store`).

A reply is written behind the call, by one thread per process that keeps
what is queued in one transaction (an episode does not wait for the store
between its turns, and its event loop neither waits for a lock nor touches a
file). A scope's first look waits for its replies still queued. A
process killed before its writer caught up loses the replies still queued,
and a resume makes those calls again, as it does a call in flight. `flush()`
waits for the writer: a run does before it returns, and so does a process at
exit.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import itertools
import json
import logging
import os
import queue
import sqlite3
import threading
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Sequence, TypeVar

from langgraph.config import get_config

from state.paths import RunPaths, runs_dir
from state.store import SqliteTables, Tables, postgres_tables, redacted, store_url

T = TypeVar("T")
_scope: ContextVar[str | None] = ContextVar("hera_call_scope", default=None)


@dataclass
class _Seen:
    """What a context knows of its calls: how many times each request was made, and which scopes the journal holds."""

    counts: dict[str, int] = field(default_factory=dict)
    kept: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class Items:
    """A list in a request (an episode's messages, its tools), named by each item's `dump` written once per item
    object: every turn's request repeats the messages of the turns before."""

    items: Sequence[Any]
    dump: Callable[[Any], Any]


_seen: ContextVar[_Seen | None] = ContextVar("hera_calls_seen", default=None)
_items: dict[tuple[int, Callable], str] = {}  # (id of a live item, its dump) -> its JSON
_PLACE = "\0items\0"  # where an `Items` value goes in the request's JSON
_connections: dict[Path, SqliteTables] = {}
_legacy: dict[int, bool] = {}  # per journal table object: it holds calls from before `scopes` (each is looked up)
_lock = threading.Lock()
Target = tuple[Tables, threading.Lock]
Where = tuple[str | None, str | None]  # ($HERA_STORE, $HERA_RUNS): what names a journal
_targets: dict[Where, Target] = {}
_queue: queue.SimpleQueue[tuple[Where, str, str, str, int] | threading.Event] = queue.SimpleQueue()
_numbers = itertools.count(1)  # of the replies queued, in order
_looked: dict[tuple[Where, str], bool] = {}  # (journal, scope) -> whether it holds calls of the scope, asked ahead (`look_ahead`)
_unkept: dict[tuple[Where, str], int] = {}  # (journal, scope) -> the number of its last reply queued, until the writer is past it
_writer: threading.Thread | None = None
_writer_lock = threading.Lock()
log = logging.getLogger(__name__)


@contextmanager
def call_scope(name: str) -> Iterator[None]:
    """Names the scope of the calls made inside (an episode: its run, key and attempt). What the scope learns of its
    calls (`_Seen`) is shared by everything inside, the graph nodes of an episode too (each runs in a copy of this
    context)."""
    known = _Seen()
    looked = _looked.pop((_where(), name), None)
    if looked is not None:
        known.kept[name] = looked
    token, seen = _scope.set(name), _seen.set(known)
    try:
        yield
    finally:
        _seen.reset(seen)
        _scope.reset(token)


def _configurable() -> dict[str, Any]:
    try:
        return get_config().get("configurable", {})
    except RuntimeError:  # not inside a graph
        return {}


def run_thread() -> str | None:
    """The thread id of the checkpointed run the caller is in, if any."""
    return _configurable().get("thread_id")


def current_scope() -> str | None:
    explicit = _scope.get()
    if explicit:
        return explicit
    configurable = _configurable()
    thread = configurable.get("thread_id")
    return f"{thread}/{configurable.get('checkpoint_ns', '')}" if thread else None


def _db(where: Where | None = None) -> Target:
    """The journal's table: `calls.db` under the runs root, or the `journal` schema of the PostgreSQL store; found once
    per value of the variables that name them (`_where`)."""
    where = where or _where()
    target = _targets.get(where)
    if target is None:
        target = _targets[where] = _open(where)
    return target


def _where() -> Where:
    return os.environ.get("HERA_STORE"), os.environ.get("HERA_RUNS")


def _open(where: Where) -> Target:
    store, runs = where
    url = store_url(store or "")
    if url:
        return postgres_tables(url, "journal")
    path = _calls_file(runs)
    with _lock:
        if path not in _connections:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            conn.execute("pragma journal_mode=wal")
            conn.execute("pragma synchronous=normal")  # survives a killed process, which is what resuming is for
            conn.execute("create table if not exists calls (id text primary key, reply text not null)")
            conn.execute("create table if not exists scopes (id text primary key)")
            _connections[path] = SqliteTables(conn, str(path))
        return _connections[path], _lock


async def journaled(request: dict[str, Any], call: Callable[[], Awaitable[T]], dump: Callable[[T], str],
                    load: Callable[[str], T]) -> T:
    """`call()`'s result, read back from the journal when this call was already made in this scope."""
    scope = current_scope()
    if scope is None:
        return await call()
    seen = _seen.get()
    if seen is None:
        seen = _Seen()
        _seen.set(seen)
    digest = _digest(scope, request)
    n = seen.counts.get(digest, 0)
    seen.counts[digest] = n + 1
    key = f"{digest}:{n}"
    if scope not in seen.kept:
        seen.kept[scope] = await asyncio.to_thread(_holds, scope)
    if seen.kept[scope]:
        kept = await asyncio.to_thread(_read, key)
        if kept is not None:
            return load(kept)
    result = await call()
    _keep(scope, key, dump(result))
    return result


def _digest(scope: str, request: dict[str, Any]) -> str:
    """sha256 of `json.dumps([scope, request], sort_keys=True, default=str)`, each `Items` value written as the list of
    its items' dumps."""
    lists = sorted(k for k, v in request.items() if isinstance(v, Items))
    text = json.dumps([scope, {k: _PLACE if k in lists else v for k, v in request.items()}], sort_keys=True, default=str)
    parts, digest = text.split(json.dumps(_PLACE)), hashlib.sha256()
    digest.update(parts[0].encode())
    for name, rest in zip(lists, parts[1:]):
        value = request[name]
        digest.update(f"[{', '.join(_item(x, value.dump) for x in value.items)}]{rest}".encode())
    return digest.hexdigest()


def _item(item: Any, dump: Callable[[Any], Any]) -> str:
    """`dump(item)` as sorted JSON, kept while the item lives (an item that cannot be weakly referred to is not kept)."""
    key = (id(item), dump)  # one object may be written two ways
    text = _items.get(key)
    if text is None:
        text = json.dumps(dump(item), sort_keys=True, default=str)
        try:
            weakref.finalize(item, _items.pop, key, None)
        except TypeError:
            return text
        _items[key] = text
    return text


def episode_scope(thread: str, episode_id: str) -> str:
    """The scope of an episode's calls in the run of `thread`."""
    return f"{thread}/episode:{episode_id}"


def look_ahead(scope: str) -> None:
    """Off the event loop: asks now whether the journal holds calls of `scope`, so that the scope's first call knows
    without a trip to a thread of its own (one an episode waits for, among the first of a busy process). For a caller
    holding the claim of the scope's episode: no other process writes the scope between this look and the call."""
    _looked[_where(), scope] = _holds(scope)


def _holds(scope: str) -> bool:
    """Whether the journal may hold calls of `scope` (once its replies still queued are kept)."""
    if (_where(), scope) in _unkept:
        flush()
    db, lock = _db()
    with lock:
        if id(db) not in _legacy:
            _legacy[id(db)] = bool(db.select("calls", limit=1)) and not db.select("scopes", limit=1)
        return _legacy[id(db)] or bool(db.select("scopes", "id = ?", [scope], select="id"))


def _read(key: str) -> str | None:
    db, lock = _db()
    with lock:
        rows = db.select("calls", "id = ?", [key], select="reply")
    return rows[0]["reply"] if rows else None


def _keep(scope: str, key: str, reply: str) -> None:
    """Queues `reply` for the writer thread. Made on the event loop: no lock, no file, nothing that waits."""
    global _writer
    if _writer is None:
        with _writer_lock:  # once a process
            if _writer is None:
                _writer = threading.Thread(target=_write_queued, name="hera-journal", daemon=True)
                _writer.start()
    where, number = _where(), next(_numbers)
    _unkept[where, scope] = number  # one dict write: no lock (a scope's replies come from one task, in order)
    _queue.put((where, scope, key, reply, number))


def flush() -> None:
    """Returns once every reply queued before the call is kept (or given up on, with a warning)."""
    if _writer is None:  # nothing was ever queued
        return
    done = threading.Event()
    _queue.put(done)
    while not done.wait(1.0):
        if not _writer.is_alive():
            return


def _forget_the_writer() -> None:
    """In a forked child: the parent's writer thread does not run here, nor does what it had queued belong here."""
    global _writer, _queue, _writer_lock
    _writer, _queue, _writer_lock = None, queue.SimpleQueue(), threading.Lock()
    _unkept.clear()


atexit.register(flush)
os.register_at_fork(after_in_child=_forget_the_writer)


def _write_queued() -> None:
    """The writer: everything queued at once, one transaction per journal, in the order queued."""
    while True:
        batch = [_queue.get()]
        while True:
            try:
                batch.append(_queue.get_nowait())
            except queue.Empty:
                break
        by_journal: dict[Where, list[tuple[str, str, str, int]]] = {}
        for item in batch:
            if not isinstance(item, threading.Event):
                by_journal.setdefault(item[0], []).append(item[1:])
        for where, items in by_journal.items():
            try:
                _write(_db(where), [(scope, key, reply) for scope, key, reply, _ in items])
            except Exception as exc:  # the calls were made and answered; a resume makes them again
                log.warning("call journal %s: %d replies not kept (%s: %s); a resumed run makes those calls again",
                            _name(where), len(items), type(exc).__name__, exc)
            for scope, number in {scope: number for scope, _, _, number in items}.items():
                if _unkept.get((where, scope)) == number:  # else a later reply of the scope is queued
                    _unkept.pop((where, scope), None)
        for item in batch:
            if isinstance(item, threading.Event):
                item.set()


def _name(where: Where) -> str:
    store, runs = where
    return redacted(store) if store else str(_calls_file(runs))


def _calls_file(runs: str | None) -> Path:
    """`calls.db` under the runs root `runs` ($HERA_RUNS as it was; `runs_dir` when it is unset)."""
    return RunPaths(Path(runs) if runs is not None else runs_dir()).calls


def _write(target: Target, items: list[tuple[str, str, str]]) -> None:
    """Keeps (scope, key, reply) items in one transaction, each scope before its calls: a call kept is never missed, a
    scope kept without its call only costs a look."""
    db, lock = target
    with lock, db.transaction("journal"):
        for scope in dict.fromkeys(scope for scope, _, _ in items):
            db.insert("scopes", {"id": scope}, ignore=True, pk="id")
        for _, key, reply in items:
            db.upsert("calls", {"id": key, "reply": reply}, pk="id")
