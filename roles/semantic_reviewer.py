"""The semantic reviewer: does a proposed mutation break the task for the
stated reason, fit its category, stay realistic and leave observable evidence?"""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import chat_model
from state.evolution import Feasibility, Review
from state.records import UsageRecord


async def review_semantics(parent: str, mutation: str, model: str, timeout_s: float = 1800.0, *, derived: bool = False) -> tuple[Review, UsageRecord]:
    """`derived`: a menu choice, whose evidence and lack of rescue are already proven; only the semantic question is asked."""
    model_ = chat_model(model, role="semantic_reviewer", timeout_s=timeout_s)
    if not derived:
        return await model_.structured([HumanMessage(render("semantic_reviewer", parent=parent, mutation=mutation))], Review)
    reading, usage = await model_.structured([HumanMessage(render("semantic_reviewer_menu", parent=parent, mutation=mutation))], Feasibility)
    return Review(reasons=reading.reasons, accept=not reading.still_possible), usage
