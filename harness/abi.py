"""The hook ABI a harness bundle implements (DESIGN.md §4).

A bundle's `hooks.py` defines `class Harness(BaseHarness)` and overrides any
of the hooks below. The runtime calls, per episode:

    initialize -> compose_instructions ->
    [prepare_turn -> model turn -> before_tool_call -> tool -> present_result, after_tool_result]* ->
    finalize

A harness sees only public things: the instruction, the public context of
the environment (its description and policy), the public tool schemas and
the observations. Hooks may be plain or `async` functions; `view.ask` lets a
hook put one structured question to the episode's model, and `view.lookup`
lets it call one of the environment's read-only tools itself (recorded with
the episode's calls; a state-changing tool is refused).
"""

from __future__ import annotations

import copy
import inspect
import re
from dataclasses import dataclass, field
from string import Template
from typing import Any, Awaitable, Callable, Literal, Sequence

import jsonschema
from jsonschema.exceptions import best_match
from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict, model_validator

from state.records import Observation, Record, ToolInfo


class HarnessConfig(Record):
    max_turns: int = 30
    max_output_tokens: int = 8192
    temperature: float | None = None  # None: the model's own default sampling
    # text: the model writes calls as it likes (several a turn); structured: each turn is constrained to
    # exactly one tool call or a final answer (a JSON-schema response format over the public tools)
    action_mode: Literal["text", "structured"] = "text"


class ToolRequest(Record):
    id: str
    name: str
    args: dict[str, Any]


class Decision(Record):
    """`allow` runs the call; `block` skips it and shows `message` as its
    result; `replan` skips it and ends the turn with `message` to the model."""

    action: Literal["allow", "block", "replan"] = "allow"
    message: str = ""


class Final(Record):
    """`accept` the model's answer; `replace` it with `text`; `abstain` with
    `text` as the refusal; `revise`: send `text` to the model and go on."""

    action: Literal["accept", "replace", "abstain", "revise"] = "accept"
    text: str = ""


@dataclass
class EpisodeView:
    instruction: str
    context: str
    tools: list[ToolInfo]
    config: HarnessConfig
    prompts: dict[str, str]
    skills: dict[str, str]
    observations: list[Observation] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    ask: Callable[[list[BaseMessage], type[BaseModel]], Awaitable[BaseModel]] | None = None
    lookup: Callable[[str, dict[str, Any]], Awaitable[Observation]] | None = None
    turn: int = 0  # model turns so far
    calls: int = 0  # tool calls the model has asked for so far, run or not


class BaseHarness:
    """Defaults: a plain tool-calling agent. Bundles override what they need."""

    def initialize(self, view: EpisodeView) -> None:
        return None

    def compose_instructions(self, view: EpisodeView) -> str:
        system = Template(view.prompts["system"]).substitute(context=view.context).strip()
        if view.skills:
            system += "\n\nSkills:\n\n" + "\n\n".join(s.strip() for s in view.skills.values())
        return system

    def prepare_turn(self, view: EpisodeView, messages: list[BaseMessage]) -> list[BaseMessage]:
        return messages

    def before_tool_call(self, view: EpisodeView, call: ToolRequest) -> Decision:
        return Decision()

    def present_result(self, view: EpisodeView, call: ToolRequest, observation: Observation) -> str:
        """The text the model is shown of a result; grading always reads the whole observation."""
        return observation.text

    def after_tool_result(self, view: EpisodeView, call: ToolRequest, observation: Observation) -> str | None:
        return None

    def finalize(self, view: EpisodeView, answer: str) -> Final:
        return Final()


async def call_hook(fn, *args):
    """Calls a hook, plain or `async`, and returns its result."""
    result = fn(*args)
    return await result if inspect.isawaitable(result) else result


HOOKS = ("initialize", "compose_instructions", "prepare_turn", "before_tool_call", "present_result", "after_tool_result", "finalize")


def action_schema(tools: Sequence[ToolInfo]) -> dict[str, Any]:
    """The JSON schema of one structured turn: exactly one call of an offered tool, with arguments of
    that tool's schema, or a final answer."""
    calls = [{"type": "object", "properties": {"tool": {"const": t.name}, "arguments": _argument_schema(t.input_schema)},
              "required": ["tool", "arguments"], "additionalProperties": False} for t in tools]
    final = {"type": "object", "properties": {"final_answer": {"type": "string"}}, "required": ["final_answer"],
             "additionalProperties": False}
    return {"anyOf": [*calls, final]}


def _argument_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's input schema as a closed object: a grammar must not let the model invent arguments."""
    out = {k: v for k, v in schema.items() if k not in ("title", "$schema")}
    out.setdefault("type", "object")
    out.setdefault("properties", {})
    out["additionalProperties"] = False
    return out


def answer_schema(name: str, schema: dict) -> type[BaseModel]:
    """A stand-in for a class that lives in the sandbox: the model sees `schema`
    exactly (as `model_json_schema()`), and a reply must validate against it."""
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)

    class Answer(BaseModel):
        model_config = ConfigDict(extra="allow")

        @model_validator(mode="before")
        @classmethod
        def _conforms(cls, data: Any) -> Any:
            error = best_match(validator.iter_errors(data))
            if error is not None:
                raise ValueError(f"{'/'.join(map(str, error.absolute_path)) or 'body'}: {error.message}")
            return data

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(schema)

    Answer.__name__ = Answer.__qualname__ = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "Answer"
    return Answer
