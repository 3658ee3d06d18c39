"""Where evaluation episodes run (`Context.engine`): in this process, or as tasks on a Dask cluster.

`run_attempt` runs one attempt of an episode and returns its record; the caller (the evaluate graph's
`episode_worker`) keeps the claim, the rollout cache, the ledger writes and the re-runs. With an engine the
attempts that are ready at the same time go to the cluster as Dask tasks, `attempts`, each carrying an even
share of the attempts in flight for one of the cluster's worker processes (`_Batch`): a worker process loads each
pair, opens the ledger (the judge's cached verdicts) and runs, grades and judges the episodes through the same
function as in process, at once on its loop, with the coordinator's `HERA_*` settings and under each attempt's
call-journal scope. A worker that dies mid-task (killed, out of memory, its machine gone) has the task run again
on another worker by Dask, at most `ALLOWED_FAILURES` times on a cluster started here; a task Dask gives up on, or
loses with the scheduler, comes back as an infrastructure error for each of its attempts, which the caller re-runs
and never scores. `local:N` starts a `LocalCluster` of N worker processes of `THREADS_PER_WORKER` threads on first
use (closed at exit); `tcp://HOST:PORT` joins a running scheduler. One client per address and process, on Dask's
own event-loop thread: a result is awaited through a done-callback, so the caller's loop (every `asyncio.run` has
its own) is never blocked. A worker runs its episodes on one event loop of its own, kept for the life of the
process, whichever of its threads took their task.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import os
import re
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, Iterator

from envs.catalog import Entry, load_entry, run_entry
from roles.models import reset_endpoints
from state.context import ConfigError, Context, EpisodeRequest
from state import journal
from state.journal import call_scope, current_scope, run_thread
from state.ledger import Ledger
from state.paths import runs_dir
from state.records import EpisodeKey, EpisodeRecord, capped
from state.store import is_url

if TYPE_CHECKING:
    from distributed import Client, LocalCluster

ALLOWED_FAILURES = 1  # dead workers a task survives on a cluster started here; past that it is an infrastructure error
Attempt = Callable[..., Awaitable[EpisodeRecord]]
CONNECT_S = 30  # how long joining a scheduler may take
LOCAL = re.compile(r"local:(\d+)")
REMOTE = re.compile(r"tcp://(\[[0-9a-fA-F:]+\]|[^\s/:\[\]]+):(\d{1,5})")

BATCH = 16  # attempts a task carries at most
GATHER_S = 0.02  # how long a ready attempt waits for fewer than `_Batch.share` others to be ready
THREADS_PER_WORKER = 2  # a LocalCluster worker's task slots: it takes its next task while its last one's results travel
WORKERS_TTL_S = 10.0  # how long the cluster's count of workers is trusted (workers join and leave)
THREADS = 4  # an event loop's pool for blocking work (`bound_pool`)

_clusters: dict[int, LocalCluster] = {}
_clients: dict[str, Client] = {}
_lock = threading.Lock()
_frozen = False
_last_run: str | None = None  # in a worker: the run whose episode it ran last
_loop: asyncio.AbstractEventLoop | None = None  # in a worker: where its episodes run (`_worker_loop`)
_bounded: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def parse_engine(engine: str) -> int | str:
    """The worker count of `local:N`, or the scheduler address of `tcp://HOST:PORT`."""
    local = LOCAL.fullmatch(engine)
    if local and int(local[1]) >= 1:
        return int(local[1])
    if REMOTE.fullmatch(engine) and 0 < int(engine.rpartition(":")[2]) < 65536:
        return engine
    raise ConfigError(f"--engine (or HERA_ENGINE) {engine!r}: expected local:N (N ≥ 1 worker processes started here) or "
                      "tcp://HOST:PORT (the address of a running Dask scheduler)")


def client(engine: str) -> Client:
    """The process's client of `engine`, starting its LocalCluster or joining its scheduler on first use
    (blocking: call it off the event loop)."""
    target = parse_engine(engine)
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise ConfigError(f"--engine {engine}: Dask is not installed ({exc}); install the cluster extra: pip install 'hera[cluster]'") from None
    with _lock:
        if not _clusters and not _clients:  # after Dask's own exit handlers, so it runs before them
            atexit.register(close)
        if isinstance(target, int) and target not in _clusters:
            with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
                _clusters[target] = LocalCluster(n_workers=target, threads_per_worker=THREADS_PER_WORKER, processes=True, dashboard_address=None)
        address = _clusters[target].scheduler_address if isinstance(target, int) else target
        if address not in _clients:
            try:
                _clients[address] = Client(address, timeout=CONNECT_S)
            except OSError as exc:  # Dask's connection timeout is an OSError too
                raise ConfigError(f"--engine {engine}: no Dask scheduler answered at {address} within {CONNECT_S} s ({exc}); "
                                  "start one (`dask scheduler`) with workers (`dask worker ADDRESS`)") from None
        return _clients[address]


def close() -> None:
    """Closes this process's clients and the clusters it started."""
    with _lock:
        for c in _clients.values():
            c.close()
        for cluster in _clusters.values():
            cluster.close()
        _clients.clear()
        _clusters.clear()
        _workers.clear()


async def run_attempt(run: Attempt, entry: Entry, request: EpisodeRequest, key: EpisodeKey, ctx: Context, ledger: Ledger,
                      episode_id: str) -> EpisodeRecord:
    """`run(entry, request, key, ctx, ledger, episode_id)` (the evaluate graph's attempt: run, grade, judge), in this
    process or (with `ctx.engine`) in a task of the engine, with the attempts that are ready at the same time
    (`_Batch`)."""
    if not ctx.engine:
        return await run(entry, request, key, ctx, ledger, episode_id)
    job = Job(request, key, _portable(ctx), episode_id, run_thread(), current_scope())
    try:
        return await _batch(ctx.engine, run).add(job)
    except _Lost as exc:
        return EpisodeRecord(key=key, pair_id=request.pair_id, bundle=request.bundle, status="infrastructure_error",
                             error=capped(f"engine {ctx.engine}: {exc}"))


@dataclass(frozen=True)
class Job:
    """One attempt as a worker runs it: its episode, its context (paths made absolute), its id, and the run `thread`
    and journal `scope` it belongs to."""

    request: EpisodeRequest
    key: EpisodeKey
    ctx: Context
    episode_id: str
    thread: str | None
    scope: str | None


class _Lost(Exception):
    """A task Dask gave up on (its workers died) or lost with the scheduler."""


class _Batch:
    """The attempts of one loop for one engine, sent as tasks: Dask's scheduler and messages cost a task about as
    much CPU as a worker's episode, so a task carries what is ready at once, up to an even share of the attempts in
    flight for each of the cluster's worker processes (`share`, `BATCH` at most), or what is ready after `GATHER_S`.
    A share for each worker thread instead (tasks of 4 at 16 in flight on 2 workers of 2 threads) cost the workers
    0.8 ms more CPU an episode and the coordinator 0.7 ms more (medians of 3 rounds of `bench_runtime.py`'s engine
    rows): Dask's scheduling and messages for twice the tasks.
    A worker runs its tasks' attempts at once, on its loop; a task whose worker dies is run again whole on another
    worker (its records come back once, from the run that finished)."""

    def __init__(self, engine: str, run: Attempt):
        self.engine, self.run = engine, run
        self.pending: list[tuple[Job, asyncio.Future]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.out = 0  # attempts sent and not back yet
        self.peak = 0  # the most attempts in flight at once since the engine was last idle
        self.share = BATCH

    def add(self, job: Job) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.out and not self.pending:  # idle: the evaluation that set the peak and the share is over
            self.peak, self.share = 0, BATCH
        self.pending.append((job, future))
        self.peak = max(self.peak, self.out + len(self.pending))
        if len(self.pending) >= self.share:
            self._send()
        elif self.timer is None:
            self.timer = loop.call_later(GATHER_S, self._send)
        return future

    def _send(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        sent, self.pending = self.pending, []
        if sent:
            self.out += len(sent)
            asyncio.get_running_loop().create_task(self._tasks(sent))

    async def _tasks(self, sent: list[tuple[Job, asyncio.Future]]) -> None:
        """`sent` as tasks of `share` attempts, with the share made again from the cluster's workers."""
        try:
            dask, workers = await asyncio.to_thread(_cluster, self.engine)
        except BaseException as exc:  # no client: every attempt sent gets it
            self.out -= len(sent)
            _deliver(sent, [exc] * len(sent))
            return
        self.share = max(1, min(BATCH, -(-self.peak // workers)))
        await asyncio.gather(*(self._task(dask, sent[i:i + self.share]) for i in range(0, len(sent), self.share)))

    async def _task(self, dask: Client, sent: list[tuple[Job, asyncio.Future]]) -> None:
        from distributed import KilledWorker
        from distributed.client import FutureCancelledError
        from distributed.comm import CommClosedError

        task = None
        try:
            task = dask.submit(attempts, self.run, [job for job, _ in sent], coordinator(),
                               key=f"episodes-{sent[0][0].episode_id}-{len(sent)}-{uuid.uuid4().hex[:8]}", pure=False)
            await _finished(task)
            results = await asyncio.to_thread(task.result)
        except (KilledWorker, FutureCancelledError, CommClosedError) as exc:
            results = [_Lost(f"{type(exc).__name__}: {exc}")] * len(sent)
        except BaseException as exc:  # every attempt waiting on the task gets it
            results = [exc] * len(sent)
        finally:
            self.out -= len(sent)
            if task is not None:
                task.release()
        _deliver(sent, results)


def _deliver(sent: list[tuple[Job, asyncio.Future]], results: list) -> None:
    for (_, future), result in zip(sent, results):
        if future.done():  # its episode was cancelled
            continue
        if isinstance(result, BaseException):  # a task's own exception is our bug: raised in the episode's run
            future.set_exception(result)
        else:
            future.set_result(result)


_workers: dict[str, tuple[float, int]] = {}


def _cluster(engine: str) -> tuple[Client, int]:
    """The client of `engine` and its cluster's count of workers (asked again after `WORKERS_TTL_S`; blocking)."""
    dask = client(engine)
    seen = _workers.get(engine)
    if seen is None or time.monotonic() - seen[0] > WORKERS_TTL_S:
        seen = _workers[engine] = (time.monotonic(), max(1, len(dask.nthreads())))
    return dask, seen[1]


_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, Attempt], _Batch]] = weakref.WeakKeyDictionary()


def _batch(engine: str, run: Attempt) -> _Batch:
    per_loop = _batches.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault((engine, run), _Batch(engine, run))


async def _finished(future) -> None:
    """Waits for a Dask future without blocking the loop: Dask calls back from a thread of its own."""
    loop, finished = asyncio.get_running_loop(), asyncio.Event()

    def wake(_) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(finished.set)

    future.add_done_callback(wake)
    await finished.wait()


def coordinator() -> dict:
    """What a worker takes from this process: its `HERA_*` variables (the runs root made absolute; None for a store it
    does not use) and its collector's thresholds (`graphs.runner.tune_gc`)."""
    env = {"HERA_STORE": None} | {k: v for k, v in os.environ.items() if k.startswith("HERA_")} | {"HERA_RUNS": str(runs_dir().resolve())}
    return {"env": env, "gc_threshold": gc.get_threshold()}


def _portable(ctx: Context) -> Context:
    """`ctx` with its catalog and ledger file as absolute paths, which mean the same in a worker."""
    return _resolved(ctx, os.getcwd())


@lru_cache(maxsize=64)
def _resolved(ctx: Context, cwd: str) -> Context:
    ledger = ctx.ledger if ctx.ledger is None or is_url(ctx.ledger) else str(Path(ctx.ledger).resolve())
    return replace(ctx, catalog=str(Path(ctx.catalog).resolve()), ledger=ledger)


def attempts(run: Attempt, jobs: list[Job], settings: dict) -> list[EpisodeRecord | BaseException]:
    """The Dask task: `run` on each job in a worker process, set as the coordinator is (`settings`), at once on the
    worker's loop, each pair loaded and the ledger opened here; the model calls journaled as in process (an episode's
    under its run `thread`, the judge's under its `scope`). A job's exception comes back in its place."""
    global _frozen, _last_run
    with _set_as(settings):
        if not _frozen:  # a worker runs many episodes: its start-up objects leave the collector's view, once
            gc.freeze()  # (gc.get_freeze_count() walks every frozen object: 25 ms, not a test to make per episode)
            _frozen = True
        for job in jobs:
            if job.thread != _last_run:  # a new run tries again the endpoints an earlier one found down, as it does in process
                reset_endpoints()
                _last_run = job.thread

        async def all_of() -> list:
            return await asyncio.gather(*(_attempt_here(run, job) for job in jobs), return_exceptions=True)

        try:
            return asyncio.run_coroutine_threadsafe(all_of(), _worker_loop()).result()
        finally:
            journal.flush()  # the jobs' calls are kept before their results go back, as a run's are before it returns


_settled = threading.Condition()
_in_force: tuple[dict | None, int] = (None, 0)  # the settings the worker's running tasks came with, and how many run


@contextmanager
def _set_as(settings: dict) -> Iterator[None]:
    """The worker process set as `settings` say while a task runs. Environment variables are the process's: a task
    sent with other settings (another coordinator's runs root or store) waits until the running tasks are done."""
    global _in_force
    with _settled:
        _settled.wait_for(lambda: not _in_force[1] or _in_force[0] == settings)
        if not _in_force[1]:
            for name, value in settings["env"].items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            gc.set_threshold(*settings["gc_threshold"])
        _in_force = (settings, _in_force[1] + 1)
    try:
        yield
    finally:
        with _settled:
            _in_force = (_in_force[0], _in_force[1] - 1)
            _settled.notify_all()


def bound_pool(loop: asyncio.AbstractEventLoop) -> None:
    """Gives `loop` a pool of `THREADS` threads for the blocking work of its episodes (ledger, journal, grading, tool
    code): short work, and under the GIL every thread more only adds hand-offs. A pool of concurrency + 4 threads
    spent 40% more CPU per episode at concurrency 32 (benchmarks/bench_runtime.py), most of it waiting for the GIL."""
    if loop not in _bounded:
        loop.set_default_executor(ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="hera"))
        _bounded.add(loop)


def _worker_loop() -> asyncio.AbstractEventLoop:
    """The worker's event loop, running in a thread of its own for the life of the process: its episodes share it
    and its thread pool, as one process's do, instead of making and closing a loop (and its threads) each."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            bound_pool(_loop)
            threading.Thread(target=_loop.run_forever, name="hera-episodes", daemon=True).start()
        return _loop


async def _attempt_here(run: Attempt, job: Job) -> EpisodeRecord:
    def load() -> Entry:  # once a run, as in process (`run_entry`)
        pair, catalog = job.request.pair_id, job.ctx.catalog
        return run_entry(job.thread, pair, catalog) if job.thread else load_entry(pair, catalog)

    entry, ledger = await asyncio.to_thread(lambda: (load(), Ledger(job.ctx.ledger)))
    with call_scope(job.scope) if job.scope else nullcontext():
        return await run(entry, job.request, job.key, job.ctx, ledger, job.episode_id, thread=job.thread)
