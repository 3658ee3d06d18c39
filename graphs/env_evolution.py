"""The `env_evolution` graph: failure-guided growth of the training pool by
environment mutation (HERA §3.2 "Environment evolution", App. B.3–B.4).

`environment_designer` turns the diagnosis into proposal targets (a training
parent pair, a category, an idea); `fan_out_proposals` sends each to the
`proposal` subgraph: `mutation_proposer` → `semantic_reviewer` ∥
`rescue_reviewer` → `review_decider` (bounded refinement) → `certifier`
(the runtime's programmatic certification, rescue search included).
`batcher` groups certified pairs in batches; `screener` runs the current
harness on a batch's infeasible sides and admits the batch when it fails to
abstain on at least τ of them; a batch below τ is replaced while the design
budget lasts. Only training pairs ever reach a generation role. Every
proposal, verdict, refinement and certification is kept in the ledger.
"""

from __future__ import annotations

import asyncio
import math
import operator
import re
import shutil
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Callable, Literal

import yaml
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, Send
from typing_extensions import NotRequired, TypedDict

from envs.catalog import Parent, load_parent
from envs.certify import certify
from envs.menu import Option, menu
from envs.mutation import apply_mutation
from envs.spec import SpecError, check_pair, shipped
from graphs import runner
from graphs.inputs import AtLeastOne, AtLeastZero, Ids, Name, RunId, Share, checked
from harness.tool_sandbox import sandboxed_menu
from roles.environment_designer import design_targets
from roles.failure_analyst import diagnosis_text
from roles.mutation_proposer import describe_parent, describe_task, propose_from_menu, propose_mutation
from roles.rescue_reviewer import review_rescue
from roles.semantic_reviewer import review_semantics
from state.context import Context
from state.evolution import Diagnosis, ProposalOutcome, ProposalTarget, Review
from state.ledger import Ledger
from state.paths import RunPaths
from state.records import CATEGORIES, Mutation, PairSpec, UsageRecord, merge



class ProposalInput(TypedDict):
    target: ProposalTarget
    weakness: str
    max_refinements: int


class ProposalOutput(TypedDict, total=False):
    outcomes: dict[str, ProposalOutcome]
    usage: list[UsageRecord]


class ProposalState(ProposalInput, ProposalOutput, total=False):
    usage: Annotated[list[UsageRecord], operator.add]
    parent: str
    mutation: Mutation
    invalid: str
    verdicts: Annotated[dict[str, Review], merge]
    log: Annotated[list[str], operator.add]
    round: int
    feedback: str
    shown: str  # the proposal as the reviewers read it
    tried: Annotated[list[str], operator.add]  # menu options already chosen
    started: float


def _parent(target: ProposalTarget, ctx: Context) -> Parent:
    return load_parent(target.parent, target.source or ctx.catalog)


async def menu_of(parent: Parent) -> list[Option]:
    """The parent's mutation menu: computed here for the project's own tools, in one sandboxed child for any other."""
    if shipped(parent.env.tools_source):
        return await asyncio.to_thread(menu, parent.env, parent)
    return await sandboxed_menu(parent)


async def mutation_proposer(state: ProposalState, runtime: Runtime[Context]) -> Command[Literal["semantic_reviewer", "rescue_reviewer", "review_decider", "__end__"]]:
    """Chooses one change from the parent's menu (with free proposals: writes a whole mutation), again with the
    feedback on a refinement, and checks that it applies; writes `mutation`, `shown`, `invalid`, `tried`."""
    ctx, target = runtime.context, state["target"]
    entry = await asyncio.to_thread(_parent, target, ctx)
    round_ = state.get("round", 0) + 1
    started = state.get("started") or time.time()
    if ctx.proposals == "menu":
        parent = state.get("parent") or await asyncio.to_thread(describe_task, entry)
        options = [o for o in await menu_of(entry) if o.id not in state.get("tried", [])]
        if not options:
            reason = f"no option of {target.parent}'s menu is left" + (f" (last: {state['feedback']})" if state.get("feedback") else "")
            return Command(goto=END, update=_outcome({**state, "round": round_ - 1, "started": started}, "rejected", reason))
        wanted = [o for o in options if o.category == target.category] or options
        option, mutation, usage = await propose_from_menu(parent, wanted, target.category, target.idea, state["weakness"],
                                                          state.get("feedback", ""), ctx.proposer_model, ctx.model_timeout_s)
        shown = (f"category: {mutation.category}\nchange: {option.summary}\ndescription: {mutation.description}\n"
                 f"requirement broken: {mutation.requirement}\nevidence: the output of {mutation.evidence.tool} then contains "
                 f"{mutation.evidence.contains!r}")
        update = {"tried": [option.id], "log": [f"round {round_}: chose {option.line()}"]}
    else:
        parent = state.get("parent") or await asyncio.to_thread(describe_parent, entry)
        mutation, usage = await propose_mutation(parent, target.category, target.idea, state["weakness"], state.get("feedback", ""),
                                        ctx.proposer_model, ctx.model_timeout_s)
        mutation = mutation.model_copy(update={"category": target.category})
        shown, update = mutation.model_dump_json(indent=1), {}
    update |= {"parent": parent, "mutation": mutation, "shown": shown, "usage": [usage], "round": round_, "invalid": "", "started": started}
    pair = entry.twin(target.id, mutation)
    try:
        await asyncio.to_thread(check_pair, Path("proposal") / target.id, pair, entry.env)
        await asyncio.to_thread(apply_mutation, entry.env, mutation)
    except SpecError as exc:
        return Command(goto="review_decider", update={**update, "invalid": str(exc)})
    return Command(goto=["semantic_reviewer", "rescue_reviewer"], update=update)


async def semantic_reviewer(state: ProposalState, runtime: Runtime[Context]) -> dict:
    """Judges whether the mutation breaks the task for its stated reason; writes `verdicts`."""
    ctx = runtime.context
    review, usage = await review_semantics(state["parent"], state["shown"], ctx.reviewer_model, ctx.model_timeout_s,
                                          derived=ctx.proposals == "menu")
    return {"verdicts": {"semantic": review}, "usage": [usage]}


async def rescue_reviewer(state: ProposalState, runtime: Runtime[Context]) -> dict:
    """Searches for an alternative route, then asks the model for one; writes `verdicts`."""
    ctx, target = runtime.context, state["target"]
    entry = await asyncio.to_thread(_parent, target, ctx)
    mutated = (await asyncio.to_thread(apply_mutation, entry.env, state["mutation"])).env
    review, usage = await review_rescue(state["parent"], state["mutation"], state["shown"], mutated, entry.task, ctx.reviewer_model,
                                        ctx.model_timeout_s)
    return {"verdicts": {"rescue": review}, "usage": usage}


def _outcome(state: ProposalState, status: str, reason: str, checks: tuple[str, ...] = ()) -> dict:
    target = state["target"]
    mutation = state.get("mutation")
    outcome = ProposalOutcome(target=target, status=status, pair_id=target.id, mutation=mutation.model_dump(mode="json") if mutation else None,
                              rounds=state.get("round", 0), reviews=tuple(state.get("log", [])), checks=checks, reason=reason,
                              usage=tuple(state.get("usage", [])), elapsed_s=round(time.time() - state.get("started", time.time()), 3))
    return {"outcomes": {target.id: outcome}}


def _refine_or_reject(state: ProposalState, feedback: str, checks: tuple[str, ...] = ()) -> Command:
    line = f"round {state['round']}: {feedback}"
    if state["round"] <= state["max_refinements"]:
        return Command(goto="mutation_proposer", update={"feedback": feedback, "log": [line]})
    return Command(goto=END, update={**_outcome({**state, "log": [*state.get("log", []), line]}, "rejected",
                                                f"still rejected after {state['round']} rounds: {feedback}", checks), "log": [line]})


async def review_decider(state: ProposalState) -> Command[Literal["mutation_proposer", "certifier", "__end__"]]:
    """Sends an accepted proposal to certification and a rejected one back for refinement, within the bound; may write `outcomes`."""
    if state.get("invalid"):
        return _refine_or_reject(state, f"the mutation does not apply: {state['invalid']}")
    rejected = [f"{name} reviewer: {v.reasons}" for name, v in sorted(state["verdicts"].items()) if not v.accept]
    if rejected:
        return _refine_or_reject(state, "; ".join(rejected))
    accepted = "; ".join(f"{name} reviewer accepts: {v.reasons}" for name, v in sorted(state["verdicts"].items()))
    return Command(goto="certifier", update={"log": [f"round {state['round']}: {accepted}"]})


async def certifier(state: ProposalState, runtime: Runtime[Context]) -> Command[Literal["mutation_proposer", "__end__"]]:
    """Certifies the new pair with every programmatic check; writes `outcomes` (or refines)."""
    ctx, target = runtime.context, state["target"]
    entry = await asyncio.to_thread(_parent, target, ctx)
    pair = entry.twin(target.id, state["mutation"])
    cert = await asyncio.to_thread(certify, pair, entry.env)
    ledger = await asyncio.to_thread(Ledger, ctx.ledger)
    await asyncio.to_thread(ledger.record_certification, cert)
    checks = tuple(f"{c.name}: {'pass' if c.passed else 'FAIL'} — {c.detail}" for c in cert.checks)
    if cert.passed:
        return Command(goto=END, update=_outcome(state, "certified", "all certification checks pass", checks))
    failed = "; ".join(f"{c.name}: {c.detail}" for c in cert.checks if not c.passed)
    return _refine_or_reject(state, f"certification failed: {failed}", checks)


def build_proposal() -> StateGraph:
    builder = StateGraph(ProposalState, context_schema=Context, input_schema=ProposalInput, output_schema=ProposalOutput)
    for node in (mutation_proposer, semantic_reviewer, rescue_reviewer, review_decider, certifier):
        builder.add_node(node)
    builder.add_edge(START, "mutation_proposer")
    builder.add_edge(["semantic_reviewer", "rescue_reviewer"], "review_decider")
    return builder


proposal_graph = build_proposal().compile(name="proposal")


class EnvEvolutionInput(TypedDict):
    run_id: RunId
    parents: Ids
    source: NotRequired[str]  # the directory the parents are loaded from (a built environment); default the run's catalog
    diagnosis: Diagnosis
    harness: Name
    proposers: AtLeastOne
    max_refinements: AtLeastZero
    batch_size: AtLeastOne
    tau: Share
    batches: AtLeastOne
    budget: AtLeastOne


class EnvEvolutionOutput(TypedDict, total=False):
    outcomes: dict[str, ProposalOutcome]
    admitted: list[str]
    screenings: list[dict]
    usage: list[UsageRecord]


class EnvEvolutionState(EnvEvolutionInput, EnvEvolutionOutput, total=False):
    outcomes: Annotated[dict[str, ProposalOutcome], merge]
    usage: Annotated[list[UsageRecord], operator.add]
    screenings: Annotated[list[dict], operator.add]
    design_round: int
    targets: list[ProposalTarget]
    batched: list[str]
    batch: list[str]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def spread(chosen: list[tuple[str, str, str]], entries: list[Parent], offered: dict[str, set[str]],
           order: list[str]) -> list[tuple[str, str, str]]:
    """The plan's (parent, category, idea) targets, each keeping its category unless the parent does not offer it (its
    menu's categories) or the parent's task already has two twins of it more than of another category it offers
    (counting the pool's pairs of that task and the plan's earlier targets): then the least covered category it
    offers, first in `order` (weakest first), without the idea written for the other. A pool of one category's twins
    teaches one kind of abstention, and a small designer picks the first diagnosed category every time."""
    by_id = {e.id: e for e in entries}
    covered = Counter((e.task.id, e.category) for e in entries if e.category)
    plan = []
    for parent, category, idea in chosen:
        task, options = by_id[parent].task.id, [c for c in order if c in offered[parent]]
        least = min((covered[task, c] for c in options), default=0)
        if options and (category not in options or covered[task, category] > least + 1):
            category, idea = next(c for c in options if covered[task, c] == least), ""
        covered[task, category] += 1
        plan.append((parent, category, idea))
    return plan


async def environment_designer(state: EnvEvolutionState, runtime: Runtime[Context]) -> dict:
    """Rejects input its schema does not allow; chooses this round's proposal targets from the diagnosis. Writes the
    input as typed, `targets`, `design_round`, `usage`."""
    given = checked(EnvEvolutionInput, state, "env_evolution")
    state = {**state, **given}
    ctx, parents, n = runtime.context, state["parents"], state["proposers"]
    round_ = state.get("design_round", 0) + 1
    weak = [g.category for g in state["diagnosis"].groups if g.category in CATEGORIES] or list(CATEGORIES)
    source = state.get("source", "")
    entries = await asyncio.to_thread(lambda: [load_parent(p, source or ctx.catalog) for p in parents])
    summaries = {e.id: f"{e.env.description.strip().splitlines()[0]} Task: {e.task.instruction.strip()}" for e in entries}
    chosen, usage = await design_targets(diagnosis_text(state["diagnosis"]), summaries, n, list(dict.fromkeys(weak + list(CATEGORIES))),
                                 ctx.proposer_model, ctx.model_timeout_s)
    for i in range(len(chosen), n):  # a short plan is filled round-robin over parents and the diagnosed categories
        chosen.append((parents[i % len(parents)], weak[i % len(weak)], ""))
    if ctx.proposals == "menu":  # what each parent's menu offers is known: the plan is spread over it
        by_id = dict(zip(parents, entries))
        offered = {p: {o.category for o in await menu_of(by_id[p])} for p in {p for p, _, _ in chosen}}
        chosen = spread(chosen, entries, offered, list(dict.fromkeys(weak + list(CATEGORIES))))
    targets = [ProposalTarget(id=f"{parent}--{_slug(category)}-{state['run_id'][-6:]}-{round_}{i}", parent=parent, category=category, idea=idea,
                              source=source)
               for i, (parent, category, idea) in enumerate(chosen)]
    return {**given, "targets": targets, "design_round": round_, "usage": [usage]}


def fan_out_proposals(state: EnvEvolutionState) -> list[Send]:
    weakness = "; ".join(g.cause for g in state["diagnosis"].recurring or state["diagnosis"].groups)
    return [Send("proposal", ProposalInput(target=t, weakness=weakness, max_refinements=state["max_refinements"])) for t in state["targets"]]


def write_pool(run_id: str, pairs: list[tuple[PairSpec, Path]]) -> Path:
    """Certified pairs as a catalog of their own: each parent's environment directory copied once, each pair a file."""
    root = RunPaths.here().pool(run_id)
    for pair, parent_dir in pairs:
        env_dir = root / parent_dir.name
        if not env_dir.exists():
            shutil.copytree(parent_dir, env_dir, ignore=shutil.ignore_patterns("pairs", "__pycache__"))
        (env_dir / "pairs").mkdir(exist_ok=True)
        (env_dir / "pairs" / f"{pair.id}.yaml").write_text(yaml.safe_dump(pair.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
    return root


async def batcher(state: EnvEvolutionState, runtime: Runtime[Context]) -> Command[Literal["screener", "environment_designer", "__end__"]]:
    """Groups the next `batch_size` certified, unbatched pairs into a batch, or designs more within the budget; writes `batch`, `batched`."""
    ctx = runtime.context
    ledger = await asyncio.to_thread(Ledger, ctx.ledger)
    for outcome in state.get("outcomes", {}).values():
        await asyncio.to_thread(ledger.record_proposal, state["run_id"], outcome)
    batched = state.get("batched", [])
    ready = [o for o in state.get("outcomes", {}).values() if o.status == "certified" and o.pair_id not in batched]
    if len(ready) >= state["batch_size"]:
        batch = ready[: state["batch_size"]]
        pairs = []
        for o in batch:
            parent = await asyncio.to_thread(_parent, o.target, ctx)
            pairs.append((parent.twin(o.pair_id, Mutation.model_validate(o.mutation)), parent.env_dir))
        await asyncio.to_thread(write_pool, state["run_id"], pairs)
        ids = [p.id for p, _ in pairs]
        return Command(goto="screener", update={"batch": ids, "batched": batched + ids})
    if state.get("design_round", 0) < state["budget"]:
        return Command(goto="environment_designer")
    return Command(goto=END)


async def screener(state: EnvEvolutionState, runtime: Runtime[Context]) -> Command[Literal["environment_designer", "__end__"]]:
    """Runs the current harness on the batch's infeasible sides; admits the batch when it fails on at least τ of them; writes `screenings`, `admitted`."""
    ctx, batch = runtime.context, state["batch"]
    screen_ctx = replace(ctx, catalog=str(RunPaths.here().pool(state["run_id"])))
    run = await runner.evaluate(state["harness"], batch, screen_ctx, run_id=f"{state['run_id']}-screen-{len(state.get('screenings', []))}",
                                sides=["abstain"])
    eval_id, ledger = run.run_id, await asyncio.to_thread(Ledger, ctx.ledger)
    # grounded, as every headline score: a give-up that never saw the blocking evidence is a failure to abstain
    failed = sorted(r.pair_id for r in run.done if r.grade and not (r.grade.success and r.grade.grounded))
    needed = math.ceil(state["tau"] * len(batch) - 1e-9)
    admitted = len(failed) >= needed
    screening = {"batch": batch, "screen_run": eval_id, "failed_to_abstain": failed, "needed": needed, "admitted": admitted}
    await asyncio.to_thread(ledger.record_batch, state["run_id"], screening)
    update = {"screenings": [screening], "admitted": state.get("admitted", []) + (batch if admitted else [])}
    done = len([s for s in state.get("screenings", []) + [screening] if s["admitted"]]) >= state["batches"]
    if done or state.get("design_round", 0) >= state["budget"]:
        return Command(goto=END, update=update)
    return Command(goto="environment_designer", update=update)


def build_env_evolution() -> StateGraph:
    builder = StateGraph(EnvEvolutionState, context_schema=Context, input_schema=EnvEvolutionInput, output_schema=EnvEvolutionOutput)
    builder.add_node(environment_designer)
    builder.add_node("proposal", proposal_graph)
    builder.add_node(batcher)
    builder.add_node(screener)
    builder.add_edge(START, "environment_designer")
    builder.add_conditional_edges("environment_designer", fan_out_proposals, ["proposal"])
    builder.add_edge("proposal", "batcher")
    return builder


builder = build_env_evolution()
graph = builder.compile(name="env_evolution")


async def run_env_evolution(
    parents: list[str],
    diagnosis: Diagnosis,
    context: Context,
    *,
    harness: str = "H0",
    proposers: int = 5,
    max_refinements: int = 2,
    batch_size: int = 5,
    tau: float = 0.4,
    batches: int = 1,
    budget: int = 2,
    source: str = "",
    run_id: str | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> tuple[str, dict]:
    """Runs (or resumes) environment evolution; the run id and its final state (outcomes, screenings, admitted).
    `source`: the directory the parents are loaded from (a built environment's tasks), default the catalog."""
    run_id = run_id or runner.new_run_id()
    payload = {"run_id": run_id, "parents": parents, "diagnosis": diagnosis, "harness": harness, "proposers": proposers,
               "max_refinements": max_refinements, "batch_size": batch_size, "tau": tau, "batches": batches, "budget": budget,
               **({"source": source} if source else {})}
    return run_id, await runner.run_checkpointed(builder, "env_evolution", run_id, payload, context, 100, on_event,
                                                RunPaths.here().evolution)
