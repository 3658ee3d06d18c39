from pathlib import Path

import pytest

from envs.spec import load_environment
from roles.models import reset_endpoints

FIXTURES = Path(__file__).parent / "fixtures"


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
