"""The tool coder: a tools module over a database, with the calls each tool
promises to accept and refuse (HERA App. B.1 "Tool generation"); on a retry it
gets back its previous module and the problems found by running it."""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import chat_model
from state.construction import ToolsDraft
from state.records import UsageRecord


async def tool_coder(database: str, previous: str, feedback: str, model: str, timeout_s: float = 1800.0) -> tuple[ToolsDraft, UsageRecord]:
    prompt = render("tool_coder", database=database, previous=previous or "(none yet)", feedback=feedback or "(first attempt)")
    return await chat_model(model, role="tool_coder", timeout_s=timeout_s).structured([HumanMessage(prompt)], ToolsDraft)
