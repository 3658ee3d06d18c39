"""The `fdcr` graph: failure-driven collaborative review (ECDYSIS §3.3).

`analyst` → `critic` → `engineer` for K rounds over one shared transcript,
then `moderator` writes the typed `ModificationSpec`. With `review` off the
moderator writes the spec straight from the diagnosis (ECDYSIS "w/o FDCR").
"""

from __future__ import annotations

import operator
from typing import Annotated, Awaitable, Callable, Literal

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from graphs.inputs import AtLeastZero, checked
from roles import panel
from state.context import Context
from state.evolution import Diagnosis, ModificationSpec, Turn
from state.records import UsageRecord


class FdcrInput(TypedDict):
    diagnosis: Diagnosis
    harness: str  # the current harness as the roles read it
    rounds: AtLeastZero
    review: bool


class FdcrOutput(TypedDict, total=False):
    spec: ModificationSpec
    transcript: list[Turn]
    usage: list[UsageRecord]


class FdcrState(FdcrInput, FdcrOutput, total=False):
    transcript: Annotated[list[Turn], operator.add]
    usage: Annotated[list[UsageRecord], operator.add]


async def _speak(speaker: Callable[..., Awaitable[tuple[Turn, UsageRecord]]], state: FdcrState, ctx: Context) -> dict:
    turn, usage = await speaker(state["harness"], Diagnosis.model_validate(state["diagnosis"]), state.get("transcript", []),
                                ctx.analyst_model, ctx.model_timeout_s)
    return {"transcript": [turn], "usage": [usage]}


async def analyst(state: FdcrState, runtime: Runtime[Context]) -> dict:
    """Explains the recurring failures and proposes fixes; writes `transcript`, `usage`."""
    return await _speak(panel.analyst, state, runtime.context)


async def critic(state: FdcrState, runtime: Runtime[Context]) -> dict:
    """Challenges the analyst for over-abstention, overfitting and gaps; writes `transcript`, `usage`."""
    return await _speak(panel.critic, state, runtime.context)


async def engineer(state: FdcrState, runtime: Runtime[Context]) -> dict:
    """Turns the agreed points into implementable changes; writes `transcript`, `usage`."""
    return await _speak(panel.engineer, state, runtime.context)


async def moderator(state: FdcrState, runtime: Runtime[Context]) -> dict:
    """Writes the structured modification spec; writes `spec`, `usage`."""
    ctx = runtime.context
    spec, usage = await panel.moderator(state["harness"], Diagnosis.model_validate(state["diagnosis"]), state.get("transcript", []),
                                        ctx.analyst_model, ctx.model_timeout_s)
    return {"spec": spec, "usage": [usage]}


def route_start(state: FdcrState) -> Literal["analyst", "moderator"]:
    """Rejects input its schema does not allow (the roles read the diagnosis as a `Diagnosis`, given as JSON or not)."""
    given = checked(FdcrInput, state, "fdcr")
    return "analyst" if given["review"] and given["rounds"] > 0 else "moderator"


def route_after_engineer(state: FdcrState) -> Literal["analyst", "moderator"]:
    rounds_done = sum(t.role == "engineer" for t in state.get("transcript", []))
    return "analyst" if rounds_done < checked(FdcrInput, state, "fdcr")["rounds"] else "moderator"


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
