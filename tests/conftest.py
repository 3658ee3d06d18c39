from pathlib import Path

import pytest

from envs.spec import load_environment

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def shop():
    return load_environment(FIXTURES / "shop")
