"""The solver: an independent attempt at a proposed task through the public
tools only (HERA App. B.2 "Public-tool execution"). It is given the public
context, the instruction and the tools' public faces, and a function that
runs a call; never the task's verification rules or the database rows."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage

from prompts import render
from roles.models import chat_model
from roles.tool_calls import text_of
from state.construction import SolverAttempt
from state.records import Observation, ToolInfo

CallTool = Callable[[str, dict[str, Any]], Awaitable[Observation]]


async def solver(task_id: str, instruction: str, context: str, tools: list[ToolInfo], call: CallTool, model: str,
                 max_turns: int = 12, timeout_s: float = 1800.0) -> SolverAttempt:
    """Model turns and tool calls until a reply without calls (the final answer) or the turn limit."""
    llm = chat_model(model, role="solver", timeout_s=timeout_s)
    messages: list[BaseMessage] = [SystemMessage(render("solver", context=context)), HumanMessage(instruction)]
    observations: list[Observation] = []
    usage = []
    for _ in range(max_turns):
        # One grammar-constrained action a turn: a small model's free-text turns copied the tools' argument
        # descriptions as values or answered without a call.
        done = await llm.complete(messages, tools, action_mode="structured")
        usage.append(done.usage)
        messages.append(done.message)
        if not done.message.tool_calls:
            return SolverAttempt(task_id=task_id, answer=text_of(done.message.content), observations=tuple(observations),
                                 termination="final_answer", usage=tuple(usage))
        for request in done.message.tool_calls:
            obs = await call(request["name"], request.get("args") or {})
            observations.append(obs)
            messages.append(ToolMessage(obs.text, tool_call_id=request["id"]))
    return SolverAttempt(task_id=task_id, answer="", observations=tuple(observations), termination="turn_limit", usage=tuple(usage))
