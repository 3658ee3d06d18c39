"""The environment designer (HERA §3.2, Fig. 1): turns a diagnosis of the current harness's failures into this
round's targets, each a parent pair, a category of change and an idea, grammar-constrained to the parents and
categories allowed."""

from __future__ import annotations

from typing import Literal

from langchain_core.messages import HumanMessage
from pydantic import Field, create_model

from prompts import render
from roles.models import chat_model
from state.records import CATEGORIES, Record, UsageRecord


def plan_schema(parents: list[str]) -> type[Record]:
    """The designer's response format, with parents and categories constrained to the allowed values."""
    target = create_model("Target", __base__=Record, parent=(Literal[tuple(parents)], ...),  # type: ignore[valid-type]
                          category=(Literal[tuple(CATEGORIES)], ...), idea=(str, Field(description="the change, in one sentence")))  # type: ignore[valid-type]
    return create_model("DesignPlan", __base__=Record, targets=(list[target], ...))


async def design_targets(diagnosis: str, parents: dict[str, str], count: int, categories: list[str], model: str,
                               timeout_s: float = 1800.0) -> tuple[list[tuple[str, str, str]], UsageRecord]:
    """Up to `count` (parent, category, idea) targets, `parents` mapping each allowed parent to its summary and
    `categories` listed weakest first."""
    summaries = "\n".join(f"- {p}: {summary}" for p, summary in parents.items())
    prompt = render("environment_designer", diagnosis=diagnosis, parents=summaries, count=str(count), categories=", ".join(categories))
    plan, usage = await chat_model(model, role="environment_designer", timeout_s=timeout_s).structured(
        [HumanMessage(prompt)], plan_schema(list(parents)))
    return [(t.parent, t.category, t.idea) for t in plan.targets][:count], usage
