"""The semantic reviewer: does a proposed mutation break the task for the
stated reason, fit its category, stay realistic and leave observable evidence?"""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import chat_model
from state.evolution import Review
from state.records import UsageRecord


async def semantic_reviewer(parent: str, mutation: str, model: str, timeout_s: float = 1800.0, *, derived: bool = False) -> tuple[Review, UsageRecord]:
    """`derived`: a menu choice, whose evidence and lack of rescue are already proven; only the semantic question is asked."""
    prompt = render("semantic_reviewer_menu" if derived else "semantic_reviewer", parent=parent, mutation=mutation)
    return await chat_model(model, role="semantic_reviewer", timeout_s=timeout_s).structured([HumanMessage(prompt)], Review)
