"""The task proposer: grounded tasks over a built environment and their
private verification rules, written before anyone solves them (HERA App. B.2
"Task generation")."""

from __future__ import annotations

import json

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import chat_model
from state.construction import TaskDrafts
from state.records import ToolInfo, UsageRecord


def describe_tools(tools: list[ToolInfo]) -> str:
    return "\n".join(f"- {t.name} ({'read' if t.read_only else 'write'}): {t.description.splitlines()[0]} "
                     f"params {json.dumps(t.input_schema.get('properties', {}))}" for t in tools)


async def propose_tasks(database: str, tools: list[ToolInfo], count: int, feedback: str, model: str,
                        timeout_s: float = 1800.0) -> tuple[TaskDrafts, UsageRecord]:
    prompt = render("task_proposer", database=database, tools=describe_tools(tools), count=str(count), feedback=feedback or "(first attempt)")
    return await chat_model(model, role="task_proposer", timeout_s=timeout_s).structured([HumanMessage(prompt)], TaskDrafts)
