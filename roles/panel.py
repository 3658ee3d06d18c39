"""The FDCR panel (ECDYSIS §3.3): an analyst, a critic and an engineer each take a turn on one shared transcript
of a diagnosis, and a moderator writes the typed modification spec from it (or, without the review, straight
from the diagnosis: ECDYSIS "w/o FDCR")."""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from harness.components import catalog_text
from prompts import render
from roles.failure_analyst import diagnosis_text
from roles.models import chat_model
from state.evolution import Diagnosis, ModificationSpec, Turn, group_key
from state.records import UsageRecord

TURN_TOKENS = 400


def transcript_text(turns: list[Turn]) -> str:
    return "\n\n".join(f"[{t.role.title()}, round {t.round}] {t.text}" for t in turns) or "(nothing yet)"


async def _turn(role: str, harness: str, diagnosis: Diagnosis, transcript: list[Turn], model: str,
                timeout_s: float) -> tuple[Turn, UsageRecord]:
    round_ = 1 + sum(t.role == "engineer" for t in transcript)
    prompt = render(role, harness=harness, diagnosis=diagnosis_text(diagnosis), transcript=transcript_text(transcript),
                    round=str(round_), components=catalog_text(map(group_key, diagnosis.groups), diagnosis.replay))
    done = await chat_model(model, role=role, timeout_s=timeout_s).complete([HumanMessage(prompt)], max_tokens=TURN_TOKENS)
    return Turn(role=role, round=round_, text=str(done.message.content).strip()), done.usage


async def analyst(harness: str, diagnosis: Diagnosis, transcript: list[Turn], model: str, timeout_s: float = 1800.0) -> tuple[Turn, UsageRecord]:
    """Explains the recurring failures and proposes fixes."""
    return await _turn("analyst", harness, diagnosis, transcript, model, timeout_s)


async def critic(harness: str, diagnosis: Diagnosis, transcript: list[Turn], model: str, timeout_s: float = 1800.0) -> tuple[Turn, UsageRecord]:
    """Challenges the analyst for over-abstention, overfitting and gaps."""
    return await _turn("critic", harness, diagnosis, transcript, model, timeout_s)


async def engineer(harness: str, diagnosis: Diagnosis, transcript: list[Turn], model: str, timeout_s: float = 1800.0) -> tuple[Turn, UsageRecord]:
    """Turns the agreed points into implementable changes."""
    return await _turn("engineer", harness, diagnosis, transcript, model, timeout_s)


async def moderator(harness: str, diagnosis: Diagnosis, transcript: list[Turn], model: str,
                    timeout_s: float = 1800.0) -> tuple[ModificationSpec, UsageRecord]:
    """Writes the structured modification spec."""
    prompt = render("moderator", harness=harness, diagnosis=diagnosis_text(diagnosis), transcript=transcript_text(transcript),
                    components=catalog_text(map(group_key, diagnosis.groups), diagnosis.replay))
    return await chat_model(model, role="moderator", timeout_s=timeout_s).structured([HumanMessage(prompt)], ModificationSpec)
