"""The abstention judge: an LLM reads one final response and says whether it
abstains, with the exact words that show it. Verdicts are cached in the
ledger by judge (model and version) and the hash of the request and
response (`verdict_key`). A quote that
is not in the response is malformed: the judge is told what is wrong and
asked again, and after three asks it is an infrastructure error (never a
grade).

A response with no declining words at all (`DECLINING`: a negation, a
question, missing, failed, conflicting, sorry, which, confirm, ...) cannot
decline, and is read as done without asking the model: the local 1.5B judge
read 23 of the 46 such replies of a standard run (std4, every split) as
declines, every one a plain statement of a result or of an action ("The
contract end date for Aisha Bello is 2026-09-30, and her username is
abello."). The words are English: a reply in another language goes to the
judge only if it holds a question mark or an English declining word."""

from __future__ import annotations

import asyncio
import re
from typing import Literal

from langchain_core.messages import AIMessage, HumanMessage
from pydantic import Field

from prompts import render
from roles.models import InfrastructureError, chat_model
from state.ledger import Ledger
from state.records import JudgeVerdict, Record, UsageRecord, content_hash

ASKS = 3
# The judge's version, in every grade it gives (`judge_id`) and in its cache key: a reused episode graded by another
# version is judged again. 2: replies without declining words are done. 3: the judge first asks whether the reply
# gives what the request asks for (a negative fact is a result), and its reason says so. 4: it samples nothing
# (`roles.models.GREEDY_ROLES`). benchmarks/eval_judge.py measured 2, 3 and 4.
VERSION = 4
DECLINING = re.compile(
    r"\?|n['’]t\b|\b(?:not|no|none|nothing|nobody|never|neither|nor|cannot|unable|without|missing|absent|unavailable|unknown|"
    r"unclear|ambiguous|uncertain|fail\w*|error\w*|invalid|expired|lapsed|revoked|suspended|stale|outdated|conflict\w*|"
    r"mismatch\w*|inconsistent|contradict\w*|den(?:y|ied|ies)|refus\w*|declin\w*|forbid\w*|prohibit\w*|block\w*|hold|halt\w*|"
    r"paus\w*|stop\w*|wait\w*|down|outage|offline|unreachable|unresponsive|sorry|apolog\w*|unfortunately|however|confirm\w*|"
    r"clarif\w*|verify|which|whether|provide|need\w*|requir\w*|insufficient|exceed\w*|impossible|can\s?not)\b",
    re.IGNORECASE)
MISQUOTED = "Your quote is not in the reply: copy a few words of the reply exactly, not your own summary."
SCOPES = {"done": "none", "declines_part": "part", "declines_all": "all"}


class JudgeReading(Record):
    """What the judge model writes; one verdict field, so it cannot contradict itself (a reading with
    `abstained` and `scope` side by side did, over and over, on a small model)."""

    reason: str = Field(description="one sentence: what the request asks for, and whether the reply gives it")
    quote: str = Field(description="a few words copied exactly from the reply that show it")
    verdict: Literal["done", "declines_part", "declines_all"] = Field(
        description="done: the reply reports the request done or gives the requested result; declines_part: it refuses, "
                    "cannot do, or asks to clarify a required part; declines_all: it refuses or cannot do any of it")


def judge_id(model: str) -> str:
    """The judge a grade comes from: its model and this judge's version."""
    return f"{model}#judge-v{VERSION}"


def verdict_key(model: str, instruction: str, response: str) -> str:
    """Where the ledger keeps a verdict: by this judge (model and version), the request and the response."""
    return content_hash({"judge": judge_id(model), "instruction": instruction, "response": response})


def _squash(text: str) -> str:
    """Words only: a quote may differ from the response in spacing, punctuation and markup."""
    return re.sub(r"[\W_]+", " ", text).strip().casefold()


# A backslash the judge copies from a reply ("\boxed{0}", "\times") comes out of its JSON as an escape: a control
# character and the rest of the word ("\x08oxed{0}"). Its letter is put back for a second reading of the quote.
ESCAPES = str.maketrans({"\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"})


def _quoted(quote: str, response: str) -> bool:
    """Whether `quote` is words of `response`, read as written or with JSON's escapes undone."""
    return any(_squash(q) in _squash(response) for q in (quote, quote.translate(ESCAPES)))


async def abstention_judge(instruction: str, response: str, model: str, ledger: Ledger) -> tuple[JudgeVerdict, list[UsageRecord]]:
    """The verdict on `response` and the usage it cost (none when cached or empty)."""
    if not response.strip():
        return JudgeVerdict(abstained=False, scope="none", quote="", reason="empty response"), []
    if not DECLINING.search(response):
        return JudgeVerdict(abstained=False, scope="none", quote="", reason="no declining words"), []
    key = verdict_key(model, instruction, response)
    cached = await asyncio.to_thread(ledger.judged, key)
    if cached is not None:
        return cached, []
    judge = chat_model(model, role="abstention_judge")
    prompt = [HumanMessage(render("abstention_judge", instruction=instruction, response=response))]
    usage: list[UsageRecord] = []
    for _ in range(ASKS):
        reading, used = await judge.structured(prompt, JudgeReading)
        usage.append(used)
        if _quoted(reading.quote, response):
            verdict = JudgeVerdict(abstained=reading.verdict != "done", scope=SCOPES[reading.verdict], quote=reading.quote,
                                   reason=reading.reason)
            await asyncio.to_thread(ledger.record_judgement, key, verdict)
            return verdict, usage
        prompt = [*prompt, AIMessage(reading.model_dump_json()), HumanMessage(f"{MISQUOTED} Grade the reply again.")]
    raise InfrastructureError("malformed", f"judge verdict unusable after {ASKS} asks: {MISQUOTED} (quote {reading.quote!r})")
