"""Every pair of the built-in catalog certifies, and the catalog meets HERA's split rules."""

import pytest

from envs.catalog import catalog_problems, load_catalog
from envs.certify import certify

CATALOG = load_catalog()


def test_catalog_meets_split_and_category_rules():
    assert catalog_problems(CATALOG) == []


@pytest.mark.parametrize("pair_id", sorted(CATALOG))
def test_pair_certifies(pair_id):
    entry = CATALOG[pair_id]
    failed = [f"{c.name}: {c.detail}" for c in certify(entry.pair, entry.env).checks if not c.passed]
    assert failed == []
