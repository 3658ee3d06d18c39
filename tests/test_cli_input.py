"""Input that never costs a run: bad counts, pair lists, model specs and dead endpoints are refused before anything
is written, and an endpoint lost mid-run stops the run instead of failing every episode in turn."""

import asyncio
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from graphs import api
from graphs.cli import main
from roles.models import scripted
from state.context import Context
from state.ledger import Ledger
from tests.conftest import FIXTURES
from tests.scripts import shop_agent, shop_judge
from tests.test_models import SECRET, FakeEndpoint

PAIR = "shop-reserve-drill"


@pytest.fixture
def runs(tmp_path, monkeypatch):
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


RUN_ID = ("one file or folder name: no '/', '\\', control character or undecodable byte, not starting with '.', at most "
          "128 characters")


@pytest.mark.parametrize("argv, error", [
    (["eval", "--run-id", "../outside"], f"argument --run-id: run id '../outside': {RUN_ID}"),
    (["coevolve", "--run-id", "/tmp/x"], f"argument --run-id: run id '/tmp/x': {RUN_ID}"),
    (["compare", "h0", "--run-id", ".."], f"argument --run-id: run id '..': {RUN_ID}"),
    (["evolve-harness", "--run-id", ".hidden"], f"argument --run-id: run id '.hidden': {RUN_ID}"),
    (["evolve-harness", "--run-id", "r" * 129], f"argument --run-id: run id '{'r' * 128}': {RUN_ID}"),
    (["report", "../../x"], f"argument RUN: run id '../../x': {RUN_ID}"),
    (["eval", "--run-id", "a\n[00:00:01] end"], f"argument --run-id: run id 'a\\n[00:00:01] end': {RUN_ID}"),  # a forged line
])
def test_a_run_id_that_is_not_one_folder_name_is_refused(capsys, runs, argv, error):
    """A run id names folders under the runs root (a co-evolution's catalog, which a restart deletes and copies again)."""
    assert f"error: {error}" in refused(capsys, runs, *argv)


@pytest.mark.parametrize("argv", [["eval", "--run-id", "ab\udcffc"], ["envs", "build", "--theme", "caf\udce9", "--out", "x"]])
def test_an_argument_that_is_not_utf8_is_refused_before_anything_runs(capsys, runs, argv):
    """A byte the file system's encoding cannot decode reaches argv as a surrogate: a run id of it was a UnicodeEncodeError
    traceback once the ledger recorded it, and a theme of it, sent to a model, fails each call as a malformed reply."""
    assert main(["--ledger", str(runs / "ledger.db"), *argv]) == 2
    assert f"holds bytes that are not UTF-8; hera's arguments are text" in capsys.readouterr().err
    assert not (runs / "ledger.db").exists()


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
    with pytest.raises(ValueError, match=r"cannot evaluate: no pairs; concurrency=0 \(at least 1\)"):
        asyncio.run(api.evaluate("H0", [], context, concurrency=0))
    assert not (runs / "ledger.db").exists() and not (runs / "runs").exists()


# The model endpoint, asked once before a run and watched during it


@pytest.fixture
def remote(runs, monkeypatch):
    """Points `openai:` specs at 127.0.0.1 with a key, silence noticed after 0.3 s and retries without delay."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    monkeypatch.setenv("HERA_IDLE_TIMEOUT_S", "0.3")
    monkeypatch.setenv("HERA_RETRY_BASE_S", "0")

    def at(url: str) -> None:
        monkeypatch.setenv("OPENAI_BASE_URL", url)

    return at


@pytest.fixture
def sockets():
    made = []

    def make(listening: bool) -> str:
        """A port that refuses connections, or (listening) one that accepts them and never answers."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        if listening:
            sock.listen(8)
        made.append(sock)
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    yield make
    for sock in made:
        sock.close()


def hera(capsys, tmp_path, *argv) -> tuple[int, str]:
    code = main(["--catalog", str(FIXTURES), "--ledger", str(tmp_path / "ledger.db"), *argv])
    return code, capsys.readouterr().err


def test_an_endpoint_that_refuses_connections_is_named_before_any_run(capsys, runs, remote, sockets):
    url = sockets(listening=False)
    remote(url)
    code, err = hera(capsys, runs, "eval", "--pairs", PAIR, "--model", "openai:fake", "--judge-model", "scripted:judge")
    assert code == 2
    assert f"error: --model openai:fake: {url} is unreachable ([Errno 111] Connection refused); nothing was run" in err.splitlines()
    assert not (runs / "ledger.db").exists() and not (runs / "runs").exists()


def test_an_endpoint_that_never_answers_is_named_before_any_run(capsys, runs, remote, sockets):
    url = sockets(listening=True)
    remote(url)
    code, err = hera(capsys, runs, "eval", "--pairs", PAIR, "--model", "scripted:agent", "--judge-model", "openai:fake")
    assert code == 2
    assert f"error: --judge-model openai:fake: {url} did not answer within 0.3 s; nothing was run" in err.splitlines()
    assert not (runs / "ledger.db").exists()
    code, err = hera(capsys, runs, "transfer", "--harness", "H0", "--models", "scripted:agent,openai:fake", "--judge-model", "scripted:judge",
                     "--pairs", PAIR)
    assert code == 2 and f"error: --models openai:fake: {url} did not answer within 0.3 s; nothing was run" in err.splitlines()
    code, err = hera(capsys, runs, "envs", "build", "--theme", "shop", "--out", str(runs / "built"), "--model", "scripted:maker",
                     "--solver-model", "openai:fake")
    assert code == 2 and f"error: --solver-model openai:fake: {url} did not answer within 0.3 s; nothing was run" in err.splitlines()
    assert not (runs / "ledger.db").exists() and not (runs / "built").exists()


def test_an_endpoint_that_rejects_the_key_is_named_before_any_run(capsys, runs, remote):
    class Refusing(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    remote(url)
    try:
        code, err = hera(capsys, runs, "eval", "--pairs", PAIR, "--model", "openai:fake", "--judge-model", "scripted:judge")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2
    assert f"error: --model openai:fake: {url} refused the key in OPENAI_API_KEY (HTTP 401); nothing was run" in err.splitlines()
    assert not (runs / "ledger.db").exists()


def test_an_endpoint_lost_mid_run_stops_the_run_after_three_calls(capsys, runs, remote):
    fake = FakeEndpoint([], then="drop")  # answers the probe, then closes every chat request unanswered
    remote(fake.url)
    try:
        code, err = hera(capsys, runs, "eval", "--pairs", PAIR, "--model", "openai:fake", "--judge-model", "scripted:judge",
                         "--trials", "2")
    finally:
        fake.close()
    assert code == 1
    assert len(fake.requests) == 3 * 5  # the first episode's three attempts, each a call tried five times; nothing after
    [stopped] = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert stopped.startswith("stopped: openai:fake: 3 calls in a row found no endpoint answering (last: connection: ")
    run_id = Ledger(str(runs / "ledger.db")).runs()[0]["id"]
    assert stopped.endswith(f"the finished episodes are kept: resume with `hera eval --run-id {run_id} --model openai:fake "
                            "--judge-model scripted:judge`")
    ledger = Ledger(str(runs / "ledger.db"))
    assert [a["status"] for a in ledger.attempts(run_id)] == ["infrastructure_error"] * 3
    assert json.loads(ledger.run(run_id)["metrics"])["planned"] == 4 and json.loads(ledger.run(run_id)["metrics"])["finished"] == 0


def test_a_resume_keeps_the_run_s_models_and_refuses_others(capsys, runs, remote):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    try:
        code, _ = hera(capsys, runs, "eval", "--pairs", PAIR, "--model", "scripted:agent", "--judge-model", "scripted:judge")
        assert code == 0
        run_id = Ledger(str(runs / "ledger.db")).runs()[0]["id"]
        scripted.register("agent", [])  # any model call now fails the test
        scripted.register("judge", [])
        assert hera(capsys, runs, "eval", "--run-id", run_id)[0] == 0  # scripted:agent and scripted:judge again, all reused
        code, err = hera(capsys, runs, "eval", "--run-id", run_id, "--model", "scripted:other")
    finally:
        scripted.clear()
    assert code == 2 and f"error: run {run_id} evaluated model='scripted:agent'; resume it with the same settings" in err
    run = Ledger(str(runs / "ledger.db")).run(run_id)
    assert (run["model"], run["judge"]) == ("scripted:agent", "scripted:judge")


def test_a_resume_keeps_the_run_s_turn_cap_and_refuses_another(capsys, runs, remote):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    try:
        code, _ = hera(capsys, runs, "eval", "--pairs", PAIR, "--model", "scripted:agent", "--judge-model", "scripted:judge", "--max-turns", "4")
        assert code == 0
        run_id = Ledger(str(runs / "ledger.db")).runs()[0]["id"]
        scripted.register("agent", [])  # an episode under another cap is another episode: any model call fails the test
        scripted.register("judge", [])
        assert hera(capsys, runs, "eval", "--run-id", run_id)[0] == 0  # the cap of 4 again: every episode reused
        code, err = hera(capsys, runs, "eval", "--run-id", run_id, "--max-turns", "5")
    finally:
        scripted.clear()
    assert code == 2 and f"error: run {run_id} evaluated max_turns=4; resume it with the same settings" in err


def test_a_runs_folder_is_never_outside_the_runs_root(tmp_path):
    """What the entries refuse by name, the folders refuse too: a caller of the API that skipped them gets no path."""
    from state.paths import RunPaths

    paths = RunPaths(tmp_path)
    assert paths.coevolution_run("co-1.a_b") == tmp_path / "coevolution" / "co-1.a_b"
    for folder in (paths.bundles, paths.pool, paths.coevolution_run, paths.report):
        for bad in ("..", ".", "", "../x", "a/b", "/tmp"):
            with pytest.raises(ValueError, match="not a folder's name"):
                folder(bad)
