"""The `fdcr` graph: failure-driven collaborative review (ECDYSIS §3.3).

`analyst` → `critic` → `engineer` for K rounds over one shared transcript,
then `moderator` writes the typed `ModificationSpec`. With `review` off the
moderator writes the spec straight from the diagnosis (ECDYSIS "w/o FDCR").
"""

from __future__ import annotations

import operator
from typing import Annotated, Literal

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from harness.components import catalog_text
from prompts import render
from roles.models import chat_model
from state.context import Context
from state.evolution import Diagnosis, ModificationSpec
from state.records import Record, UsageRecord

TURN_TOKENS = 400


class Turn(Record):
    role: Literal["analyst", "critic", "engineer"]
    round: int
    text: str


class FdcrInput(TypedDict):
    diagnosis: Diagnosis
    harness: str
    rounds: int
    review: bool


class FdcrOutput(TypedDict, total=False):
    spec: ModificationSpec
    transcript: list[Turn]
    usage: list[UsageRecord]


class FdcrState(FdcrInput, FdcrOutput, total=False):
    transcript: Annotated[list[Turn], operator.add]
    usage: Annotated[list[UsageRecord], operator.add]


def diagnosis_text(diagnosis: Diagnosis) -> str:
    lines = [f"{diagnosis.failures} failures in {diagnosis.episodes} episodes."]
    for g in diagnosis.groups:
        label = "recurring" if g.recurring else "single task"
        lines.append(f"- [{label}, {len(g.pair_ids)} tasks] {g.kind.replace('_', ' ')} / {g.category.replace('_', ' ')}: "
                     f"{g.cause} Evidence: {g.evidence}")
    return "\n".join(lines)


def transcript_text(turns: list[Turn]) -> str:
    return "\n\n".join(f"[{t.role.title()}, round {t.round}] {t.text}" for t in turns) or "(nothing yet)"


async def _speak(role: str, state: FdcrState, ctx: Context) -> dict:
    transcript = state.get("transcript", [])
    round_ = 1 + sum(t.role == "engineer" for t in transcript)
    prompt = render(role, harness=state["harness"], diagnosis=diagnosis_text(state["diagnosis"]),
                    transcript=transcript_text(transcript), round=str(round_), components=catalog_text())
    done = await chat_model(ctx.analyst_model, role=role, timeout_s=ctx.model_timeout_s).complete([HumanMessage(prompt)], max_tokens=TURN_TOKENS)
    return {"transcript": [Turn(role=role, round=round_, text=str(done.message.content).strip())], "usage": [done.usage]}


async def analyst(state: FdcrState, runtime: Runtime[Context]) -> dict:
    """Explains the recurring failures and proposes fixes; writes `transcript`, `usage`."""
    return await _speak("analyst", state, runtime.context)


async def critic(state: FdcrState, runtime: Runtime[Context]) -> dict:
    """Challenges the analyst for over-abstention, overfitting and gaps; writes `transcript`, `usage`."""
    return await _speak("critic", state, runtime.context)


async def engineer(state: FdcrState, runtime: Runtime[Context]) -> dict:
    """Turns the agreed points into implementable changes; writes `transcript`, `usage`."""
    return await _speak("engineer", state, runtime.context)


async def moderator(state: FdcrState, runtime: Runtime[Context]) -> dict:
    """Writes the structured modification spec; writes `spec`, `usage`."""
    ctx = runtime.context
    prompt = render("moderator", harness=state["harness"], diagnosis=diagnosis_text(state["diagnosis"]),
                    transcript=transcript_text(state.get("transcript", [])), components=catalog_text())
    spec, usage = await chat_model(ctx.analyst_model, role="moderator", timeout_s=ctx.model_timeout_s).structured(
        [HumanMessage(prompt)], ModificationSpec)
    return {"spec": spec, "usage": [usage]}


def route_start(state: FdcrState) -> Literal["analyst", "moderator"]:
    return "analyst" if state["review"] and state["rounds"] > 0 else "moderator"


def route_after_engineer(state: FdcrState) -> Literal["analyst", "moderator"]:
    rounds_done = sum(t.role == "engineer" for t in state.get("transcript", []))
    return "analyst" if rounds_done < state["rounds"] else "moderator"


def build_fdcr() -> StateGraph:
    builder = StateGraph(FdcrState, context_schema=Context, input_schema=FdcrInput, output_schema=FdcrOutput)
    for node in (analyst, critic, engineer, moderator):
        builder.add_node(node)
    builder.add_conditional_edges(START, route_start)
    builder.add_edge("analyst", "critic")
    builder.add_edge("critic", "engineer")
    builder.add_conditional_edges("engineer", route_after_engineer)
    builder.add_edge("moderator", END)
    return builder


builder = build_fdcr()
graph = builder.compile(name="fdcr")
