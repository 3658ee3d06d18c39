"""The rescue reviewer: a bounded programmatic search of the read-only tools
for the mutation's witness, then a model asked for any route it missed. A
witness found by the search rejects the proposal without asking the model; a
route the model names is run on the mutated environment and rejects the
proposal only if its output shows a witness (a small model's claimed routes
are mostly invented)."""

from __future__ import annotations

import asyncio
import json

from langchain_core.messages import HumanMessage

from envs.match import find_object
from envs.rescue import rescue_search
from envs.runtime import EnvInstance
from prompts import render
from roles.models import chat_model
from state.evolution import RescueClaim, Review
from state.records import EnvironmentSpec, Mutation, TaskSpec, UsageRecord

SEARCH_CALLS = 500


async def review_rescue(parent: str, mutation: Mutation, shown: str, mutated: EnvironmentSpec, task: TaskSpec, model: str,
                          timeout_s: float = 1800.0) -> tuple[Review, list[UsageRecord]]:
    """`shown` is the proposal as the model reads it."""
    found = await asyncio.to_thread(rescue_search, mutated, task, mutation.witness, SEARCH_CALLS)
    if found.found is not None:
        route = f"{found.found.tool}({found.found.args}) still returns the witness: {found.found.text[:300]}"
        return Review(accept=False, reasons=f"alternative route: {route}"), []
    search = f"no witness in {found.calls} read calls ({'exhausted' if found.exhausted else 'budget reached'})"
    prompt = render("rescue_reviewer", parent=parent, mutation=shown, search=search)
    claim, usage = await chat_model(model, role="rescue_reviewer", timeout_s=timeout_s).structured([HumanMessage(prompt)], RescueClaim)
    return await asyncio.to_thread(check_claim, claim, mutation, mutated), [usage]


def check_claim(claim: RescueClaim, mutation: Mutation, mutated: EnvironmentSpec) -> Review:
    """The model's route, run on the mutated environment: a rejection only when its output shows a witness."""
    if not claim.route_found:
        return Review(reasons=f"no route: {claim.reasons}", accept=True)
    call = f"{claim.tool}({json.dumps(claim.arguments, ensure_ascii=False, default=str)})"
    instance = EnvInstance(mutated)
    try:
        read_tools = {t.name for t in instance.public_tools if t.read_only}
        if claim.tool not in read_tools:
            return Review(reasons=f"the route {call} names no read-only tool ({', '.join(sorted(read_tools))}); the claim is not taken",
                          accept=True)
        obs = instance.call(claim.tool, claim.arguments)
    finally:
        instance.close()
    witness = obs.ok and next((w for w in mutation.witness if find_object(w, obs.output)), None)
    if witness:
        return Review(reasons=f"alternative route: {call} still shows {witness}: {obs.text[:300]}", accept=False)
    return Review(reasons=f"the route {call} was run and shows no witness ({obs.text[:160]}); the claim is not taken", accept=True)
