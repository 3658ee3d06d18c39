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


def test_split_order_spans_themes_first():
    from graphs.api import split_pairs

    bench = split_pairs("bench")
    assert sorted(bench) == sorted(p for p, e in CATALOG.items() if e.pair.split == "bench")
    assert len({CATALOG[p].env.theme for p in bench[:5]}) == 5


def test_a_tool_description_quoting_a_real_key_as_its_example_is_a_problem(tmp_path):
    import shutil

    from envs.catalog import example_ids
    from envs.spec import load_environment
    from tests.conftest import FIXTURES

    shop = tmp_path / "shop"
    shutil.copytree(FIXTURES / "shop", shop)
    tools = shop / "tools.py"
    tools.write_text(tools.read_text().replace("sku: The item's stock-keeping unit.", 'sku: A sku such as "DR-220".', 1))
    assert example_ids(load_environment(shop)) == [("get_item", "DR-220")]
    assert example_ids(load_environment(FIXTURES / "shop")) == []
