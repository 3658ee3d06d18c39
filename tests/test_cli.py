"""The hera CLI: exit codes, JSON output, errors that name the file and field."""

import json
import shutil
from pathlib import Path

from graphs.cli import main
from tests.conftest import FIXTURES


def run(capsys, tmp_path, *argv):
    code = main(["--catalog", str(FIXTURES), "--ledger", str(tmp_path / "ledger.db"), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_certify_exit_codes_and_ledger(capsys, tmp_path):
    assert run(capsys, tmp_path, "envs", "certify", "shop-reserve-drill")[0] == 0
    code, out, _ = run(capsys, tmp_path, "envs", "certify", "shop-rescued", "--json")
    assert code == 1
    checks = {c["name"]: c["passed"] for c in json.loads(out)["certifications"][0]["checks"]}
    assert checks["no_rescue"] is False and checks["feasible_replay"] is True
    code, out, _ = run(capsys, tmp_path, "envs", "list", "--json")
    status = {r["pair"]: r["certification"] for r in json.loads(out)}
    assert status == {"shop-out-of-scope": "not run", "shop-reserve-drill": "certified", "shop-rescued": "FAILED"}


def test_certify_all_reports_catalog_problems(capsys, tmp_path):
    code, out, _ = run(capsys, tmp_path, "envs", "certify", "--all", "--json", "--quotas")
    report = json.loads(out)
    assert code == 1
    assert len(report["certifications"]) == 3
    assert "split train has 3 pairs; expected 20" in report["problems"]


def test_usage_errors_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, tmp_path, "envs", "show", "no-such-pair")
    assert code == 2 and "unknown pair 'no-such-pair'" in err
    assert run(capsys, tmp_path, "envs", "certify")[0] == 2


def test_every_command_prints_its_help():
    """`hera runs --help` once raised TypeError: a literal '%' in a help string is a format directive to argparse."""
    from graphs.cli import parser

    def walk(p):
        yield p
        for action in p._subparsers._group_actions if p._subparsers else ():
            for sub in action.choices.values():
                yield from walk(sub)

    helps = {p.prog: p.format_help() for p in walk(parser())}
    assert "hera runs compare" in helps and "95% intervals" in helps["hera runs"]
    assert all(text.startswith("usage: ") for text in helps.values())


def test_broken_spec_names_file_and_field(capsys, tmp_path):
    broken = tmp_path / "catalog" / "shop"
    shutil.copytree(FIXTURES / "shop", broken)
    (broken / "rows" / "items.json").write_text('[{"sku": "A", "name": "x", "price": "free", "stock": 1}]')
    code = main(["--catalog", str(tmp_path / "catalog"), "envs", "list"])
    err = capsys.readouterr().err
    assert code == 2
    assert "items.json" in err and "[0].price" in err and "a real" in err


def test_eval_rejects_a_bundle_with_a_broken_hook(capsys, tmp_path):
    bundle = tmp_path / "broken"
    shutil.copytree(Path(__file__).parent.parent / "harness" / "bundles" / "H0", bundle)
    (bundle / "hooks.py").write_text(
        "from harness.abi import BaseHarness\n\nclass Harness(BaseHarness):\n"
        "    def compose_instructions(self, view):\n        raise RuntimeError('boom')\n"
    )
    code, _, err = run(capsys, tmp_path, "eval", "--harness", str(bundle), "--pairs", "shop-reserve-drill", "--model", "scripted:none")
    assert code == 2
    assert "Harness.compose_instructions: raised RuntimeError: boom" in " ".join(err.split())


def test_errors_and_paths_stay_on_one_line_at_any_width(capsys, tmp_path, monkeypatch):
    from graphs import cli

    monkeypatch.setattr(cli.console, "width", 40)  # what rich does to a non-terminal stderr, only narrower
    catalog = tmp_path / ("deep-" * 20) / "catalog"
    shutil.copytree(FIXTURES / "shop", catalog / "shop")
    (catalog / "shop" / "rows" / "items.json").write_text('[{"sku": "A", "name": "x", "price": "free", "stock": 1}]')
    assert main(["--catalog", str(catalog), "envs", "list"]) == 2
    assert f"error: {catalog}/shop/rows/items.json: [0].price: a real (got 'free')" in capsys.readouterr().err.splitlines()
    out = tmp_path / ("long-" * 20) / "out"
    (out / "x").mkdir(parents=True)
    assert main(["envs", "build", "--theme", "shop", "--out", str(out), "--model", "scripted:none"]) == 2
    assert f"error: --out {out}: not empty; give a new or empty directory (or --run-id to resume)" in capsys.readouterr().err.splitlines()
    code, _, err = run(capsys, tmp_path, "envs", "certify", "--all", "--quotas")
    assert code == 1 and "problem: category ambiguous_entity has 0 pairs; expected at least 4" in err.splitlines()


def test_episode_show_gives_tool_and_hook_errors_with_their_messages(capsys, tmp_path, monkeypatch):
    from graphs import cli
    from state.ledger import Ledger
    from state.records import Observation
    from tests.test_report import episode

    failed = Observation(tool="get_item", args={"sku": "X"}, ok=False, error_code="not_found", message="No items record with sku=X.",
                         source="harness")
    record = episode("p1", "act", False).model_copy(update={"observations": (failed,), "termination": "harness_error",
                                                           "error": "hooks.py: Harness.finalize: raised KeyError: 'x'"})
    Ledger(tmp_path / "ledger.db").record_episode("r1", record)
    monkeypatch.setattr(cli.console, "width", 200)
    code, _, err = run(capsys, tmp_path, "episode", "show", record.key.id)
    cells = [cell.strip() for line in err.splitlines() for cell in line.split("│") if cell.strip() and cell.strip()[0] not in "┏┃┡├└"]
    assert code == 0 and cells[-3:] == ['tool error (a harness lookup): get_item({"sku": "X"}) not_found: No items record with sku=X.',
                                        "[harness_error] success=False abstained=False committed=False grounded=False",
                                        "error: hooks.py: Harness.finalize: raised KeyError: 'x'"]


def test_a_ledger_that_is_not_sqlite_is_one_clear_error(capsys, tmp_path):
    (tmp_path / "ledger.db").write_bytes(bytes(range(256)) * 64)
    expected = (f"error: {tmp_path / 'ledger.db'}: not a readable ledger (file is not a database); move it aside to start a new one "
                "(every recorded run and episode is then forgotten) or restore it from a backup\n")
    for argv in (["runs", "list"], ["eval", "--pairs", "shop-reserve-drill", "--model", "scripted:none"]):
        code, out, err = run(capsys, tmp_path, *argv)
        assert (code, out, err) == (2, "", expected)


def small_catalog(tmp_path, *pairs: str) -> Path:
    """A custom catalog of the fixture shop with only `pairs`."""
    root = tmp_path / "custom"
    shutil.copytree(FIXTURES / "shop", root / "shop")
    for path in (root / "shop" / "pairs").glob("*.yaml"):
        if path.stem not in pairs:
            path.unlink()
    return root


def test_every_command_that_reads_pairs_takes_catalog_after_it_and_shows_it(capsys, tmp_path):
    from graphs.cli import parser

    custom = small_catalog(tmp_path, "shop-reserve-drill")
    code = main(["--ledger", str(tmp_path / "l.db"), "envs", "list", "--json", "--catalog", str(custom)])
    assert code == 0 and [r["pair"] for r in json.loads(capsys.readouterr().out)] == ["shop-reserve-drill"]
    top = parser()._subparsers._group_actions[0].choices
    envs = top["envs"]._subparsers._group_actions[0].choices
    for sub in [*envs.values(), *(top[c] for c in ("eval", "evolve-harness", "evolve-envs", "coevolve", "compare", "transfer"))]:
        assert "--catalog" in sub.format_help(), sub.prog
    args = parser().parse_args(["eval", "--catalog", "x", "--pairs", "a"])
    assert args.catalog == "x"
    assert parser().parse_args(["--catalog", "y", "eval"]).catalog == "y"


def test_unknown_pair_names_the_catalog_searched(capsys, tmp_path):
    custom = small_catalog(tmp_path, "shop-reserve-drill")
    code = main(["envs", "show", "shop-rescued", "--catalog", str(custom)])
    err = capsys.readouterr().err
    assert code == 2 and f"error: unknown pair 'shop-rescued' in catalog {custom}" in err.splitlines()[0]


def test_a_catalog_that_is_not_there_or_holds_no_environment_is_an_error(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    for catalog, why in ((tmp_path / "missing", "no such directory"), (tmp_path / "empty", "no environment")):
        assert main(["envs", "list", "--catalog", str(catalog)]) == 2
        assert f"error: --catalog {catalog}: {why}" in capsys.readouterr().err


def test_a_small_custom_catalog_certifies_without_the_built_in_quotas(capsys, tmp_path):
    custom = small_catalog(tmp_path, "shop-reserve-drill")
    ledger = str(tmp_path / "l.db")
    code = main(["--ledger", ledger, "envs", "certify", "--all", "--json", "--catalog", str(custom)])
    assert code == 0 and json.loads(capsys.readouterr().out)["problems"] == []
    code = main(["--ledger", ledger, "envs", "certify", "--all", "--json", "--quotas", "--catalog", str(custom)])
    assert code == 1 and "split train has 1 pairs; expected 20" in json.loads(capsys.readouterr().out)["problems"]


def test_certify_reports_a_pairs_value_in_public_text(capsys, tmp_path):
    custom = small_catalog(tmp_path, "shop-reserve-drill")
    tools = custom / "shop" / "tools.py"
    tools.write_text(tools.read_text().replace("sku: The item's stock-keeping unit.", 'sku: A sku such as "DR-220".', 1))
    code = main(["--ledger", str(tmp_path / "l.db"), "envs", "certify", "shop-reserve-drill", "--json", "--catalog", str(custom)])
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert code == 1 and problems == ["environment shop: tool get_item(sku) shows 'DR-220', the key of a items row; an example must resolve to no row"]


def test_envs_list_shows_what_loads_and_reports_what_does_not(capsys, tmp_path):
    custom = small_catalog(tmp_path, "shop-reserve-drill")
    shutil.copytree(custom / "shop", custom / "broken")
    (custom / "broken" / "environment.yaml").write_text((custom / "broken" / "environment.yaml").read_text().replace("id: shop", "id: broken", 1))
    (custom / "broken" / "rows" / "items.json").write_text('[{"sku": "A", "name": "x", "price": "free", "stock": 1}]')
    code = main(["--ledger", str(tmp_path / "l.db"), "envs", "list", "--catalog", str(custom)])
    out = capsys.readouterr()
    assert code == 2
    assert "shop-reserve-drill" in out.out + out.err
    assert f"error: {custom}/broken/rows/items.json: [0].price: a real (got 'free')" in " ".join(out.err.split())


def test_ids_with_brackets_are_printed_not_read_as_markup(capsys, tmp_path):
    custom = small_catalog(tmp_path, "shop-reserve-drill")
    pair = custom / "shop" / "pairs" / "shop-reserve-drill.yaml"
    pair.write_text(pair.read_text().replace("witness:\n    - {sku: DR-220, price: \"*\"}", "witness:\n    - {sku: DR-220, price: \"*\", \"[note]\": \"*\"}"))
    main(["--ledger", str(tmp_path / "l.db"), "envs", "show", "shop-reserve-drill", "--catalog", str(custom)])
    assert "'[note]': '*'" in capsys.readouterr().err
