"""Input that never costs a run: bad counts, pair lists and model specs are refused before anything is written."""

import asyncio

import pytest

from graphs import api
from graphs.cli import main
from state.context import Context
from tests.conftest import FIXTURES

PAIR = "shop-reserve-drill"


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HERA_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return tmp_path


def refused(capsys, tmp_path, *argv) -> str:
    """Runs `hera argv`, which must stop at argument parsing (exit 2) having written nothing; its error line."""
    with pytest.raises(SystemExit) as exited:
        main(["--catalog", str(FIXTURES), "--ledger", str(tmp_path / "ledger.db"), *argv])
    assert exited.value.code == 2
    assert not (tmp_path / "ledger.db").exists() and not (tmp_path / "runs").exists()
    return capsys.readouterr().err.strip().splitlines()[-1]


COUNTS = [
    (["eval", "--limit", "0"], "--limit", "must be a positive integer (got 0)"),
    (["eval", "--limit", "-1"], "--limit", "must be a positive integer (got -1)"),
    (["eval", "--trials", "-2"], "--trials", "must be a positive integer (got -2)"),
    (["eval", "--trials", "0"], "--trials", "must be a positive integer (got 0)"),
    (["eval", "--concurrency", "0"], "--concurrency", "must be a positive integer (got 0)"),
    (["eval", "--retries", "-1"], "--retries", "must be a non-negative integer (got -1)"),
    (["eval", "--max-turns", "0"], "--max-turns", "must be a positive integer (got 0)"),
    (["eval", "--seed", "-1"], "--seed", "must be a non-negative integer (got -1)"),
    (["eval", "--seed", "x"], "--seed", "must be a non-negative integer (got x)"),
    (["transfer", "--harness", "H0", "--models", "scripted:a", "--limit", "0"], "--limit", "must be a positive integer (got 0)"),
    (["transfer", "--harness", "H0", "--models", "scripted:a", "--trials", "0"], "--trials", "must be a positive integer (got 0)"),
    (["transfer", "--harness", "H0", "--models", "scripted:a", "--seed", "-3"], "--seed", "must be a non-negative integer (got -3)"),
    (["transfer", "--harness", "H0", "--models", "scripted:a", "--concurrency", "0"], "--concurrency", "must be a positive integer (got 0)"),
    (["transfer", "--harness", "H0", "--models", "scripted:a", "--retries", "-1"], "--retries", "must be a non-negative integer (got -1)"),
    (["envs", "certify", PAIR, "--rescue-budget", "-1"], "--rescue-budget", "must be a positive integer (got -1)"),
    (["envs", "certify", PAIR, "--rescue-budget", "0"], "--rescue-budget", "must be a positive integer (got 0)"),
    (["envs", "build", "--theme", "x", "--out", "o", "--tasks", "0"], "--tasks", "must be a positive integer (got 0)"),
    (["envs", "build", "--theme", "x", "--out", "o", "--max-attempts", "0"], "--max-attempts", "must be a positive integer (got 0)"),
    (["envs", "build", "--theme", "x", "--out", "o", "--max-turns", "-1"], "--max-turns", "must be a positive integer (got -1)"),
    (["evolve-harness", "--pool-size", "0"], "--pool-size", "must be a positive integer (got 0)"),
    (["evolve-harness", "--val-size", "-1"], "--val-size", "must be a positive integer (got -1)"),
    (["evolve-harness", "--candidates", "0"], "--candidates", "must be a positive integer (got 0)"),
    (["evolve-harness", "--rounds", "-1"], "--rounds", "must be a non-negative integer (got -1)"),
    (["evolve-harness", "--max-turns", "0"], "--max-turns", "must be a positive integer (got 0)"),
    (["evolve-harness", "--gate-level", "0"], "--gate-level", "must be a number above 0 and at most 1 (got 0)"),
    (["evolve-harness", "--gate-level", "1.5"], "--gate-level", "must be a number above 0 and at most 1 (got 1.5)"),
    (["evolve-envs", "--diagnosis", "d", "--pool-size", "0"], "--pool-size", "must be a positive integer (got 0)"),
    (["evolve-envs", "--diagnosis", "d", "--proposers", "0"], "--proposers", "must be a positive integer (got 0)"),
    (["evolve-envs", "--diagnosis", "d", "--max-refinements", "-1"], "--max-refinements", "must be a non-negative integer (got -1)"),
    (["evolve-envs", "--diagnosis", "d", "--batch-size", "0"], "--batch-size", "must be a positive integer (got 0)"),
    (["evolve-envs", "--diagnosis", "d", "--batches", "0"], "--batches", "must be a positive integer (got 0)"),
    (["evolve-envs", "--diagnosis", "d", "--budget", "0"], "--budget", "must be a positive integer (got 0)"),
    (["evolve-envs", "--diagnosis", "d", "--tau", "-0.1"], "--tau", "must be a number from 0 to 1 (got -0.1)"),
    (["coevolve", "--rounds", "0"], "--rounds", "must be a positive integer (got 0)"),
    (["coevolve", "--train", "-1"], "--train", "must be a positive integer (got -1)"),
    (["coevolve", "--validation", "0"], "--validation", "must be a positive integer (got 0)"),
    (["coevolve", "--bench", "-1"], "--bench", "must be a non-negative integer (got -1)"),
    (["coevolve", "--proposers", "0"], "--proposers", "must be a positive integer (got 0)"),
    (["coevolve", "--batch-size", "0"], "--batch-size", "must be a positive integer (got 0)"),
    (["coevolve", "--candidates", "0"], "--candidates", "must be a positive integer (got 0)"),
    (["coevolve", "--budget", "0"], "--budget", "must be a positive integer (got 0)"),
    (["coevolve", "--max-turns", "0"], "--max-turns", "must be a positive integer (got 0)"),
    (["coevolve", "--tau", "1.5"], "--tau", "must be a number from 0 to 1 (got 1.5)"),
    (["coevolve", "--gate-level", "0"], "--gate-level", "must be a number above 0 and at most 1 (got 0)"),
    (["compare", "h0", "--bench", "-1"], "--bench", "must be a non-negative integer (got -1)"),
    (["compare", "h0", "--rounds", "0"], "--rounds", "must be a positive integer (got 0)"),
    (["serve", "--port", "0"], "--port", "must be a positive integer (got 0)"),
    (["serve", "--port", "70000"], "--port", "must be a port from 1 to 65535 (got 70000)"),
]


@pytest.mark.parametrize("argv, option, message", COUNTS, ids=[" ".join(c[0]) for c in COUNTS])
def test_a_count_out_of_range_is_refused_before_anything_runs(capsys, runs, argv, option, message):
    assert refused(capsys, runs, *argv).endswith(f"error: argument {option}: {message}")


@pytest.mark.parametrize("argv, error", [
    (["eval", "--pairs", "*"], "argument --pairs: '*' is not a pair id"),
    (["eval", "--pairs", PAIR, "shop-*"], "argument --pairs: 'shop-*' is not a pair id"),
    (["eval", "--pairs", "shop-[rs]*"], "argument --pairs: 'shop-[rs]*' is not a pair id"),
    (["eval", "--pairs", "../shop/pairs/shop-rescued"], "argument --pairs: '../shop/pairs/shop-rescued' is not a pair id"),
    (["eval", "--pairs", PAIR, "shop-rescued", PAIR], f"argument --pairs: given more than once: {PAIR}"),
    (["eval", "--pairs"], "argument --pairs: expected at least one argument"),
    (["transfer", "--harness", "H0", "--models", "scripted:a", "--pairs", PAIR, PAIR], f"argument --pairs: given more than once: {PAIR}"),
    (["transfer", "--harness", "H0", "--models", "scripted:a", "--pairs", "?hop-rescued"], "argument --pairs: '?hop-rescued' is not a pair id"),
    (["envs", "certify", PAIR, PAIR], f"argument pairs: given more than once: {PAIR}"),
    (["envs", "certify", "shop-*"], "argument pairs: 'shop-*' is not a pair id"),
    (["evolve-harness", "--pool-pairs", PAIR, PAIR], f"argument --pool-pairs: given more than once: {PAIR}"),
    (["evolve-harness", "--val-pairs", "*"], "argument --val-pairs: '*' is not a pair id"),
    (["evolve-envs", "--diagnosis", "d", "--parents", PAIR, PAIR], f"argument --parents: given more than once: {PAIR}"),
])
def test_a_pattern_or_a_duplicate_in_a_pair_list_is_refused(capsys, runs, argv, error):
    assert f"error: {error}" in refused(capsys, runs, *argv)


def test_an_unknown_pair_is_still_named(capsys, runs):
    code = main(["--catalog", str(FIXTURES), "--ledger", str(runs / "ledger.db"), "eval", "--pairs", "no-such-pair", "--model", "scripted:a"])
    assert code == 2 and "unknown pair 'no-such-pair'" in capsys.readouterr().err
    assert not (runs / "ledger.db").exists()


SPEC = "expected 'openai:<model>', 'local' or 'scripted:<name>'"


@pytest.mark.parametrize("argv, error", [
    (["eval", "--model", "foo:bar"], f"argument --model: unknown model spec 'foo:bar': {SPEC}"),
    (["eval", "--model", "openai:"], f"argument --model: unknown model spec 'openai:': {SPEC}"),
    (["eval", "--model", "scripted:a", "--judge-model", "foo"], f"argument --judge-model: unknown model spec 'foo': {SPEC}"),
    (["eval", "--model", "openai:x"], "argument --model: model spec 'openai:x' needs OPENAI_API_KEY (any value for a server without keys)"),
    (["transfer", "--harness", "H0", "--models", "scripted:a,openai:x"], "argument --models: model spec 'openai:x' needs OPENAI_API_KEY"),
    (["transfer", "--harness", "H0", "--models", "scripted:a,scripted:a"], "argument --models: given more than once: scripted:a"),
    (["transfer", "--harness", "H0", "--models", " , "], "argument --models: expected model specs separated by commas"),
    (["envs", "build", "--theme", "x", "--out", "o", "--solver-model", "foo:bar"], "argument --solver-model: unknown model spec 'foo:bar'"),
    (["evolve-harness", "--optimizer-model", "openai:x"], "argument --optimizer-model: model spec 'openai:x' needs OPENAI_API_KEY"),
    (["evolve-envs", "--diagnosis", "d", "--reviewer-model", "bar"], "argument --reviewer-model: unknown model spec 'bar'"),
    (["coevolve", "--model", "foo:bar"], "argument --model: unknown model spec 'foo:bar'"),
    (["compare", "h0", "--judge-model", "openai:x"], "argument --judge-model: model spec 'openai:x' needs OPENAI_API_KEY"),
])
def test_a_model_spec_or_its_missing_key_is_refused_up_front(capsys, runs, argv, error):
    assert f"error: {error}" in refused(capsys, runs, *argv)


def test_the_api_refuses_an_evaluation_that_could_never_complete(runs):
    context = Context(agent_model="scripted:a", judge_model="scripted:a", catalog=str(FIXTURES), ledger=str(runs / "ledger.db"))
    with pytest.raises(ValueError, match=f"cannot evaluate: pairs given more than once: {PAIR}; trials=0 \\(at least 1\\)"):
        asyncio.run(api.evaluate("H0", [PAIR, PAIR], context, trials=0))
    with pytest.raises(ValueError, match=r"cannot evaluate: no pairs; concurrency=0 \(at least 1\); max_infra_retries=-1"):
        asyncio.run(api.evaluate("H0", [], Context(max_infra_retries=-1, ledger=context.ledger), concurrency=0))
    assert not (runs / "ledger.db").exists() and not (runs / "runs").exists()
