"""The `coevolution` graph: HERA Stage 2 (§3.2, App. A.3), rounds of
environment evolution then harness evolution.

`setup` gives the run a catalog of its own holding the training and
validation pairs only (the bench split is never copied in, so no role of
the run can see it). Each round: `diagnose` runs the current harness on the
cumulative training pool (the rollout cache makes episodes it already ran
free) and has the failure analyst diagnose its failures; `evolve_envs` runs
the `env_evolution` graph from that diagnosis and appends the admitted batch
to the pool; `evolve_harness` runs one `harness_evolution` block on the grown
pool, selecting on the fixed validation pairs; `record` writes the round to
the ledger. `final` scores the last harness on the reserved bench pairs.

How the pool grows is the configuration that separates HERA's baselines
(`env`): `coevolve` (failure-guided batches each round, screened with the
current harness), `augment` (batches generated without a diagnosis and
admitted unscreened), `h0` (all batches generated up front from H0's
failures, released one per round) and `none` (harness-only evolution).
Sub-runs are graphs of their own, checkpointed under derived run ids, so a
killed co-evolution resumes inside the sub-run it was in; `steps` shows, per
round, each sub-run's id and the nodes it ran (read back from its
checkpoints), so a co-evolution thread in Studio shows what its rounds did.
"""

from __future__ import annotations

import asyncio
import operator
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Callable, Literal

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from typing_extensions import NotRequired, TypedDict

from envs.catalog import load_entry
from graphs import runner
from graphs import env_evolution, harness_evolution
from graphs.env_evolution import run_env_evolution
from graphs.harness_evolution import run_harness_evolution
from graphs.inputs import AtLeastOne, AtLeastZero, Id, Ids, Level, Name, RunId, Share, checked
from graphs.selection import GATE_LEVEL
from roles.failure_analyst import analyse_failures, failure_records
from state.context import ConfigError, Context
from state.evolution import Diagnosis, LineageEntry
from envs.catalog import split_pairs
from state.ledger import Ledger
from state.paths import RunPaths
from state.records import UsageRecord, merge

EnvMode = Literal["coevolve", "augment", "h0", "none"]

# Protocol sizes: pairs per split (None: the whole split), the loop's budgets and a cap on every
# episode's turns (None: each harness's own limit). `paper` is HERA's (20 training pairs growing by
# 5 a round for 6 rounds, 15 validation pairs, 4 candidates a block); `quick` fits about an hour on the
# embedded local model on two CPU cores (42–54 minutes measured), where a 30-turn episode alone can take half an hour.
# Its 6 validation pairs (12 tasks) are all the short tier has; the selection gate (a sign test over
# tasks at 0.05) passes when 5 tasks more are solved and none fewer, and each pair more costs two
# episodes per harness scored. One refinement round lets a proposal that a review or check rejects
# choose again with the reason in hand.
# `tier` picks the pairs: `short` ones (2–3 reference calls) are the tasks a 1.5B model can finish; on the
# standard tier no harness completed a feasible task within 10 turns in local runs (Act 0/6 for H0 and for
# every candidate), which leaves selection nothing to see on the act side. `standard` was sized from local
# episode times (10-turn cap, two cores: an H0 episode 1–1.6 min on average, a structured-mode candidate's
# 0.1–0.8 min, building a candidate 3–5 min, a certified proposal 2–4 min) to about 3 hours; measured, one
# co-evolution run took 96 minutes (H0's diagnosis and first round 50, the next two rounds 25 together, the
# bench 21) with 24 H0 episodes reused from quick runs. Later rounds took 59–87 minutes each (std4–std6), and
# from scratch (std9) a round took 68 minutes and H0 1.2–1.6 minutes a bench episode, so it is one round
# (`--rounds` for more) and all 20 short bench pairs: with 10, a paired bootstrap interval above 0 needed four
# pairs up and none down (+40 points), with 20 four pairs up is +20 (std10, from scratch on 20: co-evolution
# 98 minutes, H0's bench 30, 2 h 8 min in all). Its pairs include quick's, so a harness's quick
# episodes are reused from the rollout cache; like every run it resumes with `--run-id`. Every harness is scored
# twice on the validation pairs (`gate_trials`): one candidate scored validation Abstain 1/6, 2/6 and 6/6 on three
# trials of the same pairs. Measured with it: 2 rounds of co-evolution in 81 minutes (12 of H0's 24 validation
# episodes reused, bench 20 H0 episodes included). Its gate is at STANDARD_GATE_LEVEL: at 0.05 it needs 5 of the
# 12 validation tasks better and none worse, and the candidates that did best in local runs (std2: 3 and 4 tasks
# better, std3: 3, every one with none worse, Act up and Over-abstain down) were all turned away, so each round
# started again from H0; at 1/8 three tasks better and none worse pass, one flipped pair (two tasks) still never
# does, and the guards still stop a candidate that refuses more. The bench, untouched until the end, judges what
# was adopted.
STANDARD_GATE_LEVEL = 0.125
PRESETS: dict[str, dict] = {
    "quick": {"train": 2, "validation": 6, "bench": 4, "tier": "short", "rounds": 1, "proposers": 1, "batch_size": 1, "budget": 1,
              "max_refinements": 1, "candidates": 1, "review_rounds": 1, "tau": 0.4, "gate_level": GATE_LEVEL, "gate_trials": 1, "max_turns": 10},
    "standard": {"train": 4, "validation": 6, "bench": 20, "tier": "short", "rounds": 1, "proposers": 2, "batch_size": 2,
                 "budget": 1, "max_refinements": 1, "candidates": 1, "review_rounds": 1, "tau": 0.4,
                 "gate_level": STANDARD_GATE_LEVEL, "gate_trials": 2, "max_turns": 10},
    "paper": {"train": 20, "validation": 15, "bench": None, "tier": "all", "rounds": 6, "proposers": 5, "batch_size": 5, "budget": 2,
              "max_refinements": 2, "candidates": 4, "review_rounds": 2, "tau": 0.4, "gate_level": GATE_LEVEL, "gate_trials": 1,
              "max_turns": None},
}

# The compared methods as settings of this graph (HERA Table 1, ECDYSIS Table 1). A `static` method is a
# bundle scored as it is. HERA's harness-only baseline evolves the harness as ECDYSIS does (fdcr) on the fixed
# pool, so `harness-only` and `fdcr` are one configuration under two names: `api.compare` runs it once.
CONFIGS: dict[str, dict] = {
    "h0": {"static": "H0"},
    "h0-abstain-prompt": {"static": "H0-abstain-prompt"},
    "harness-only": {"env": "none", "mode": "fdcr"},
    "task-augmented": {"env": "augment"},
    "h0-failures": {"env": "h0"},
    "coevolution": {"env": "coevolve"},
    "serial": {"env": "none", "mode": "serial"},
    "aggregated": {"env": "none", "mode": "aggregate"},
    "fdcr": {"env": "none", "mode": "fdcr"},
}


class CoevolutionInput(TypedDict):
    run_id: RunId
    base: Name
    train: Ids
    validation: Ids
    bench: list[Id]  # none: no bench at the end
    rounds: AtLeastOne
    env: EnvMode
    # environment evolution
    proposers: AtLeastOne
    batch_size: AtLeastOne
    tau: Share
    budget: AtLeastOne
    max_refinements: AtLeastZero
    # harness evolution
    candidates: AtLeastOne
    mode: Literal["fdcr", "aggregate", "serial"]
    channel: Literal["structured", "code"]
    review_rounds: AtLeastZero
    rule: Literal["hera", "ecdysis"]
    gate_level: NotRequired[Level]
    gate_trials: NotRequired[AtLeastOne]


class CoevolutionOutput(TypedDict, total=False):
    pool: list[str]
    batches: dict[str, list[str]]
    harness: str
    lineage: dict[str, LineageEntry]
    results: list[dict]
    steps: list[dict]  # {round, graph, run, nodes}: each sub-run and the nodes it ran


class CoevolutionState(CoevolutionInput, CoevolutionOutput, total=False):
    lineage: Annotated[dict[str, LineageEntry], merge]
    results: Annotated[list[dict], operator.add]
    steps: Annotated[list[dict], operator.add]
    usage: Annotated[list[UsageRecord], operator.add]
    catalog: str
    round: int
    diagnosis: Diagnosis
    reserve: list[list[str]]  # env="h0": batches generated up front, released one per round
    env_run: str
    tried: list[str]  # the failure groups the candidates of the blocks so far started from


def _sub(ctx: Context, state: CoevolutionState) -> Context:
    return replace(ctx, catalog=state["catalog"])


def _copy_pairs(source: Path, catalog: Path, pair_ids: list[str]) -> None:
    """Copies each pair's file, and its environment directory once, from catalog `source` into `catalog` (made if need
    be); a pair `source` does not hold is a KeyError before anything is copied."""
    for path in [load_entry(pair_id, source).path for pair_id in pair_ids]:
        env_dir = catalog / path.parent.parent.name
        if not env_dir.exists():
            shutil.copytree(path.parent.parent, env_dir, ignore=shutil.ignore_patterns("pairs", "__pycache__"))
        (env_dir / "pairs").mkdir(exist_ok=True)
        shutil.copy2(path, env_dir / "pairs" / path.name)


def _forward(node: str, value: dict) -> None:
    """Passes a sub-run's progress, its episodes and the nodes it finishes, on to whoever streams this graph."""
    get_stream_writer()(value if node == "episode" else {"stage": node})


def _progress(record) -> None:
    get_stream_writer()(runner.episode_event(record))


async def _step(round_: int, module, run_id: str) -> dict:
    """A sub-run as the co-evolution's state shows it: its graph, run id and the nodes it ran."""
    name = module.graph.name
    nodes = await runner.node_path(module.builder, name, run_id, RunPaths.here().evolution)
    return {"round": round_, "graph": name, "run": run_id, "nodes": nodes}


async def setup(state: CoevolutionState, runtime: Runtime[Context]) -> dict:
    """Rejects input its schema does not allow; the run's catalog (training and validation pairs only). Writes the
    input as typed, `catalog`, `pool`, `batches`, `harness`, `round`."""
    given = checked(CoevolutionInput, state, "coevolution")
    state = {**state, **given}
    catalog = RunPaths.here().coevolution_run(state["run_id"]) / "catalog"

    def fill() -> None:
        if catalog.exists():  # a crash between the copy and the checkpoint: start the copy over
            shutil.rmtree(catalog)
        try:
            _copy_pairs(Path(runtime.context.catalog), catalog, state["train"] + state["validation"])
        except KeyError as exc:
            raise ConfigError(f"coevolution input: {exc.args[0]}") from None

    await asyncio.to_thread(fill)
    return {**given, "catalog": str(catalog), "pool": list(state["train"]), "batches": {"initial": list(state["train"])},
            "harness": state["base"], "round": 1}


def needs_diagnosis(state: CoevolutionState) -> bool:
    return state["env"] == "coevolve" or state["env"] == "h0" and state["round"] == 1


def route_round(state: CoevolutionState) -> Literal["diagnose", "evolve_envs", "final"]:
    if state["round"] > state["rounds"]:
        return "final"
    return "diagnose" if needs_diagnosis(state) else "evolve_envs"


async def diagnose(state: CoevolutionState, runtime: Runtime[Context]) -> dict:
    """The current harness's training failures, diagnosed; writes `diagnosis`, `usage`."""
    ctx = _sub(runtime.context, state)
    run = await runner.evaluate(state["harness"], state["pool"], ctx, run_id=f"{state['run_id']}-r{state['round']}-pool",
                                on_episode=_progress)
    records = run.done
    entries = await asyncio.to_thread(lambda: {p: load_entry(p, ctx.catalog) for p in state["pool"]})
    diagnosis, usage = await analyse_failures(failure_records(records, entries), len(records), ctx.analyst_model, ctx.model_timeout_s)
    return {"diagnosis": diagnosis, "usage": usage}


async def evolve_envs(state: CoevolutionState, runtime: Runtime[Context]) -> dict:
    """Grows the pool by this round's batch, if any; writes `pool`, `batches`, `reserve`, `env_run`, `steps`."""
    ctx, round_, env = _sub(runtime.context, state), state["round"], state["env"]
    if env == "none":
        return {"env_run": ""}
    reserve, env_run, admitted, steps = list(state.get("reserve", [])), "", [], []
    if env != "h0" or round_ == 1:
        env_run = f"{state['run_id']}-e{round_}"
        diagnosis = Diagnosis() if env == "augment" else state["diagnosis"]
        batches = state["rounds"] if env == "h0" else 1
        _, final = await run_env_evolution(
            state["pool"], diagnosis, ctx, harness=state["harness"], proposers=state["proposers"],
            max_refinements=state["max_refinements"], batch_size=state["batch_size"], tau=0.0 if env == "augment" else state["tau"],
            batches=batches, budget=state["budget"] * batches, run_id=env_run, on_event=_forward)
        admitted = [s["batch"] for s in final.get("screenings", []) if s["admitted"]]
        steps = [await _step(round_, env_evolution, env_run)]
        await asyncio.to_thread(_copy_pairs, RunPaths.here().pool(env_run), Path(state["catalog"]), [p for b in admitted for p in b])
        if env == "h0":
            reserve, admitted = admitted[1:], admitted[:1]
    elif reserve:
        admitted, reserve = reserve[:1], reserve[1:]
    batches = dict(state["batches"])
    for i, batch in enumerate(admitted, 1):
        batches[f"round-{round_}-{i}"] = batch
    pool = state["pool"] + [p for b in admitted for p in b]
    return {"pool": pool, "batches": batches, "reserve": reserve, "env_run": env_run, "steps": steps}


async def evolve_harness(state: CoevolutionState, runtime: Runtime[Context]) -> dict:
    """One harness-evolution block on the grown pool, selecting on the validation pairs; writes `harness`, `lineage`,
    `tried`, `results`, `steps`."""
    ctx = _sub(runtime.context, state)
    harness_run, final = await run_harness_evolution(
        state["harness"], state["pool"], state["validation"], ctx, candidates=state["candidates"], mode=state["mode"],
        channel=state["channel"], rounds=state["review_rounds"], rule=state["rule"], gate_level=state.get("gate_level", GATE_LEVEL),
        gate_trials=state.get("gate_trials", 1), tried=state.get("tried", []), run_id=f"{state['run_id']}-h{state['round']}", on_event=_forward)
    selected = final["lineage"][final["selected"]]
    return {"harness": selected.path, "lineage": final["lineage"], "tried": state.get("tried", []) + final.get("started", []),
            "steps": [await _step(state["round"], harness_evolution, harness_run)],
            "results": [{"round": state["round"], "harness_run": harness_run, "harness": selected.id, "bundle": selected.path,
                         "train_run": selected.train.run_id, "validation_run": selected.validation.run_id,
                         "train": selected.train.model_dump(), "validation": selected.validation.model_dump()}]}


async def record(state: CoevolutionState, runtime: Runtime[Context]) -> dict:
    """Writes the round to the ledger and moves to the next; writes `round`."""
    result = state["results"][-1]
    await asyncio.to_thread(lambda: Ledger(runtime.context.ledger).record_round(
        state["run_id"], state["round"], env_run=state.get("env_run") or None, pool=state["pool"], batches=state["batches"],
        **{k: result[k] for k in ("harness_run", "harness", "bundle", "train_run", "validation_run")}))
    return {"round": state["round"] + 1}


async def final(state: CoevolutionState, runtime: Runtime[Context]) -> dict:
    """Scores the final harness on the reserved bench pairs (from the user's catalog); writes `results`."""
    if not state["bench"] or not state.get("results"):
        return {}
    get_stream_writer()({"stage": "bench"})
    ctx = runtime.context
    run = await runner.evaluate(state["harness"], state["bench"], ctx, run_id=f"{state['run_id']}-bench", on_episode=_progress)
    await asyncio.to_thread(lambda: Ledger(ctx.ledger).record_round(state["run_id"], state["rounds"], bench_run=run.run_id))
    return {"results": [{"round": "bench", "bench_run": run.run_id, "bench": run.metrics.model_dump()}]}


def build_coevolution() -> StateGraph:
    builder = StateGraph(CoevolutionState, context_schema=Context, input_schema=CoevolutionInput, output_schema=CoevolutionOutput)
    for node in (setup, diagnose, evolve_envs, evolve_harness, record, final):
        builder.add_node(node)
    builder.add_edge(START, "setup")
    builder.add_conditional_edges("setup", route_round)
    builder.add_edge("diagnose", "evolve_envs")
    builder.add_edge("evolve_envs", "evolve_harness")
    builder.add_edge("evolve_harness", "record")
    builder.add_conditional_edges("record", route_round)
    builder.add_edge("final", END)
    return builder


builder = build_coevolution()
graph = builder.compile(name="coevolution")


async def run_coevolution(
    base: str = "H0",
    context: Context | None = None,
    *,
    train: list[str] | None = None,
    validation: list[str] | None = None,
    bench: list[str] | None = None,
    rounds: int = 6,
    env: str = "coevolve",
    proposers: int = 5,
    batch_size: int = 5,
    tau: float = 0.4,
    budget: int = 2,
    max_refinements: int = 2,
    candidates: int = 4,
    mode: str = "fdcr",
    channel: str = "structured",
    review_rounds: int = 2,
    rule: str = "hera",
    gate_level: float = GATE_LEVEL,
    gate_trials: int = 1,
    run_id: str | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> tuple[str, dict]:
    """Runs (or resumes) a co-evolution: `rounds` of environment then harness evolution; the run id and its final
    state (pool, batches, harness, lineage, per-round results). Pairs default to the catalog's splits."""
    context = context or Context()
    run_id = run_id or runner.new_run_id()
    payload = {"run_id": run_id, "base": base, "train": train if train is not None else split_pairs("train", context.catalog),
               "validation": validation if validation is not None else split_pairs("validation", context.catalog),
               "bench": bench if bench is not None else split_pairs("bench", context.catalog), "rounds": rounds, "env": env,
               "proposers": proposers, "batch_size": batch_size, "tau": tau, "budget": budget, "max_refinements": max_refinements,
               "candidates": candidates, "mode": mode, "channel": channel, "review_rounds": review_rounds, "rule": rule,
               "gate_level": gate_level, "gate_trials": gate_trials}
    return run_id, await runner.run_checkpointed(builder, "coevolution", run_id, payload, context, 20 + 10 * rounds,
                                           on_event, RunPaths.here().coevolution)
