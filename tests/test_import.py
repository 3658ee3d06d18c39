"""`hera envs import`: a suite of JSON collections, tasks with reference calls and function schemas becomes a
catalog environment that loads, and whose tasks replay once its tools have bodies."""

import json
import shutil

import pytest
import yaml

from envs.certify import replay
from envs.importer import import_suite
from envs.spec import SpecError, load_environment, tool_infos
from envs.verify import verify
from graphs.cli import main
from state.records import TaskSpec
from tests.conftest import FIXTURES

SUITE = FIXTURES / "import_suite" / "suite"
FILLED = FIXTURES / "import_suite" / "filled" / "tools.py"


def test_collections_become_tables_with_keys_children_and_references(tmp_path):
    report = import_suite(SUITE, tmp_path / "env", env_id="mini-retail")
    assert report.tables == {"users": 2, "users_payment_methods": 3, "products": 2, "orders": 3, "orders_items": 4}
    assert report.references == [
        "users_payment_methods.users_user_id -> users.user_id", "orders.user_id -> users.user_id",
        "orders.payment_method_id -> users_payment_methods.id", "orders_items.orders_order_id -> orders.order_id",
        "orders_items.product_id -> products.product_id"]
    spec = yaml.safe_load((tmp_path / "env" / "environment.yaml").read_text())
    assert spec["tables"]["users"] == {"primary_key": "user_id", "columns": {
        "user_id": "text", "name_first_name": "text", "name_last_name": "text", "address_city": "text", "address_zip": "text", "orders": "text"}}
    assert spec["tables"]["products"]["columns"] == {"product_id": "text", "name": "text", "price": "real", "in_stock": "boolean"}
    items = json.loads((tmp_path / "env" / "rows" / "orders_items.json").read_text())
    assert items[1] == {"product_id": "grinder", "quantity": 1, "id": "#W1002/0", "orders_order_id": "#W1002"}


def test_the_skeleton_loads_with_typed_parameters_and_raises_until_filled(tmp_path):
    import_suite(SUITE, tmp_path / "env", env_id="mini-retail")
    env = load_environment(tmp_path / "env")
    infos = tool_infos(env)
    assert [(n, i.read_only) for n, i in infos.items()] == [
        ("get_user_details", True), ("get_order_details", True), ("cancel_pending_order", False)]
    cancel = infos["cancel_pending_order"].input_schema
    assert cancel["required"] == ["order_id", "reason"]
    assert cancel["properties"]["reason"]["enum"] == ["no longer needed", "ordered by mistake"]
    assert cancel["properties"]["order_id"]["description"] == "The order id, such as '#W9999'."
    assert "raise NotImplementedError('cancel_pending_order')" in env.tools_source


def test_an_imported_task_replays_once_the_tools_have_bodies(tmp_path):
    out = tmp_path / "env"
    report = import_suite(SUITE, out, env_id="mini-retail")
    assert report.tasks == ["mini-retail-0", "mini-retail-1"]
    shutil.copy(FILLED, out / "tools.py")
    env = load_environment(out)
    cancel = TaskSpec.model_validate(yaml.safe_load((out / "tasks" / "mini-retail-0.yaml").read_text()))
    outcome = replay(env, cancel.reference.calls, cancel.reference.answer)
    assert [c.ok for c in outcome.calls] == [True, True, True]
    assert {r["order_id"]: r["status"] for r in outcome.final_rows["orders"]}["#W1001"] == "cancelled"
    status = TaskSpec.model_validate(yaml.safe_load((out / "tasks" / "mini-retail-1.yaml").read_text()))
    assert [(a.name, a.value) for a in status.answer] == [("output_1", "pending")]
    assert verify(status, replay(env, status.reference.calls, status.reference.answer)).passed


def test_a_broken_suite_names_the_file_and_field(tmp_path):
    suite = tmp_path / "suite"
    shutil.copytree(SUITE, suite)
    (suite / "tasks.json").write_text('[{"instruction": "x"}]')
    with pytest.raises(SpecError, match=r"tasks.json: \[0\]: a task with an instruction and a list of actions"):
        import_suite(suite, tmp_path / "env")
    (suite / "tasks.json").write_bytes(b'[{"instruction": "\xff"}]')
    with pytest.raises(SpecError, match=r"tasks.json: \(encoding\): UTF-8 text \(byte 18 is not\)"):
        import_suite(suite, tmp_path / "env2")


def test_cli_import_writes_the_environment_and_says_what_to_fill(capsys, tmp_path):
    out = tmp_path / "env"
    assert main(["envs", "import", str(SUITE), "--out", str(out), "--id", "mini-retail", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["env_id"] == "mini-retail" and report["tools"] == ["get_user_details", "get_order_details", "cancel_pending_order"]
    assert load_environment(out).id == "mini-retail"
    assert main(["envs", "import", str(SUITE), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
