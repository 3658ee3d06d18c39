"""The task reviewer: the semantic review a generated task gets before it is
mutated (HERA App. B.2): is it a request a real user of the environment would
make, does the instruction say enough to know what to do, and does the
recorded solution do what it asks? The programmatic checks (replay, verifier
against perturbed outcomes) have passed already; this is what they cannot see."""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import chat_model
from state.evolution import Review
from state.records import UsageRecord


async def task_reviewer(context: str, tools: str, task: str, model: str, timeout_s: float = 1800.0) -> tuple[Review, UsageRecord]:
    prompt = render("task_reviewer", context=context, tools=tools, task=task)
    return await chat_model(model, role="task_reviewer", timeout_s=timeout_s).structured([HumanMessage(prompt)], Review)
