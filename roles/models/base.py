"""What every model and role shares: the protocol a model meets (`ChatModel`), one turn's reply (`Completion`),
the errors an endpoint raises, and the prices calls are costed at."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Literal, Protocol, Sequence, runtime_checkable

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel

from state.records import ToolInfo, UsageRecord

KINDS = ("rate_limited", "server_error", "timeout", "malformed", "truncated", "connection")
ActionMode = Literal["text", "structured"]


class InfrastructureError(Exception):
    """The model endpoint failed us (down, overloaded, too slow, or a broken reply) even after retries.

    Never an agent failure: record it and re-run. `kind` is one of `KINDS`.
    """

    def __init__(self, kind: str, detail: str = "", spec: str = "", attempts: int = 1):
        if kind not in KINDS:
            raise ValueError(f"InfrastructureError kind must be one of {', '.join(KINDS)}; got {kind!r}")
        super().__init__(kind, detail, spec, attempts)
        self.kind, self.detail, self.spec, self.attempts = kind, detail, spec, attempts

    def __str__(self) -> str:
        where = f"{self.spec}: " if self.spec else ""
        tries = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        return f"{where}{self.kind}{tries}" + (f": {self.detail}" if self.detail else "")


class ContextLimitError(Exception):
    """The conversation no longer fits the model's context window. Building
    the context is the harness's job, so this ends the episode as the
    harness's failure; it is not an infrastructure error."""


CONTEXT_MARKERS = ("context size", "context length", "context_length", "maximum context", "too many tokens", "context window")


@dataclass(frozen=True)
class Completion:
    """One model turn: the reply (tool calls with our ids `call_<n>`), its usage, and whether it was cut off."""

    message: AIMessage
    usage: UsageRecord
    truncated: bool = False


@runtime_checkable
class ChatModel(Protocol):
    """What every role calls. Both methods raise `InfrastructureError` when the endpoint fails for good."""

    spec: str

    async def complete(
        self, messages: list[BaseMessage], tools: list[ToolInfo] | None = None, *, max_tokens: int | None = None,
        temperature: float | None = None, action_mode: ActionMode = "text", seed: int | None = None,
    ) -> Completion:
        """The next assistant turn of `messages`, free to call `tools`; `temperature` None keeps the model's
        default. `seed` fixes the endpoint's sampling where it honours one: the same messages with the same seed sample
        the same reply, but for rounding (llama.cpp: a prompt read afresh or from its cache). With `action_mode="structured"` the turn is exactly one call of `tools` or a final answer
        (`roles.models.tool_calls.action_schema`), and a reply outside that grammar is a malformed reply."""
        ...

    async def structured(self, messages: list[BaseMessage], schema: type[BaseModel]) -> tuple[BaseModel, UsageRecord]:
        """A reply constrained to `schema` (a JSON-schema response format) and validated against it."""
        ...


def model_prices() -> dict[str, tuple[float, float, float]]:
    """HERA_MODEL_PRICES: {"model": [usd_per_M_input, usd_per_M_output, usd_per_M_cached_input]}."""
    raw = os.environ.get("HERA_MODEL_PRICES")
    if not raw:
        return {}
    expected = 'HERA_MODEL_PRICES must be JSON {"model": [usd_per_M_input, usd_per_M_output, usd_per_M_cached_input]}'
    try:
        table = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"{expected}; it is not JSON ({error})") from None
    if not isinstance(table, dict):
        raise ValueError(f"{expected}; got a {type(table).__name__}")
    prices = {}
    for model, price in table.items():
        if not (isinstance(price, list) and len(price) == 3 and all(isinstance(p, (int, float)) for p in price)):
            raise ValueError(f"{expected}; the entry for {model!r} is {price!r}")
        prices[model] = (float(price[0]), float(price[1]), float(price[2]))
    return prices


def cost_usd(model: str, input_tokens: int, output_tokens: int, cached_tokens: int) -> float | None:
    """Dollars for one call, or None when `model` (with or without its provider prefix) has no price."""
    prices = model_prices()
    price = prices.get(model) or prices.get(model.partition(":")[2])
    if price is None:
        return None
    per_input, per_output, per_cached = price
    return ((input_tokens - cached_tokens) * per_input + cached_tokens * per_cached + output_tokens * per_output) / 1e6


def check_messages(messages: Sequence[BaseMessage]) -> None:
    for index, message in enumerate(messages):
        if not isinstance(message, (SystemMessage, HumanMessage, AIMessage, ToolMessage)):
            raise TypeError(f"messages[{index}] is a {type(message).__name__}; "
                            "expected SystemMessage, HumanMessage, AIMessage or ToolMessage")
