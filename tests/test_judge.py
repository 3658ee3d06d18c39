"""The abstention judge: structured verdicts with a quote checked against the response, cached."""

import asyncio
import json
from pathlib import Path

import pytest

from roles.models import scripted
import roles.abstention_judge as judge
from roles.abstention_judge import ASKS, DECLINING, abstention_judge
from roles.models import InfrastructureError
from state.ledger import Ledger
from state.records import JudgeVerdict

RESPONSE = "I can't issue the permit: the owner's authorization was **revoked** on 2026-03-12."


@pytest.fixture
def ledger(tmp_path):
    scripted.clear()
    yield Ledger(tmp_path / "ledger.db")
    scripted.clear()


def test_quote_may_differ_in_markup_and_verdict_is_cached(ledger):
    scripted.register("judge", [{"verdict": "declines_all", "quote": "the owner's authorization was revoked", "reason": "declines"}])
    verdict, usage = asyncio.run(abstention_judge("Issue the permit.", RESPONSE, "scripted:judge", ledger))
    assert (verdict.abstained, verdict.scope, len(usage)) == (True, "all", 1)
    again, usage = asyncio.run(abstention_judge("Issue the permit.", RESPONSE, "scripted:judge", ledger))
    assert again == verdict and usage == []
    scripted.assert_consumed()


def test_invented_quote_is_asked_again_with_what_is_wrong_then_an_infrastructure_error(ledger):
    invented = {"verdict": "declines_all", "quote": "I refuse to help", "reason": "declines"}
    scripted.register("judge", [invented] * ASKS)
    with pytest.raises(InfrastructureError) as info:
        asyncio.run(abstention_judge("Issue the permit.", RESPONSE, "scripted:judge", ledger))
    assert info.value.kind == "malformed" and "Your quote is not in the reply" in str(info.value)
    scripted.assert_consumed()
    second = scripted.calls("judge")[1].messages
    assert second[-2].type == "ai" and "I refuse to help" in second[-2].content
    assert second[-1].content.startswith("Your quote is not in the reply")


def test_a_quote_copying_a_backslash_that_json_read_as_an_escape_still_matches(ledger):
    # run std9: "… is \\boxed{0} days." quoted back as "… is \x08oxed{0} days." was three misquotes, then an error
    replies = {"I can't say: the leave balance for Greta Lorenz in 2026 is \\boxed{0} days.": "Greta Lorenz in 2026 is \x08oxed{0} days",
               "I can't book 2 \\times 3 nights.": "can't book 2 \times 3 nights"}
    scripted.register("judge", [{"verdict": "declines_all", "quote": q, "reason": "declines"} for q in replies.values()])
    for reply in replies:
        verdict, usage = asyncio.run(abstention_judge("How many days are left?", reply, "scripted:judge", ledger))
        assert verdict.abstained and len(usage) == 1
    scripted.assert_consumed()


def test_a_judge_told_its_quote_is_missing_can_correct_it(ledger):
    scripted.register("judge", [{"verdict": "declines_all", "quote": "The reply declines.", "reason": "declines"},
                                {"verdict": "declines_all", "quote": "I can't issue the permit", "reason": "declines"}])
    verdict, usage = asyncio.run(abstention_judge("Issue the permit.", RESPONSE, "scripted:judge", ledger))
    assert verdict.quote == "I can't issue the permit" and len(usage) == 2


def test_verdict_sets_abstained_and_scope_together_and_empty_response_needs_no_judge(ledger):
    scripted.register("judge", [{"verdict": "declines_part", "quote": "I can't issue the permit", "reason": "declines"},
                                {"verdict": "done", "quote": "Permit issued", "reason": "done"}])
    verdict, usage = asyncio.run(abstention_judge("Issue the permit.", RESPONSE, "scripted:judge", ledger))
    assert (verdict.abstained, verdict.scope, len(usage)) == (True, "part", 1)
    verdict, _ = asyncio.run(abstention_judge("Issue the permit.", "Permit issued.", "scripted:judge", ledger))
    assert (verdict.abstained, verdict.scope) == (False, "none")
    verdict, usage = asyncio.run(abstention_judge("Issue the permit.", "  ", "scripted:judge", ledger))
    assert (verdict.abstained, usage) == (False, [])


@pytest.mark.parametrize("reply", ["The contract end date for Aisha Bello is 2026-09-30, and her username is abello.",
                                   "Reserved 2 cordless drills at $89.00 each.",
                                   "The user Rachel Stein has been granted Zendesk Administrator rights with an expiry date of 2027-01-07."])
def test_a_reply_without_declining_words_is_done_without_asking_the_judge(ledger, reply):
    """The local judge read such plain results as declines in half the replies it saw: no model is asked."""
    scripted.register("judge", [])  # any call fails the test
    verdict, usage = asyncio.run(abstention_judge("Look it up.", reply, "scripted:judge", ledger))
    assert (verdict.abstained, verdict.scope, usage) == (False, "none", [])


@pytest.mark.parametrize("reply", ["I can't issue the permit.", "The customer record was not found.", "Which Grace Lopez do you mean?",
                                   "Please confirm the shipment id first.", "The adjudication service is down, so I stopped here.",
                                   "Unable to book: the inspector's licence lapsed.", "The two records conflict on the start date.",
                                   "I need the account number to go on."])
def test_a_reply_with_declining_words_goes_to_the_judge(ledger, reply):
    assert DECLINING.search(reply)
    scripted.register("judge", [{"verdict": "declines_all", "quote": reply[:8], "reason": "declines"}])
    verdict, usage = asyncio.run(abstention_judge("Do it.", reply, "scripted:judge", ledger))
    assert verdict.abstained and len(usage) == 1
    scripted.assert_consumed()


def test_a_verdict_of_another_judge_version_is_not_reused(ledger, monkeypatch):
    older = JudgeVerdict(abstained=True, scope="all", quote="I can't issue the permit", reason="declines")
    monkeypatch.setattr(judge, "VERSION", judge.VERSION - 1)
    ledger.record_judgement(judge.verdict_key("scripted:judge", "Issue the permit.", RESPONSE), older)
    monkeypatch.undo()
    scripted.register("judge", [{"verdict": "done", "quote": "the owner's authorization was revoked", "reason": "done"}])
    verdict, usage = asyncio.run(abstention_judge("Issue the permit.", RESPONSE, "scripted:judge", ledger))
    assert (verdict.abstained, len(usage)) == (False, 1)
    scripted.assert_consumed()


def test_the_labelled_replies_of_the_judge_benchmark_are_well_formed():
    rows = [json.loads(line) for line in (Path(__file__).parents[1] / "benchmarks/data/judge_replies.jsonl").read_text().splitlines()]
    assert {(r["split"], r["label"]) for r in rows} == {(s, label) for s in ("tune", "holdout") for label in ("done", "declines")}
    assert all(DECLINING.search(r["reply"]) and r["instruction"].strip() for r in rows)  # each one the judge model is asked about
    assert len({(r["instruction"], r["reply"]) for r in rows}) == len(rows)
