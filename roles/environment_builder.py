"""The environment builder: from a theme, a database of typed tables and
consistent rows (HERA §3.1 "Environment construction", App. B.1 "State
construction"); on a retry it gets back the problems of its last draft."""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import chat_model
from state.construction import DatabaseDraft
from state.records import UsageRecord


async def environment_builder(theme: str, feedback: str, model: str, timeout_s: float = 1800.0) -> tuple[DatabaseDraft, UsageRecord]:
    prompt = render("environment_builder", theme=theme, feedback=feedback or "(first attempt)")
    return await chat_model(model, role="environment_builder", timeout_s=timeout_s).structured([HumanMessage(prompt)], DatabaseDraft)
