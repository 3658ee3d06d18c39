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


def modules_imported(path: Path, package: str) -> set[str]:
    """The modules of `package` that `path` imports, at any depth of the file (a function's own import counts)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n.split(".")[0] == package}


@pytest.mark.parametrize("package", [p for p in ORDER if (ROOT / p).is_dir()])
def test_no_module_imports_one_that_imports_it_back(package):
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in (ROOT / package).rglob("*.py")}
    edges = {name: modules_imported(path, package) & set(files) - {name, package} for name, path in files.items()}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in edges[node]:
                if nxt == start:
                    return trail + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, sorted(edges)) if c]
    assert not cycles, "import cycles: " + "; ".join(" → ".join(c) for c in cycles)
