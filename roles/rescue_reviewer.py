"""The rescue reviewer: a bounded programmatic search of the read-only tools
for the mutation's witness, then a model asked for any route it missed. A
witness found by the search rejects the proposal without asking the model."""

from __future__ import annotations

import asyncio

from langchain_core.messages import HumanMessage

from envs.rescue import rescue_search
from prompts import render
from roles.models import chat_model
from state.evolution import Review
from state.records import EnvironmentSpec, Mutation, TaskSpec, UsageRecord

SEARCH_CALLS = 500


async def rescue_reviewer(parent: str, mutation: Mutation, shown: str, mutated: EnvironmentSpec, task: TaskSpec, model: str,
                          timeout_s: float = 1800.0) -> tuple[Review, list[UsageRecord]]:
    """`shown` is the proposal as the model reads it."""
    found = await asyncio.to_thread(rescue_search, mutated, task, mutation.witness, SEARCH_CALLS)
    if found.found is not None:
        route = f"{found.found.tool}({found.found.args}) still returns the witness: {found.found.text[:300]}"
        return Review(accept=False, reasons=f"alternative route: {route}"), []
    search = f"no witness in {found.calls} read calls ({'exhausted' if found.exhausted else 'budget reached'})"
    prompt = render("rescue_reviewer", parent=parent, mutation=shown, search=search)
    review, usage = await chat_model(model, role="rescue_reviewer", timeout_s=timeout_s).structured([HumanMessage(prompt)], Review)
    return review, [usage]
