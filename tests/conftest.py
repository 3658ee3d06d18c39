import os
import uuid
from pathlib import Path

import pytest

from envs.spec import load_environment
from roles.models import reset_endpoints, scripted
from state.context import Context

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def context(tmp_path):
    """Scripted models (`scripted:agent`, `scripted:judge`) on the fixture catalog, a ledger of the test's own; a test
    module with other needs defines its own `context`."""
    scripted.clear()
    yield Context(agent_model="scripted:agent", judge_model="scripted:judge", catalog=str(FIXTURES),
                  ledger=str(tmp_path / "ledger.db"), max_infra_retries=1)
    scripted.clear()


@pytest.fixture
def shop():
    return load_environment(FIXTURES / "shop")


@pytest.fixture(autouse=True)
def own_runs(tmp_path, monkeypatch):
    """No test reads or writes the working directory's runs/: what a user's earlier runs left there is theirs."""
    monkeypatch.setenv("HERA_RUNS", str(tmp_path / "runs"))


@pytest.fixture(autouse=True)
def endpoints_up():
    """No test inherits an endpoint another test brought down: the count of failed calls is per process."""
    reset_endpoints()
    yield
    reset_endpoints()


@pytest.fixture
def postgres_databases():
    """Makes new databases on the test PostgreSQL server ($HERA_TEST_POSTGRES; `.ci/postgres` starts one), each
    dropped after the test: a function returning a new one's URL. Without a server the test is skipped, or fails
    where HERA_REQUIRE_POSTGRES is set (CI)."""
    import psycopg

    base = os.environ.get("HERA_TEST_POSTGRES")
    if not base:
        if os.environ.get("HERA_REQUIRE_POSTGRES"):
            pytest.fail("HERA_REQUIRE_POSTGRES is set but HERA_TEST_POSTGRES names no PostgreSQL server")
        pytest.skip("no PostgreSQL server: set HERA_TEST_POSTGRES (`. .ci/postgres` starts one)")
    made = []

    def new() -> str:
        made.append(f"hera_test_{uuid.uuid4().hex[:12]}")
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'create database "{made[-1]}"')
        return f"{base.rsplit('/', 1)[0]}/{made[-1]}"

    yield new
    with psycopg.connect(base, autocommit=True) as conn:
        for name in made:
            conn.execute(f'drop database "{name}" with (force)')


@pytest.fixture
def postgres_url(postgres_databases):
    return postgres_databases()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    """Where a test's ledger lives: a SQLite file, or a new PostgreSQL database (its URL)."""
    return str(tmp_path / "ledger.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")
