"""`langgraph dev` serves every graph of langgraph.json offline and runs one over the API.

The server runs in a temporary directory (its `.langgraph_api/` threads and the
ledger land there) on a copy of langgraph.json whose paths are absolute, plus
`evaluate_scripted` (tests/drivers/served_evaluate.py: `evaluate` with scripted
models registered in the server's process), and is asked for a busy port, so
the test also pins how `hera serve` learns the port the server really took.
About 15–25 s on two cores, most of it the server's start.
"""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import fields
from pathlib import Path

import pytest
from langgraph_sdk import get_client

from envs.catalog import catalog_problems, load_catalog
from envs.certify import certify
from graphs.cli import parser
from graphs.serve import STUDIO, announced_url, serve_command, server_ready
from graphs.episode import graph as episode_graph
from state.context import ConfigError, Context
from state.ledger import Ledger
from state.records import Certification
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parent.parent
SPEC = json.loads((ROOT / "langgraph.json").read_text())
STARTUP_S = 120


@pytest.fixture
def server(tmp_path):
    """(url, requested port) of a `langgraph dev` asked for a port that is busy."""
    assert importlib.util.find_spec("langgraph_api"), "langgraph-cli[inmem] is missing: pip install -e '.[dev]'"
    graphs = {name: {**g, "path": str(ROOT / g["path"])} for name, g in SPEC["graphs"].items()}
    graphs["evaluate_scripted"] = {"path": str(ROOT / "tests/drivers/served_evaluate.py:graph"), "description": "test only"}
    config = tmp_path / "langgraph.json"
    config.write_text(json.dumps({**SPEC, "dependencies": [str(ROOT)], "graphs": graphs}))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    requested = busy.getsockname()[1]
    argv, env = serve_command(requested, config, reload=False)
    env |= {"HERA_RUNS": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT)}
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_S
        url = None
        while url is None or not server_ready(url, 1):
            if proc.poll() is not None:
                pytest.fail(f"langgraph dev exited with {proc.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"langgraph dev not ready after {STARTUP_S} s:\n{log.read_text()}")
            url = url or next(filter(None, map(announced_url, log.read_text().splitlines())), None)
            time.sleep(0.25)
        yield url, requested
    finally:
        print(log.read_text())  # shown by pytest when the test fails
        busy.close()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def test_dev_server_lists_every_graph_certifies_and_evaluates(server, tmp_path):
    url, requested = server
    assert url.startswith("http://127.0.0.1:") and url != f"http://127.0.0.1:{requested}"
    client = get_client(url=url)

    assistants = await client.assistants.search(limit=100)
    described = {n: g["description"] for n, g in SPEC["graphs"].items()}
    assert {a["graph_id"]: a["description"] for a in assistants} == {**described, "evaluate_scripted": "test only"}
    for a in assistants:
        schemas = await client.assistants.get_schemas(a["assistant_id"])
        assert set(schemas["context_schema"]["properties"]) == {f.name for f in fields(Context)}, a["graph_id"]

    pair_ids = ["shop-reserve-drill", "shop-rescued"]
    ledger = tmp_path / "ledger.db"
    thread = await client.threads.create()
    out = await client.runs.wait(thread["thread_id"], "certify", input={"pair_ids": pair_ids},
                                 context={"catalog": str(FIXTURES), "ledger": str(ledger)})

    entries = load_catalog(FIXTURES)
    expected = {pid: certify(entries[pid].pair, entries[pid].env) for pid in pair_ids}
    assert {pid: Certification.model_validate(c) for pid, c in out["certifications"].items()} == expected
    assert [expected[pid].passed for pid in pair_ids] == [True, False]
    assert out["problems"] == ["shop-rescued failed certification", *catalog_problems(entries, quotas=False)]
    recorded = Ledger(ledger)
    assert {pid: recorded.certification(pid, c.feasible_hash, c.infeasible_hash) for pid, c in expected.items()} == expected
    assert [r["status"] for r in await client.runs.list(thread["thread_id"])] == ["success"]

    context = {"agent_model": "scripted:agent", "judge_model": "scripted:judge", "catalog": str(FIXTURES),
               "ledger": str(ledger), "max_infra_retries": 0}
    out = await client.runs.wait(None, "evaluate_scripted", context=context,
                                 input={"run_id": "served", "bundle": "H0", "pair_ids": ["shop-reserve-drill"], "trials": 1, "seed": 0})
    assert out["metrics"]["counts"] == {"abstain": 1, "act": 1, "pair": 1, "over_abstain": 0, "abstain_raw": 1, "pair_raw": 1}
    episodes = {e.key.side: e for e in recorded.episodes("served")}
    assert {side: [o.tool for o in e.observations] for side, e in episodes.items()} == {"act": ["get_item", "reserve"], "abstain": ["get_item"]}
    assert {side: e.termination for side, e in episodes.items()} == {"act": "final_answer", "abstain": "final_answer"}
    # everything went to the ledger the context named; the runs directory holds only the model-call journal
    assert {p.name for p in (tmp_path / "runs").iterdir()} <= {"calls.db", "calls.db-wal", "calls.db-shm"}


def test_serve_command_is_offline_on_loopback():
    argv, env = serve_command(2024, ROOT / "langgraph.json")
    assert argv[1:] == ["-m", "langgraph_cli", "dev", "--config", str(ROOT / "langgraph.json"),
                        "--host", "127.0.0.1", "--port", "2024", "--no-browser"]
    assert (env["LANGGRAPH_CLI_NO_ANALYTICS"], env["LANGGRAPH_NO_VERSION_CHECK"]) == ("1", "1")
    assert serve_command(2024, ROOT / "langgraph.json", reload=False)[0][-1] == "--no-reload"
    args = parser().parse_args(["serve"])
    assert (args.command, args.port, args.no_browser) == ("serve", 2024, False)
    assert STUDIO + "http://127.0.0.1:2024" == "https://smith.langchain.com/studio/?baseUrl=http://127.0.0.1:2024"


def test_announced_url_reads_the_banner_port():
    line = "- 🚀 API: \x1b[36mhttp://127.0.0.1:37585\x1b[0m"
    assert announced_url(line) == "http://127.0.0.1:37585"
    assert announced_url("- 📚 API Docs: http://127.0.0.1:37585/docs") is None


async def test_an_episode_request_without_a_side_is_refused_naming_the_field_before_anything_opens():
    from graphs.episode import LIVE

    with pytest.raises(ConfigError, match=r"^episode input: request.side: required\n"):
        await episode_graph.ainvoke({"request": {"pair_id": "shop-reserve-drill", "bundle": "H0"}}, context=Context(catalog=str(FIXTURES)))
    assert not LIVE
