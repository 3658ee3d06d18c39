"""The programmatic API: every graph compiled with persistence and run by run id (through `graphs.runner`),
resumable after a crash.

    run_id, metrics = asyncio.run(evaluate("H0", ["weather-la-precip-missing"], Context(agent_model="local")))
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from envs.catalog import split_pairs
from graphs import runner
from graphs.construct import run_construct
from graphs.coevolution import run_coevolution
from graphs.env_evolution import run_env_evolution
from graphs.harness_evolution import run_harness_evolution
from graphs.metrics import Metrics
from graphs.runner import episode_event, new_run_id, recorded_run, tune_gc
from state.context import Context
from state.ledger import Ledger
from state.paths import RunPaths
from state.records import EpisodeRecord

__all__ = ["build_environment", "checkpointed_runs", "episode_event", "evaluate", "evolve_envs", "evolve_harness", "new_run_id",
           "recorded_run", "run_coevolution", "split_pairs", "tune_gc", "unrecorded_note"]

evolve_harness = run_harness_evolution  # one harness-evolution block: (run id, final state with lineage and selected)
evolve_envs = run_env_evolution  # environment evolution: (run id, final state with outcomes, screenings, admitted)
build_environment = run_construct  # construction from a theme: (run id, final state with status, kept, pairs_written)


async def evaluate(
    bundle: str,
    pair_ids: list[str],
    context: Context,
    *,
    trials: int = 1,
    seed: int = 0,
    concurrency: int = 1,
    run_id: str | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    sides: list[str] | None = None,
) -> tuple[str, Metrics]:
    """Runs (or resumes, given the id of an interrupted run) an evaluation; the run id and its metrics
    (`graphs.runner.evaluate` gives its episode records too)."""
    run = await runner.evaluate(bundle, pair_ids, context, trials=trials, seed=seed, concurrency=concurrency, run_id=run_id,
                                on_episode=on_episode, sides=sides)
    return run.run_id, run.metrics


def checkpointed_runs() -> list[str]:
    """The ids of the evaluation runs with checkpoints in the runs directory, read without writing."""
    path = RunPaths.here().checkpoints
    if not path.is_file():
        return []
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("select distinct thread_id from checkpoints order by thread_id")]
    except sqlite3.DatabaseError:  # no checkpoint written yet, or not a checkpoint file: nothing to compare
        return []
    finally:
        conn.close()


def unrecorded_note(ledger: Ledger) -> str | None:
    """A note when the ledger holds no runs while the runs directory holds checkpoints of evaluation runs."""
    if ledger.runs():
        return None
    ids = checkpointed_runs()
    if not ids:
        return None
    shown = ", ".join(ids[:5]) + (", …" if len(ids) > 5 else "")
    return (f"the ledger {ledger.path} holds no runs, but {RunPaths.here().checkpoints} holds checkpoints of {len(ids)} evaluation "
            f"run(s) ({shown}): if they were recorded in this ledger, it was emptied or replaced; restore it from a backup")
