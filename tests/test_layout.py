"""Imports flow one way (DESIGN.md §2): a package never imports one below it in this list."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["state", "envs", "harness", "prompts", "roles", "graphs"]


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", [p for p in ORDER if (ROOT / p).is_dir()])
def test_imports_flow_one_way(package):
    allowed = set(ORDER[: ORDER.index(package) + 1])
    for path in (ROOT / package).rglob("*.py"):
        bad = imported(path) & set(ORDER) - allowed
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
