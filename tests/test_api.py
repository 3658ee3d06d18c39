"""The protocols the CLI drives, called as a program would: resuming an evaluation's request, one harness across
models, a preset's protocol and the compared methods on it."""

import asyncio

import pytest

from envs.catalog import CATALOG, load_entry, split_pairs
from graphs import api
from graphs.coevolution import CONFIGS, PRESETS
from graphs.report import comparison, comparison_tables
from roles.models import scripted
from state.context import ConfigError, Context
from state.ledger import Ledger
from tests.conftest import FIXTURES
from tests.scripts import eager_agent, shop_agent, shop_judge

PAIR = "shop-reserve-drill"


@pytest.fixture
def context(tmp_path):
    scripted.clear()
    yield Context(agent_model="scripted:agent", judge_model="scripted:judge", catalog=str(FIXTURES), ledger=str(tmp_path / "l.db"))
    scripted.clear()


def test_a_resumed_request_takes_what_is_given_else_what_the_run_recorded_else_the_defaults(context):
    assert api.resume_request(None, context) == {"pair_ids": None, "bundle": "H0", "trials": 1, "seed": 0, "model": "local", "judge": None,
                                                 "max_turns": None}
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    run = asyncio.run(api.evaluate("H0", [PAIR], context, seed=3))
    run_id = run.run_id
    recorded = {"pair_ids": [PAIR], "bundle": "H0", "trials": 1, "seed": 3, "model": "scripted:agent", "judge": "scripted:judge",
                "max_turns": None}  # recorded as 0, no cap but the harness's own
    assert api.resume_request(run_id, context) == recorded
    assert api.resume_request(run_id, context, seed=0, model="scripted:other", pair_ids=[]) == recorded | {"seed": 0, "model": "scripted:other"}
    assert api.resume_request("no-such-run", context, trials=2)["trials"] == 2


def test_one_harness_across_models_with_the_judge_fixed(context):
    scripted.register("careful", [shop_agent] * 5)
    scripted.register("eager", [eager_agent] * 6)
    scripted.register("judge", [shop_judge])  # the careful refusal; every other answer reports a reservation
    seen = []
    results = asyncio.run(api.transfer("H0", [PAIR], ["scripted:careful", "scripted:eager"], context, judge="scripted:judge",
                                       on_episode=lambda model, record: seen.append((model, record.key.side))))
    scripted.assert_consumed()
    assert [(model, m.counts["pair"], m.counts["act"]) for model, _, m in results] == [("scripted:careful", 1, 1), ("scripted:eager", 0, 1)]
    ledger = Ledger(context.ledger)
    assert [(ledger.run(r)["model"], ledger.run(r)["judge"]) for _, r, _ in results] == [("scripted:careful", "scripted:judge"),
                                                                                         ("scripted:eager", "scripted:judge")]
    assert sorted(seen) == sorted([(m, side) for m in ("scripted:careful", "scripted:eager") for side in ("act", "abstain")])


def test_a_protocol_is_the_preset_with_the_overrides_and_the_catalogs_splits_in_order():
    settings, pairs = api.protocol("quick", str(CATALOG), validation=3, bench=0, rounds=None, nonsense=7)
    assert pairs == {"train": split_pairs("train", tier="short")[:2], "validation": split_pairs("validation", tier="short")[:3], "bench": []}
    assert all(load_entry(p).pair.tier == "short" for split in pairs.values() for p in split)
    _, every = api.protocol("quick", str(CATALOG), tier="all")
    assert every["validation"] == split_pairs("validation")[:6] and {load_entry(p).pair.tier for p in every["validation"]} == {"standard", "short"}
    assert settings == {k: v for k, v in PRESETS["quick"].items() if k not in pairs and k != "tier"}
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        api.protocol("huge", str(CATALOG))
    with pytest.raises(ConfigError, match="training and validation pairs"):
        api.protocol("quick", str(FIXTURES))  # the fixture catalog has training pairs only

def test_a_catalog_without_the_preset_s_tier_is_taken_whole_and_a_tier_asked_for_is_kept_to(tmp_path):
    from tests.test_coevolution import make_catalog

    catalog = str(make_catalog(tmp_path))  # standard-tier pairs only
    assert api.protocol("quick", catalog)[1] == {"train": split_pairs("train", catalog)[:2],
                                                 "validation": split_pairs("validation", catalog), "bench": split_pairs("bench", catalog)}
    with pytest.raises(ConfigError, match="training and validation pairs of the short tier"):
        api.protocol("quick", catalog, tier="short")


def test_the_standard_protocol_holds_the_quick_one_so_its_episodes_are_reused():
    quick, small = api.protocol("quick", str(CATALOG))
    standard, large = api.protocol("standard", str(CATALOG))
    assert {k: len(v) for k, v in large.items()} == {"train": 4, "validation": 6, "bench": 20}
    assert all(large[split][:len(small[split])] == small[split] for split in small)
    assert standard["max_turns"] == quick["max_turns"]  # the turn cap is part of an episode's cache key


def test_compared_methods_run_in_order_with_their_events_and_an_unknown_one_runs_nothing(context):
    settings = {"max_turns": 4}
    pairs = {"train": [PAIR], "validation": [PAIR], "bench": [PAIR]}
    with pytest.raises(ConfigError, match="unknown configuration"):
        asyncio.run(api.compare(["h0", "nonsense"], settings, pairs, context))
    assert not Ledger(context.ledger).runs()
    scripted.register("agent", [shop_agent] * 5 + [eager_agent] * 6)
    scripted.register("judge", [shop_judge])  # h0's refusal; every other answer reports a reservation
    events = []
    results = asyncio.run(api.compare(["h0", "h0-abstain-prompt"], settings, pairs, context, run_id="cmp",
                                      on_event=lambda name, node, value: events.append((name, node, value["side"]))))
    scripted.assert_consumed()
    assert {name: (r["run_id"], r["harness"], r["bench"]["counts"]["pair"]) for name, r in results.items()} == {
        "h0": ("cmp-h0", "H0", 1), "h0-abstain-prompt": ("cmp-h0-abstain-prompt", "H0-abstain-prompt", 0)}
    assert [e[:2] for e in events] == [("h0", "episode")] * 2 + [("h0-abstain-prompt", "episode")] * 2


def test_a_method_with_the_settings_of_one_before_it_is_run_once_and_shown_under_both_names(context, monkeypatch):
    assert CONFIGS["harness-only"] == CONFIGS["fdcr"]  # HERA's harness-only baseline is ECDYSIS's fdcr on the fixed pool
    monkeypatch.setitem(CONFIGS, "h0-again", {"static": "H0"})
    pairs = {"train": [PAIR], "validation": [PAIR], "bench": [PAIR]}
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge])
    events = []
    results = asyncio.run(api.compare(["h0", "h0-again", "h0"], {"max_turns": 4}, pairs, context, run_id="cmp",
                                      on_event=lambda name, node, value: events.append(name)))
    scripted.assert_consumed()  # one run's episodes
    assert events == ["h0", "h0"] and [r["id"] for r in Ledger(context.ledger).runs()] == ["cmp-h0"]
    assert list(results) == ["h0", "h0-again"] and results["h0-again"] == results["h0"] | {"same_as": "h0"}
    rows = comparison(Ledger(context.ledger), results)
    scores, against = comparison_tables(rows)
    assert [r[0] for r in scores.rows] == [r[0] for r in against.rows] == ["h0", "h0-again (= h0)"]
    assert scores.rows[0][1:] == scores.rows[1][1:]


def test_a_methods_wall_time_adds_up_over_the_invocations_of_a_resumed_run(context, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(api.time, "monotonic", lambda: now[0])
    ledger = Ledger(context.ledger)
    first = api.WallClock(ledger, "cmp-coevolution", every_s=10)
    now[0] += 4
    first.tick()  # under every_s since the start: nothing written yet
    assert ledger.run("cmp-coevolution") is None
    now[0] += 8
    first.tick()
    assert ledger.run("cmp-coevolution")["wall_s"] == 12.0
    now[0] += 30  # killed here: the last 30 s were never written
    resumed = api.WallClock(ledger, "cmp-coevolution")
    now[0] += 5
    resumed.tick(force=True)
    assert ledger.run("cmp-coevolution")["wall_s"] == 17.0
