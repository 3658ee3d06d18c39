"""The programmatic API: every graph compiled with persistence and run by run id (through `graphs.runner`),
resumable after a crash.

    run = asyncio.run(evaluate("H0", ["weather-la-precip-missing"], Context(agent_model="local")))
    print(run.run_id, run.metrics.percent)
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from envs.catalog import load_entry, split_pairs
from graphs import runner
from graphs.construct import run_construct
from graphs.coevolution import CONFIGS, PRESETS, run_coevolution
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

__all__ = ["build_environment", "checkpointed_runs", "compare", "episode_event", "evaluate", "evolve_envs", "evolve_harness", "load_diagnosis",
           "new_run_id", "protocol", "recorded_run", "resume_request", "run_coevolution", "run_method", "split_pairs", "transfer", "tune_gc",
           "unrecorded_note"]

evolve_harness = run_harness_evolution  # one harness-evolution block: (run id, final state with lineage and selected)
evolve_envs = run_env_evolution  # environment evolution: (run id, final state with outcomes, screenings, admitted)
build_environment = run_construct  # construction from a theme: (run id, final state with status, kept, pairs_written)
evaluate = runner.evaluate  # an evaluation run (or resumed): its id, metrics and episode records (`runner.Evaluation`)


def resume_request(run_id: str | None, context: Context, **given) -> dict:
    """An evaluation's request (pair_ids, bundle, trials, seed, model, judge, max_turns): what is given, else what run
    `run_id` recorded when it is resumed, else the defaults (the whole split is the caller's to choose; no turn cap but
    the harness's own)."""
    recorded = (recorded_run(run_id, context) if run_id else None) or {}
    defaults = {"pair_ids": None, "bundle": "H0", "trials": 1, "seed": 0, "model": "local", "judge": None, "max_turns": None}
    request = {key: next((v for v in (given.get(key), recorded.get(key)) if v is not None and v != []), default)
               for key, default in defaults.items()}
    return request | {"max_turns": request["max_turns"] or None}  # a run recorded with no cap (0) is resumed with none


async def transfer(
    bundle: str,
    pair_ids: list[str],
    models: list[str],
    context: Context,
    *,
    judge: str | None = None,
    trials: int = 1,
    seed: int = 0,
    concurrency: int = 1,
    on_episode: Callable[[str, EpisodeRecord], None] | None = None,
    on_run: Callable[[str, str], None] | None = None,
) -> list[tuple[str, str, Metrics]]:
    """One frozen harness evaluated with each model on the same pairs, the judge fixed (default: the first model);
    (model, run id, metrics) per model. `on_episode(model, record)` after each episode, `on_run(model, run_id)` after
    each model's run."""
    judge = judge or models[0]
    results = []
    for model in models:
        run = await runner.evaluate(bundle, pair_ids, replace(context, agent_model=model, judge_model=judge), trials=trials,
                                    seed=seed, concurrency=concurrency,
                                    on_episode=on_episode and (lambda r, model=model: on_episode(model, r)))
        if on_run:
            on_run(model, run.run_id)
        results.append((model, run.run_id, run.metrics))
    return results


def protocol(preset: str, catalog: str, **overrides) -> tuple[dict, dict[str, list[str]]]:
    """A preset's settings (`PRESETS`) with the overrides that are not None on top, and its pairs per split, taken
    from the catalog's splits in order: of the preset's tier (unless it is "all"; a split of a custom catalog with no
    pair of that tier is taken whole), or of the tier given, strictly."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    settings = PRESETS[preset] | {k: v for k, v in overrides.items() if k in PRESETS[preset] and v is not None}
    tier = settings["tier"] if settings["tier"] != "all" else None

    def taken(split: str) -> list[str]:  # a split without pairs of the preset's own tier is taken whole; a tier asked for is kept to
        return (split_pairs(split, catalog, tier) or (split_pairs(split, catalog) if not overrides.get("tier") else []))[: settings[split]]

    pairs = {split: taken(split) for split in ("train", "validation", "bench")}
    if not pairs["train"] or not pairs["validation"]:
        raise ConfigError(f"the catalog needs training and validation pairs{f' of the {tier} tier' if tier else ''}")
    return {k: v for k, v in settings.items() if k not in pairs and k != "tier"}, pairs


async def run_method(
    name: str,
    settings: dict,
    pairs: dict[str, list[str]],
    context: Context,
    *,
    run_id: str | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> dict:
    """One compared method (`CONFIGS`) on a protocol (`protocol`): a static harness scored on the bench (else the
    validation pairs), or a co-evolution run; its run id, final harness, bench metrics (a dict, or None when the run
    scored no bench) and pool. `on_event(node, value)` as `run_coevolution`'s, an episode as ("episode", event)."""
    if name not in CONFIGS:
        raise ConfigError(f"unknown configuration {name!r}; known: {', '.join(CONFIGS)}")
    config, settings = CONFIGS[name], dict(settings)
    context = replace(context, max_turns=settings.pop("max_turns", context.max_turns))
    run_id = run_id or new_run_id()
    clock = WallClock(Ledger(context.ledger), run_id)

    def event(node: str, value: dict) -> None:
        clock.tick()
        if on_event:
            on_event(node, value)

    if "static" in config:
        run = await runner.evaluate(config["static"], pairs["bench"] or pairs["validation"], context, run_id=run_id,
                                    on_episode=lambda r: event("episode", episode_event(r)))
        clock.tick(force=True)
        return {"run_id": run.run_id, "harness": config["static"], "bench": run.metrics.model_dump()}
    run_id, final = await run_coevolution("H0", context, **pairs, **settings, **config, run_id=run_id, on_event=event)
    clock.tick(force=True)
    bench = next((r["bench"] for r in final.get("results", []) if r["round"] == "bench"), None)
    return {"run_id": run_id, "harness": final.get("harness"), "bench": bench, "pool": final.get("pool", [])}


class WallClock:
    """A method run's wall time in the ledger (`wall_s` of its run record): what earlier invocations of the same run
    recorded plus this one's, written on the run's events at most every `every_s` seconds, so a run killed and
    resumed still counts the time its first invocation spent up to its last event."""

    def __init__(self, ledger: Ledger, run_id: str, every_s: float = 10.0):
        self.ledger, self.run_id, self.every_s = ledger, run_id, every_s
        self.before = float((ledger.run(run_id) or {}).get("wall_s") or 0.0)
        self.start = self.written = time.monotonic()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.written >= self.every_s:
            self.ledger.record_run(self.run_id, wall_s=round(self.before + now - self.start, 3))  # a scripted run takes milliseconds
            self.written = now


async def compare(
    names: list[str],
    settings: dict,
    pairs: dict[str, list[str]],
    context: Context,
    *,
    run_id: str | None = None,
    on_event: Callable[[str, str, dict], None] | None = None,
) -> dict[str, dict]:
    """Several methods on one protocol, one after another: `run_method`'s result per method. Given a run id, each
    method's run is that id with the method's name (so a resumed comparison resumes every method). A method with the
    same settings as one before it (`CONFIGS`) is not run again: its result is that method's, with `same_as` naming it."""
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ConfigError(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    results: dict[str, dict] = {}
    for name in dict.fromkeys(names):
        same = next((n for n in results if CONFIGS[n] == CONFIGS[name]), None)
        results[name] = results[same] | {"same_as": same} if same else await run_method(
            name, settings, pairs, context, run_id=run_id and f"{run_id}-{name}",
            on_event=on_event and (lambda node, value, name=name: on_event(name, node, value)))
    return results


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
