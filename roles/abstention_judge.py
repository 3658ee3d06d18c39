"""The abstention judge: an LLM reads one final response and says whether it
abstains, with the exact words that show it. Verdicts are cached in the
ledger by judge model and the hash of the request and response; a quote that
is not in the response is a malformed verdict, asked again, then an
infrastructure error (never a grade)."""

from __future__ import annotations

import asyncio
import re

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import InfrastructureError, chat_model
from state.ledger import Ledger
from state.records import JudgeVerdict, UsageRecord, content_hash


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
    for _ in range(2):
        verdict, used = await judge.structured(prompt, JudgeVerdict)
        usage.append(used)
        if _squash(verdict.quote) in _squash(response) and verdict.abstained == (verdict.scope != "none"):
            await asyncio.to_thread(ledger.record_judgement, key, verdict)
            return verdict, usage
    raise InfrastructureError("malformed", f"judge quote not found in the response: {verdict.quote!r}")
