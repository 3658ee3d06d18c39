"""The task reviewer: the semantic review a generated task gets before it is
mutated (HERA App. B.2): is it a request a real user of the environment would
make, does the instruction say enough to know what to do, and does the
recorded solution do what it asks? The programmatic checks (replay, verifier
against perturbed outcomes) have passed already; this is what they cannot see."""

from __future__ import annotations

from typing import Literal

from langchain_core.messages import HumanMessage
from pydantic import Field, create_model

from prompts import render
from roles.models import chat_model
from state.evolution import Review
from state.records import Record, UsageRecord


async def review_task(context: str, tools: str, task: str, model: str, timeout_s: float = 1800.0) -> tuple[Review, UsageRecord]:
    prompt = render("task_reviewer", context=context, tools=tools, task=task)
    return await chat_model(model, role="task_reviewer", timeout_s=timeout_s).structured([HumanMessage(prompt)], Review)


NOTHING = "nothing of these"


async def review_request(context: str, request: str, actions: dict[str, str], done: set[str], values: list[str], told: set[str],
                           model: str, timeout_s: float = 1800.0) -> tuple[Review, UsageRecord]:
    """The review of a request made from a seed, whose records, details and rules hold by construction: the reviewer
    reads it as the assistant would and says, choosing from `actions` (write tool: what it does) and `values`, what it
    asks to have done and to be told; it passes when that is what its task checks (`done`, `told`). A 1.5B reviewer
    asked to judge such a request rejected every one, for faults that were not there; choosing what a request asks
    for is a reading it can do."""
    options = [f"{name}: {what}" for name, what in actions.items()] + [NOTHING]
    schema = create_model("Reading", __base__=Record,
                          reasons=(str, Field(description="what the request asks for, in your words")),
                          wants_done=(list[Literal[tuple(options)]], Field(min_length=1)),  # type: ignore[valid-type]
                          wants_told=(list[Literal[(*values, NOTHING)]], Field(min_length=1)))  # type: ignore[valid-type]
    prompt = render("task_reviewer_menu", context=context, request=request, actions="; ".join(options), values=", ".join([*values, NOTHING]))
    reading, usage = await chat_model(model, role="task_reviewer", timeout_s=timeout_s).structured([HumanMessage(prompt)], schema)
    chosen = {o.split(":")[0] for o in reading.wants_done} - {NOTHING}
    asked = set(reading.wants_told) - {NOTHING}
    problems = [f"read as asking to {', '.join(sorted(chosen)) or 'do nothing'}, not {', '.join(sorted(done))}"] if chosen != done else []
    problems += [f"read as not asking for {', '.join(sorted(told - asked))}"] if told - asked else []
    return Review(reasons=f"{reading.reasons} ({'; '.join(problems) or 'read as its task checks'})", accept=not problems), usage
