"""The PostgreSQL store from the command line: one option puts the ledger, the call journal and the checkpoints
there; a bad or unreachable store is named (without its password) before anything runs."""

import json
import os

import psycopg
import pytest

from graphs.cli import main
from roles.models import scripted
from state.ledger import Ledger
from tests.conftest import FIXTURES
from tests.scripts import shop_agent, shop_judge


@pytest.fixture(autouse=True)
def no_store(monkeypatch):
    """`--store` sets HERA_STORE for the process: unset before each test and after it (a delenv of an unset variable
    restores nothing, and the store a test gave leaked into every test after it), then what it was restored."""
    monkeypatch.delenv("HERA_STORE", raising=False)
    yield
    os.environ.pop("HERA_STORE", None)


def evaluate(capsys, *argv, run: tuple[str, ...] = ("--pairs", "shop-reserve-drill")) -> tuple[int, str, str]:
    code = main(["--catalog", str(FIXTURES), *argv, "eval", *run, "--model", "scripted:agent", "--judge-model", "scripted:judge", "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_on_the_store_keeps_everything_there_and_resumes_from_it(capsys, tmp_path, postgres_url):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge])  # the refusal: the report of the reservation needs no judge
    code, out, _ = evaluate(capsys, "--store", postgres_url)
    assert code == 0
    run = json.loads(out)
    assert run["metrics"]["counts"]["pair"] == 1
    assert [r.pair_id for r in Ledger(postgres_url).episodes(run["run_id"])] == ["shop-reserve-drill"] * 2
    with psycopg.connect(postgres_url) as db:
        schemas = {r[0] for r in db.execute("select schema_name from information_schema.schemata")}
        journaled = db.execute("select count(*) from journal.calls").fetchone()[0]
        checkpointed = db.execute("select count(*) from checkpoints.checkpoints where thread_id = %s", [run["run_id"]]).fetchone()[0]
    assert {"ledger", "journal", "checkpoints"} <= schemas and journaled == 6 and checkpointed > 0
    assert not list(tmp_path.rglob("*.db"))  # no SQLite file anywhere
    scripted.register("agent", [])  # any model call now fails the test: a resume reads what the store holds
    scripted.register("judge", [])
    code, out, _ = evaluate(capsys, "--store", postgres_url, run=("--run-id", run["run_id"]))
    assert code == 0 and json.loads(out)["metrics"] == run["metrics"]


def test_a_ledger_file_and_a_store_are_not_both_taken(capsys, tmp_path):
    code, _, err = evaluate(capsys, "--store", "postgresql://hera@127.0.0.1:1/x", "--ledger", str(tmp_path / "ledger.db"))
    assert code == 2 and "give one of them" in err
    assert not list(tmp_path.rglob("*.db"))


@pytest.mark.parametrize("url,said", [
    ("sqlite:///tmp/x.db", "HERA_STORE='sqlite:///tmp/x.db': expected a PostgreSQL URL"),
    ("postgresql://hera:s3cret@127.0.0.1:1/nothing", "postgresql://hera:***@127.0.0.1:1/nothing: cannot open the PostgreSQL store"),
])
def test_a_store_that_cannot_be_used_is_named_without_its_password(capsys, tmp_path, url, said):
    scripted.register("agent", [])
    scripted.register("judge", [])
    code, _, err = evaluate(capsys, "--store", url)
    assert code == 2 and said in " ".join(err.split()) and "s3cret" not in err
    assert not list(tmp_path.rglob("*.db"))


def test_the_resume_line_does_not_print_the_store_s_password(capsys, tmp_path, postgres_url):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    user, rest = postgres_url.split("://", 1)[1].split("@", 1)
    with_password = f"postgresql://{user}:s3cret@{rest}"  # the test server trusts local connections: any password works
    code, out, err = evaluate(capsys, "--store", with_password)
    assert code == 0 and "s3cret" not in out + err
    assert f"--store 'postgresql://{user}:***@{rest}'" in err
