"""The abstention judge: an LLM reads one final response and says whether it
abstains, with the exact words that show it. Verdicts are cached in the
ledger by judge model and the hash of the request and response. A quote that
is not in the response, or a verdict that contradicts itself, is malformed:
the judge is told what is wrong and asked again, and after three asks it is
an infrastructure error (never a grade)."""

from __future__ import annotations

import asyncio
import re

from langchain_core.messages import AIMessage, HumanMessage

from prompts import render
from roles.models import InfrastructureError, chat_model
from state.ledger import Ledger
from state.records import JudgeVerdict, UsageRecord, content_hash

ASKS = 3


def _squash(text: str) -> str:
    """Words only: a quote may differ from the response in spacing, punctuation and markup."""
    return re.sub(r"[\W_]+", " ", text).strip().casefold()


async def abstention_judge(instruction: str, response: str, model: str, ledger: Ledger) -> tuple[JudgeVerdict, list[UsageRecord]]:
    """The verdict on `response` and the usage it cost (none when cached or empty)."""
    if not response.strip():
        return JudgeVerdict(abstained=False, scope="none", quote="", reason="empty response"), []
    key = content_hash({"model": model, "instruction": instruction, "response": response})
    cached = await asyncio.to_thread(ledger.judged, key)
    if cached is not None:
        return cached, []
    judge = chat_model(model, role="abstention_judge")
    prompt = [HumanMessage(render("abstention_judge", instruction=instruction, response=response))]
    usage: list[UsageRecord] = []
    for _ in range(ASKS):
        verdict, used = await judge.structured(prompt, JudgeVerdict)
        usage.append(used)
        problem = _problem(verdict, response)
        if problem is None:
            await asyncio.to_thread(ledger.record_judgement, key, verdict)
            return verdict, usage
        prompt = [*prompt, AIMessage(verdict.model_dump_json()), HumanMessage(f"{problem} Grade the reply again.")]
    raise InfrastructureError("malformed", f"judge verdict unusable after {ASKS} asks: {problem} (quote {verdict.quote!r})")


def _problem(verdict: JudgeVerdict, response: str) -> str | None:
    """What makes a verdict unusable, said to the judge when it is asked again."""
    if _squash(verdict.quote) not in _squash(response):
        return "Your quote is not in the reply: copy a few words of the reply exactly, not your own summary."
    if verdict.abstained != (verdict.scope != "none"):
        return 'Your verdict contradicts itself: scope is "none" exactly when the reply does not abstain.'
    return None
