"""The semantic reviewer: does a proposed mutation break the task for the
stated reason, fit its category, stay realistic and leave observable evidence?"""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import chat_model
from state.evolution import Review
from state.records import UsageRecord


async def semantic_reviewer(parent: str, mutation: str, model: str, timeout_s: float = 1800.0) -> tuple[Review, UsageRecord]:
    prompt = render("semantic_reviewer", parent=parent, mutation=mutation)
    return await chat_model(model, role="semantic_reviewer", timeout_s=timeout_s).structured([HumanMessage(prompt)], Review)
