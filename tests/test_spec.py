"""The loader names the file, the field and what was expected."""

import json
import shutil

import pytest

from envs.spec import SpecError, load_environment, load_pair
from state.paths import ID_RULE
from tests.conftest import FIXTURES


@pytest.fixture
def shop_dir(tmp_path):
    target = tmp_path / "shop"
    shutil.copytree(FIXTURES / "shop", target)
    return target


def error(directory) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_environment(directory)
    return info.value


def test_missing_rows_file(shop_dir):
    (shop_dir / "rows" / "reservations.json").unlink()
    e = error(shop_dir)
    assert e.path.endswith("rows/reservations.json") and e.field == "(file)"
    assert "does not exist" in e.expected


@pytest.mark.parametrize("name", ["rows/items.json", "environment.yaml", "tools.py", "policy.md"])
def test_a_file_that_is_not_utf8_is_named(shop_dir, name):
    path = shop_dir / name
    path.write_bytes((path.read_bytes() if path.exists() else b"") + b"\n\xff\xfe\n")
    e = error(shop_dir)
    assert (e.path, e.field) == (str(path), "(encoding)")
    assert e.expected.startswith("UTF-8 text (byte ")


def test_row_of_wrong_type(shop_dir):
    rows = json.loads((shop_dir / "rows" / "items.json").read_text())
    rows[1]["stock"] = "two"
    (shop_dir / "rows" / "items.json").write_text(json.dumps(rows))
    e = error(shop_dir)
    assert (e.path.endswith("items.json"), e.field) == (True, "[1].stock")
    assert e.expected == "a integer (got 'two')"


def test_row_missing_column_and_null_in_non_nullable(shop_dir):
    rows = json.loads((shop_dir / "rows" / "items.json").read_text())
    del rows[0]["name"]
    (shop_dir / "rows" / "items.json").write_text(json.dumps(rows))
    assert error(shop_dir).field == "[0].name"
    rows[0]["name"] = None
    (shop_dir / "rows" / "items.json").write_text(json.dumps(rows))
    assert "not null" in error(shop_dir).expected


def test_unknown_column_and_duplicate_key(shop_dir):
    rows = json.loads((shop_dir / "rows" / "items.json").read_text())
    (shop_dir / "rows" / "items.json").write_text(json.dumps(rows + [dict(rows[0])]))
    assert error(shop_dir).field == "[3].sku"
    rows[2]["colour"] = "red"
    (shop_dir / "rows" / "items.json").write_text(json.dumps(rows))
    assert error(shop_dir).field == "[2].colour"


def test_dangling_reference(shop_dir):
    (shop_dir / "rows" / "reservations.json").write_text(json.dumps([{"reservation_id": "R1", "sku": "NOPE", "qty": 1}]))
    e = error(shop_dir)
    assert e.field == "[0].sku" and "items.sku" in e.expected


def test_bad_column_type(shop_dir):
    path = shop_dir / "environment.yaml"
    path.write_text(path.read_text().replace("stock: integer", "stock: number"))
    e = error(shop_dir)
    assert e.path.endswith("environment.yaml") and e.field == "tables.items.columns.stock"


@pytest.mark.parametrize("old,new,field", [
    ("  items:\n", '  "../../elsewhere":\n', "tables.../../elsewhere"),  # the rows file it names is outside the folder
    ("  items:\n", "  sqlite_stat1:\n", "tables.sqlite_stat1"),  # SQLite's own: once an OperationalError at the first episode
    ("      stock: integer", '      "st]ock": integer', "tables.items.columns.st]ock"),
    ("      stock: integer", "      7: integer", "tables.items.columns.7"),
])
def test_a_table_or_column_name_no_reference_could_name_is_refused(shop_dir, old, new, field):
    path = shop_dir / "environment.yaml"
    path.write_text(path.read_text().replace(old, new, 1))
    e = error(shop_dir)
    assert (e.path, e.field) == (str(path), field) and "letters, digits and '_', not starting with 'sqlite_'" in e.expected


def test_tool_without_docstring(shop_dir):
    path = shop_dir / "tools.py"
    path.write_text(path.read_text().replace('"""Lists every item with its sku and name."""', "pass"))
    e = error(shop_dir)
    assert e.path.endswith("tools.py") and e.field == "list_items.__doc__"


def test_tool_without_annotation(shop_dir):
    path = shop_dir / "tools.py"
    path.write_text(path.read_text().replace("def get_item(db, sku: str)", "def get_item(db, sku)"))
    e = error(shop_dir)
    assert e.field == "get_item(sku)" and "type annotation" in e.expected


@pytest.mark.parametrize("before,after,expected", [
    ("def get_item(db, sku: str)", "async def get_item(db, sku: str)", "a plain function that returns its result"),
    ("def get_item(db, sku: str)", "def get_item(db, sku: 'Sku')", "type annotations that resolve (NameError: name 'Sku' is not defined)"),
])
def test_a_tool_no_call_could_use_is_named_when_it_loads(shop_dir, before, after, expected):
    """Called, an async tool hands back a coroutine (each call an internal_error); an annotation naming nothing once
    raised a NameError out of the loader."""
    path = shop_dir / "tools.py"
    path.write_text(path.read_text().replace(before, after))
    e = error(shop_dir)
    assert (e.field, e.expected.startswith(expected)) == ("get_item(...)", True)


def test_tool_module_that_does_not_import(shop_dir):
    (shop_dir / "tools.py").write_text("import not_a_module\n")
    assert error(shop_dir).field == "(module)"


def test_pair_naming_unknown_tool(shop_dir, shop):
    path = shop_dir / "pairs" / "shop-reserve-drill.yaml"
    path.write_text(path.read_text().replace("tool: get_item, args", "tool: fetch_item, args"))
    with pytest.raises(SpecError) as info:
        load_pair(path, shop)
    assert info.value.field == "task.reference.calls.1.tool"
    assert "fetch_item" in info.value.expected


def test_pair_with_bad_category(shop_dir, shop):
    path = shop_dir / "pairs" / "shop-reserve-drill.yaml"
    path.write_text(path.read_text().replace("category: missing_evidence", "category: vibes"))
    with pytest.raises(SpecError) as info:
        load_pair(path, shop)
    assert info.value.field == "mutation.category"


def test_yaml_dates_stay_strings(shop_dir, shop):
    path = shop_dir / "pairs" / "shop-reserve-drill.yaml"
    path.write_text(path.read_text().replace("value: 89.0}", "value: 89.0}\n    - {name: day, value: 2026-08-01}"))
    pair = load_pair(path, shop)
    assert pair.task.answer[1].value == "2026-08-01"


def test_a_yaml_alias_is_refused_where_it_is(shop_dir, shop):
    """Nine nested aliases of nine items each load at once and hang whatever walks them (9^9 leaves); one alias is
    refused as surely, naming its line and column."""
    path = shop_dir / "pairs" / "shop-reserve-drill.yaml"
    path.write_text("x-values: &v [1, 2]\n" + path.read_text().replace("value: 89.0}", "value: *v}"))
    with pytest.raises(SpecError) as info:
        load_pair(path, shop)
    assert (info.value.path, info.value.field) == (str(path), "(syntax)")
    assert "found an alias (*v), which these files do not take" in info.value.expected and "line 7, column 28" in info.value.expected


@pytest.mark.parametrize("name,old,bad,good", [
    ("rows/items.json", '"Hand saw"', '"Hand saw \\ud83d"', '"Hand saw \\ud83d\\ude00"'),
    ("pairs/shop-reserve-drill.yaml", "instruction: Reserve", 'instruction: "\\U0000DC00" # Reserve', 'instruction: "\\U0001F600" # Reserve'),
])
def test_an_escape_that_makes_a_lone_surrogate_is_named(shop_dir, shop, name, old, bad, good):
    """Half of an escaped emoji is text no UTF-8 record, request or log can hold: the file is refused when it loads,
    not the run that would write it down; an escaped pair is one character, and loads."""
    path, text = shop_dir / name, (shop_dir / name).read_text()
    load = (lambda: load_environment(shop_dir)) if name.endswith(".json") else (lambda: load_pair(path, shop))
    path.write_text(text.replace(old, bad, 1))
    with pytest.raises(SpecError) as info:
        load()
    assert (info.value.path, info.value.field) == (str(path), "(syntax)")
    assert info.value.expected.startswith("text that is Unicode (an escape makes a lone surrogate, in")
    path.write_text(text.replace(old, good, 1))
    assert "\U0001F600" in json.dumps(load().model_dump(), ensure_ascii=False)


def test_a_pair_file_named_what_no_id_can_be_is_named(shop_dir, shop):
    """A control character in a pair's file name and id: listed, yet refused by every command that takes a pair id."""
    path = shop_dir / "pairs" / "shop-\x01odd.yaml"
    path.write_text((shop_dir / "pairs" / "shop-rescued.yaml").read_text().replace("id: shop-rescued", 'id: "shop-\\x01odd"'))
    with pytest.raises(SpecError) as info:
        load_pair(path, shop)
    assert (info.value.field, info.value.expected) == ("id", f"{ID_RULE} (got 'shop-\\x01odd')")


@pytest.mark.parametrize("name", ["rows/items.json", "pairs/shop-reserve-drill.yaml"])
def test_a_file_nested_too_deep_to_parse_is_named(shop_dir, shop, name):
    path = shop_dir / name
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(deep if name.endswith(".json") else path.read_text() + f"x: {deep}\n")
    with pytest.raises(SpecError) as info:
        load_environment(shop_dir) if name.endswith(".json") else load_pair(path, shop)
    assert (info.value.path, info.value.field) == (str(path), "(syntax)")
    assert "maximum recursion depth exceeded" in info.value.expected
