"""The programmatic API: every graph compiled with persistence and run by run id (through `graphs.runner`),
resumable after a crash.

    run_id, metrics = asyncio.run(evaluate("H0", ["weather-la-precip-missing"], Context(agent_model="local")))
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from envs.catalog import load_entry, split_pairs
from graphs import runner
from graphs.construct import run_construct
from graphs.coevolution import run_coevolution
from graphs.env_evolution import run_env_evolution
from graphs.harness_evolution import run_harness_evolution
from state.metrics import Metrics
from graphs.runner import episode_event, new_run_id, recorded_run, tune_gc
from roles.failure_analyst import analyse_failures, failure_records
from state.context import ConfigError, Context
from state.evolution import Diagnosis
from state.ledger import Ledger
from state.paths import RunPaths
from state.records import EpisodeRecord

__all__ = ["build_environment", "checkpointed_runs", "episode_event", "evaluate", "evolve_envs", "evolve_harness", "load_diagnosis", "new_run_id",
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


async def load_diagnosis(source: str, context: Context) -> Diagnosis:
    """A diagnosis from a JSON file, or made by the failure analyst from an evaluation run's (training) episodes."""
    path = Path(source)
    if path.is_file():
        try:
            return Diagnosis.model_validate_json(path.read_text())
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigError(f"{path}: {'.'.join(map(str, err['loc'])) or '(root)'}: {err['msg']} (expected a Diagnosis JSON)") from None
    ledger = Ledger(context.ledger)
    if ledger.run(source) is None:
        raise ConfigError(f"--diagnosis {source!r}: neither a file nor a run in the ledger (see `hera runs list`)")
    records = [r for r in ledger.episodes(source) if r.status == "done"]
    entries = {r.pair_id: load_entry(r.pair_id, context.catalog) for r in records}
    if any(e.pair.split != "train" for e in entries.values()):
        raise ConfigError(f"run {source} holds validation or bench episodes; a diagnosis may only come from training pairs")
    diagnosis, _ = await analyse_failures(failure_records(records, entries), len(records), context.analyst_model, context.model_timeout_s)
    return diagnosis
