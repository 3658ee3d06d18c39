"""Generic control-logic components a bundle can enable in `components.yaml`.

Each component watches the public episode (instruction, tool schemas,
observations) and may block a call, add guidance to a tool result, or
question the final answer. None of them names a task, an entity or a value:
they are what a structured edit (HERA Fig. 4) selects and parameterises.
`Stack` layers the enabled components over the bundle's own `Harness`:
the first component that blocks a call or overrides a final answer wins.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from langchain_core.messages import HumanMessage
from pydantic import Field

from harness.abi import BaseHarness, Decision, EpisodeView, Final, ToolRequest, call_hook
from state.records import Observation, Record

NEGATIVE_MARKERS = ("unavailable", "revoked", "expired", "suspended", "withdrawn", "unauthorized", "not authorized",
                    "denied", "conflict", "outage", "stale", "superseded", "out of service", "no longer")
AUTH_KEYS = ("authoriz", "authoris", "consent", "permission", "approval", "delegat", "power_of_attorney", "access")
AUTH_NEGATIVE = ("revoked", "expired", "withdrawn", "denied", "suspended", "inactive", "rejected", "pending", "none", "false")


class Component:
    """A hook-level behaviour with typed parameters; hooks return None for no opinion."""

    name: ClassVar[str]
    summary: ClassVar[str]

    class Params(Record):
        pass

    def __init__(self, params: dict[str, Any] | None = None):
        self.params = self.Params.model_validate(params or {})

    def instructions(self, view: EpisodeView) -> str:
        return ""

    def before_tool_call(self, view: EpisodeView, call: ToolRequest) -> Decision | None:
        return None

    def after_tool_result(self, view: EpisodeView, call: ToolRequest, observation: Observation) -> str | None:
        return None

    async def finalize(self, view: EpisodeView, answer: str) -> Final | None:
        return None


def _writes(view: EpisodeView) -> set[str]:
    return {t.name for t in view.tools if not t.read_only}


def _committed(view: EpisodeView) -> bool:
    return any(o.ok and not o.read_only for o in view.observations)


class LookBeforeAct(Component):
    name = "look_before_act"
    summary = "blocks a state-changing call until a read-only tool has returned something"

    def before_tool_call(self, view, call):
        if call.name in _writes(view) and not any(o.ok and o.read_only for o in view.observations):
            return Decision(action="block", message="Not run. Before changing anything, look up the records this request depends on with the read-only tools.")
        return None


class StopOnNegativeEvidence(Component):
    name = "stop_on_negative_evidence"
    summary = "after a result reports unavailable, revoked, expired, conflicting or similar evidence, blocks state-changing calls and tells the agent to explain instead"

    class Params(Record):
        markers: tuple[str, ...] = Field(NEGATIVE_MARKERS, description="words that mark evidence against acting")

    def _evidence(self, view: EpisodeView) -> tuple[str, str] | None:
        for o in view.observations:
            if not o.read_only and o.ok:
                continue
            text = o.text.casefold()
            for marker in self.params.markers:
                if marker.casefold() in text:
                    return marker, o.tool
        return None

    def before_tool_call(self, view, call):
        found = self._evidence(view) if call.name in _writes(view) else None
        if found:
            marker, tool = found
            return Decision(action="block", message=f"Not run: an earlier result of {tool} reported '{marker}'. Do not change anything; "
                                                    "tell the user plainly what cannot be done and why.")
        return None


class SuppressDuplicateCalls(Component):
    name = "suppress_duplicate_calls"
    summary = ("answers a repeated identical tool call with the earlier result instead of running it again; "
               "after a few repeats, tells the agent to stop calling tools and answer")

    class Params(Record):
        stop_after: int = Field(2, ge=1, description="repeats answered with the earlier result before the agent is told to answer")

    def before_tool_call(self, view, call):
        for o in view.observations:
            if o.tool == call.name and o.args == call.args:
                repeats = view.memory["duplicate_calls"] = view.memory.get("duplicate_calls", 0) + 1
                if repeats > self.params.stop_after:
                    return Decision(action="block", message="Not run: you keep repeating calls whose results you already have. Stop calling tools "
                                                            "and give your final answer now: what you found and, if the request cannot be "
                                                            "completed, why.")
                return Decision(action="block", message=f"Already called with these arguments; the result was: {o.text[:800]}")
        return None


class CheckBeforeCommit(Component):
    name = "check_before_commit"
    summary = "before the first state-changing call, makes the agent check every requirement of the request against the results once"

    class Params(Record):
        message: str = ("Before you change anything, check each requirement of the request against what the tools returned: "
                        "every fact it needs is present, records agree, permissions and statuses allow it, and all constraints hold together. "
                        "If any requirement is not met or cannot be confirmed, do not act: explain what is missing. Otherwise make the call again.")

    def before_tool_call(self, view, call):
        if call.name in _writes(view) and not view.memory.get("checked_before_commit"):
            view.memory["checked_before_commit"] = True
            return Decision(action="replan", message=self.params.message)
        return None


class FlagMultipleMatches(Component):
    name = "flag_multiple_matches"
    summary = "when a lookup returns several records, tells the agent to make sure which one is meant before acting"

    class Params(Record):
        min_matches: int = 2

    def after_tool_result(self, view, call, observation):
        output = observation.output
        rows = output if isinstance(output, list) else next((v for v in output.values() if isinstance(v, list)), None) if isinstance(output, dict) else None
        if observation.ok and rows is not None and len(rows) >= self.params.min_matches:
            return (f"Note: {len(rows)} records matched. Make sure exactly one of them is the one the request means before acting on it; "
                    "if the request does not tell them apart, say so instead of guessing.")
        return None


class CheckRelatedAuthorization(Component):
    name = "check_related_authorization"
    summary = "points out authorisation, consent or permission fields in a result whose value does not allow acting"

    class Params(Record):
        keys: tuple[str, ...] = AUTH_KEYS
        negative: tuple[str, ...] = AUTH_NEGATIVE

    def _flags(self, value: Any, path: str = "") -> list[str]:
        if isinstance(value, dict):
            return [f for k, v in value.items() for f in self._flags(v, f"{path}.{k}" if path else str(k))]
        if isinstance(value, list):
            return [f for v in value for f in self._flags(v, path)]
        key = path.rsplit(".", 1)[-1].casefold()
        text = json.dumps(value).strip('"').casefold()
        if any(k in key for k in self.params.keys) and (value is None or text in self.params.negative):
            return [f"{path}={text}"]
        return []

    def after_tool_result(self, view, call, observation):
        flags = self._flags(observation.output) if observation.ok else []
        if flags:
            return f"Note: {', '.join(flags[:5])}. Acting requires valid authorisation; if it is not in place, do not act and explain why."
        return None


class FinalCheck(Record):
    can_complete: bool = Field(description="true only if every requirement of the request was confirmed by the tool results")
    reason: str = Field(description="what is missing, conflicting or not allowed; empty when it can be completed")


class ConfirmFinalDecision(Component):
    name = "confirm_final_decision"
    summary = "before accepting an answer that changed nothing, asks the model one structured question: could the request really be completed?"

    async def finalize(self, view, answer):
        if _committed(view) or view.ask is None:
            return None
        results = "\n".join(f"- {o.tool}({json.dumps(o.args)}) -> {o.text[:400]}" for o in view.observations[-8:]) or "(no tool results)"
        question = (f"Request:\n{view.instruction}\n\nTool results:\n{results}\n\nDraft answer:\n{answer}\n\n"
                    "Could the request be completed correctly from these results, with every required fact present, consistent and allowed?")
        check = await view.ask([HumanMessage(question)], FinalCheck)
        if not check.can_complete:
            return Final(action="abstain", text=f"I cannot complete this request: {check.reason}".strip())
        return None


LIBRARY: dict[str, type[Component]] = {c.name: c for c in (
    LookBeforeAct, StopOnNegativeEvidence, SuppressDuplicateCalls, CheckBeforeCommit, FlagMultipleMatches,
    CheckRelatedAuthorization, ConfirmFinalDecision,
)}
ComponentName = Literal[tuple(LIBRARY)]  # type: ignore[valid-type]


def catalog_text() -> str:
    """The library as the roles that choose components read it."""
    return "\n".join(f"- {name}: {cls.summary}" for name, cls in LIBRARY.items())


class Stack(BaseHarness):
    """The bundle's harness with the enabled components layered over it."""

    def __init__(self, inner: BaseHarness, components: list[Component]):
        self.inner, self.components = inner, components

    async def initialize(self, view):
        await call_hook(self.inner.initialize, view)

    async def compose_instructions(self, view):
        parts = [await call_hook(self.inner.compose_instructions, view), *(c.instructions(view) for c in self.components)]
        return "\n\n".join(p for p in parts if p)

    async def prepare_turn(self, view, messages):
        return await call_hook(self.inner.prepare_turn, view, messages)

    async def before_tool_call(self, view, call):
        for c in self.components:
            decision = c.before_tool_call(view, call)
            if decision is not None:
                return decision
        return await call_hook(self.inner.before_tool_call, view, call)

    async def after_tool_result(self, view, call, observation):
        notes = [await call_hook(self.inner.after_tool_result, view, call, observation),
                 *(c.after_tool_result(view, call, observation) for c in self.components)]
        return "\n".join(n for n in notes if n) or None

    async def finalize(self, view, answer):
        for c in self.components:
            final = await c.finalize(view, answer)
            if final is not None:
                return final
        return await call_hook(self.inner.finalize, view, answer)


