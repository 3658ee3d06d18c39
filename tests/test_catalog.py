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


def test_split_order_then_spans_mutation_categories():
    from graphs.api import split_pairs

    for split in ("train", "validation", "bench"):
        for tier in (None, "short"):
            pairs = split_pairs(split, tier=tier)
            themes = {CATALOG[p].env.theme for p in pairs}
            first = pairs[: len(themes)]
            assert {CATALOG[p].env.theme for p in first} == themes
            assert len({CATALOG[p].pair.mutation.category for p in first}) == len(first), (split, tier, first)


def test_a_tool_description_quoting_a_real_key_as_its_example_is_a_finding(tmp_path):
    import shutil

    from envs.catalog import public_text_findings
    from envs.spec import load_environment
    from tests.conftest import FIXTURES

    shop = tmp_path / "shop"
    shutil.copytree(FIXTURES / "shop", shop)
    tools = shop / "tools.py"
    tools.write_text(tools.read_text().replace("sku: The item's stock-keeping unit.", 'sku: A sku such as "DR-220".', 1))
    findings = public_text_findings(load_environment(shop))
    assert [(f.where, f.value, f.source) for f in findings] == [("tool get_item(sku)", "DR-220", "the key of a items row")]
    assert public_text_findings(load_environment(FIXTURES / "shop")) == []


def test_policy_and_description_showing_a_pairs_value_are_findings(tmp_path):
    import shutil

    from envs.catalog import public_text_findings
    from envs.spec import load_environment

    entry = CATALOG["retail-boot-exchange-no-fit"]
    env_dir = tmp_path / "retail"
    shutil.copytree(entry.path.parent.parent, env_dir)
    (env_dir / "policy.md").write_text((env_dir / "policy.md").read_text() + "\nOrders look like CS-260302-1875.\n")
    env = load_environment(env_dir)
    findings = public_text_findings(env, [entry.pair])
    assert [(f.where, f.value) for f in findings] == [("policy.md", "CS-260302-1875")]
    env = env.model_copy(update={"policy": env.policy.replace("CS-260302-1875", "CS-990101-0000"), "description": env.description + ' Ships "2026-03-19".'})
    assert [(f.where, f.value, f.source) for f in public_text_findings(env, [entry.pair])] == [
        ("environment.yaml description", "2026-03-19", "a value of pair retail-boot-exchange-no-fit")]
    env = env.model_copy(update={"description": 'Search for words such as "Ridgeline blue 8".'})
    assert [(f.value, f.source) for f in public_text_findings(env, [entry.pair])] == [
        ("Ridgeline blue 8", "holding 'ridgeline', a value of pair retail-boot-exchange-no-fit")]


def test_the_built_in_catalog_shows_no_data_in_its_public_text():
    from envs.catalog import catalog_findings

    assert catalog_findings(CATALOG) == []


def test_a_pair_id_is_never_a_path():
    """An id with a path in it names no pair, though the file it points at is a pair of the catalog."""
    from envs.catalog import load_entry, load_parent
    from tests.conftest import FIXTURES

    assert load_entry("shop-rescued", FIXTURES).pair.id == "shop-rescued"
    for given in ("../pairs/shop-rescued", "../../shop/pairs/shop-rescued", "./shop-rescued"):
        with pytest.raises(KeyError, match="no pair"):
            load_entry(given, FIXTURES)
        with pytest.raises(KeyError, match="no pair or task"):
            load_parent(given, FIXTURES)
