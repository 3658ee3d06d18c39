"""Construction from a theme with scripted models: the database and coding
loops (bounded, with the problems sent back), tool validation in the sandbox,
task proposal, the independent solver on public tools only, and the
verifier's replay and perturbation test that decides which tasks are kept."""

import asyncio
import collections
import json
from dataclasses import replace
from pathlib import Path
from string import Template

import pytest
import yaml
from langgraph.checkpoint.memory import InMemorySaver
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

from envs.catalog import load_catalog, load_parent, task_ids
from envs.certify import certify
from envs.construct import (check_task, request_problems, seed_task_id, with_details, example_write_tool, module_code, public_context, run_call, stage_public, starting_module, task_perturbations,
                            task_problems, task_spec, tidy_task, write_database, write_tools_module)
from envs.runtime import EnvInstance
from envs.spec import load_database, load_environment, tool_infos
from graphs import cli
from graphs.construct import builder
from harness.bundle import load_bundle
from harness.tool_sandbox import check_tools, sandboxed_seeds
from roles.models import scripted
from state.construction import DatabaseDraft, Named, TaskDraft, TaskSeed, ToolsDraft
from state.context import Context
from state.records import AnswerCheck, StateCheck, ToolCall

THEME = "a city library's books and loans"

BRANCHES = {"name": "branches", "primary_key": "branch_id",
            "columns": [{"name": "branch_id", "type": "text"}, {"name": "name", "type": "text"}],
            "rows": [{"branch_id": "B1", "name": "Harbor Branch"}, {"branch_id": "B2", "name": "Hillcrest Branch"}]}
BOOKS = {"name": "books", "primary_key": "book_id",
         "columns": [{"name": "book_id", "type": "text"}, {"name": "title", "type": "text"},
                     {"name": "branch_id", "type": "text", "references": "branches.branch_id"}, {"name": "copies", "type": "integer"}],
         "rows": [{"book_id": "BK-1", "title": "The Tide Atlas", "branch_id": "B1", "copies": 2},
                  {"book_id": "BK-2", "title": "Mountain Birds", "branch_id": "B2", "copies": 0},
                  {"book_id": "BK-3", "title": "River Songs", "branch_id": "B1", "copies": 1}]}
LOANS = {"name": "loans", "primary_key": "loan_id",
         "columns": [{"name": "loan_id", "type": "text"}, {"name": "book_id", "type": "text", "references": "books.book_id"},
                     {"name": "member", "type": "text"}],
         "rows": []}
LIBRARY = {"id": "city-library", "description": "Books and loans of the city library on 2026-03-02.",
           "tables": [BRANCHES, BOOKS, LOANS]}
DANGLING = {**LIBRARY, "tables": [BRANCHES, {**BOOKS, "rows": [{**BOOKS["rows"][0], "branch_id": "B9"}]}, LOANS]}

HEADER = "from envs.toolkit import ToolError, find, one, read_tool, write_tool\n"
LIST_BOOKS = '''
@read_tool
def list_books(db) -> list[dict]:
    """Lists every book with its id, title and branch."""
    return [{"book_id": b["book_id"], "title": b["title"], "branch_id": b["branch_id"]} for b in find(db, "books")]
'''
GET_BOOK = '''
@read_tool
def get_book(db, book_id: str) -> dict:
    """Returns a book's title, branch and the copies on the shelf.

    Args:
        book_id: The book's id.
    """
    return one(db, "books", book_id=book_id)
'''
LEND_BOOK = '''
@write_tool
def lend_book(db, book_id: str, member: str) -> dict:
    """Lends a copy of a book to a member.

    Args:
        book_id: The book's id.
        member: The member's full name.
    """
    book = one(db, "books", book_id=book_id)
    if book["copies"] < 1:
        raise ToolError("no_copies", f"No copy of {book_id} is on the shelf.")
    loan_id = f"L-{len(find(db, 'loans')) + 1}"
    db["loans"].insert({"loan_id": loan_id, "book_id": book_id, "member": member})
    db["books"].update(book_id, {"copies": book["copies"] - 1})
    return {"loan_id": loan_id, "copies_left": book["copies"] - 1}
'''
LIST_BRANCHES = '''
@read_tool
def list_branches(db) -> list[dict]:
    """Lists the library's branches."""
    return find(db, "branches")
'''
GOOD_CODE = HEADER + LIST_BOOKS + GET_BOOK + LEND_BOOK + LIST_BRANCHES

BOOK_SCHEMA = {"type": "object", "required": ["book_id", "title", "copies"], "properties": {"copies": {"type": "integer"}}}
DECLARED = [
    {"name": "list_books", "read_only": True, "returns": {"type": "array", "items": {"type": "object", "required": ["book_id", "title"]}},
     "valid": [{}]},
    {"name": "get_book", "read_only": True, "returns": BOOK_SCHEMA, "valid": [{"book_id": "BK-1"}],
     "invalid": [{"args": {"book_id": "BK-9"}, "error_code": "not_found"}]},
    {"name": "lend_book", "read_only": False, "returns": {"type": "object", "required": ["loan_id", "copies_left"]},
     "valid": [{"book_id": "BK-1", "member": "Ada Park"}], "changes": ["loans", "books"],
     "invalid": [{"args": {"book_id": "BK-2", "member": "Ada Park"}, "error_code": "no_copies"},
                 {"args": {"book_id": "BK-9", "member": "Ada Park"}, "error_code": "not_found"}]},
    {"name": "list_branches", "read_only": True, "returns": {"type": "array"}, "valid": [{}]},
]
GOOD_TOOLS = {"code": GOOD_CODE, "tools": DECLARED}
RAISING_CODE = GOOD_CODE.replace('return one(db, "books", book_id=book_id)', 'return one(db, "books", book_id=book_id)["copies"] / 0')
RAISING_TOOLS = {"code": RAISING_CODE, "tools": DECLARED}
SYNTAX_CODE = GOOD_CODE.replace("def lend_book(db, book_id: str, member: str)", "def lend_book(db, book_id: str member: str)")


def module(code: str) -> str:
    """The tool coder's reply: the module in a fenced block, with a line of talk around it as a model writes."""
    return f"Here is the module.\n```python\n{code}```\nEach tool is declared below."


def coded(tools: dict) -> list:
    """The tool coder's two calls: the module as code, then the declarations of the tools it added."""
    return [module(tools["code"]), by_name(tools["tools"])]


def by_name(declared: list[dict]) -> dict:
    """The declarations reply: one entry per tool, keyed by its name."""
    return {d["name"]: d for d in declared}


ACCEPT = {"reasons": "a plausible request; the solution lends the named book and reports the copies left", "accept": True}
RAISING_PROBLEM = 'get_book({"book_id": "BK-1"}): crashed: get_book failed: ZeroDivisionError: division by zero'

KEPT = {"id": "lend-tide-atlas", "instruction": "Lend a copy of The Tide Atlas to Ada Park and tell me how many copies are left on the shelf.",
        "answer": [{"name": "copies_left", "value": 1}], "state": [{"table": "loans", "match": {"book_id": "BK-1", "member": "Ada Park"}}],
        "allowed_writes": ["loans", "books"]}
# Its state check holds before anything is done, so an outcome with the loan left out still passes.
LOOSE = {"id": "lend-river-songs", "instruction": "Lend River Songs to Ben Ode and tell me how many copies remain.",
         "answer": [{"name": "copies_left", "value": 0}], "state": [{"table": "books", "match": {"book_id": "BK-3"}}],
         "allowed_writes": ["loans", "books"]}
UNKNOWN_TABLE = {"id": "renew-loan", "instruction": "Renew my loan of Mountain Birds.",
                 "answer": [{"name": "due", "value": "2026-03-16"}], "state": [{"table": "renewals", "match": {"book_id": "BK-2"}}]}


def librarian(messages, tools):
    """A solver policy: find the book the request names, lend it to the member, report the copies left."""
    request = next(m.content for m in messages if isinstance(m, HumanMessage))
    title, member = ("The Tide Atlas", "Ada Park") if "Tide Atlas" in request else ("River Songs", "Ben Ode")
    results = [json.loads(m.content) for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return {"tool_calls": [{"name": "list_books", "args": {}}]}
    if len(results) == 1:
        book = next(b for b in results[0] if b["title"] == title)
        return {"tool_calls": [{"name": "lend_book", "args": {"book_id": book["book_id"], "member": member}}]}
    return f"Lent {title} to {member}; {results[1]['copies_left']} copies are left on the shelf."


@pytest.fixture
def context(tmp_path):
    scripted.clear()
    # the solver runs in H0 (text turns, no hook asks its model anything) so the scripted solver is one policy
    # tasks written whole by the proposer (`free`); `menu` tasks come from seeds (tests at the end)
    yield Context(builder_model="scripted:builder", task_model="scripted:proposer", solver_model="scripted:solver", solver_harness="H0", task_proposals="free",
                  reviewer_model="scripted:reviewer", proposer_model="scripted:chooser", ledger=str(tmp_path / "ledger.db"))
    scripted.clear()


def build(context, out, **kw):
    payload = {"theme": THEME, "out": str(out), "tasks": 3, "max_attempts": 3, "max_turns": 6, **kw}
    checkpointed = builder.compile(checkpointer=InMemorySaver(), name="construct")
    return asyncio.run(checkpointed.ainvoke(payload, {"configurable": {"thread_id": "t"}}, context=context))


def decisions(final):
    return [(d.step, d.subject, d.attempt, d.accepted) for d in final["decisions"]]


def written(out: Path, tools: dict) -> Path:
    assert write_database(DatabaseDraft.model_validate(LIBRARY), out, THEME) == []
    write_tools_module(ToolsDraft.model_validate(tools), out)
    return out


def test_environment_built_from_a_theme_loads_and_keeps_only_validated_tasks(context, tmp_path):
    out = tmp_path / "library"
    # a module that does not parse has no tool to keep: the whole module goes back (no declarations are asked of it)
    scripted.register("builder", [DANGLING, LIBRARY, module(SYNTAX_CODE), *coded(GOOD_TOOLS)])
    scripted.register("proposer", [{"tasks": [KEPT, LOOSE, UNKNOWN_TABLE]}])
    scripted.register("solver", [librarian] * 6)
    scripted.register("reviewer", [ACCEPT])
    final = build(context, out)
    scripted.assert_consumed()

    assert final["status"] == "built" and final["kept"] == ["lend-tide-atlas"]
    assert decisions(final) == [
        ("database", "city-library", 1, False), ("database", "city-library", 2, True),
        ("tools", "city-library", 1, False), ("tools", "city-library", 2, True),
        ("task_proposal", "lend-tide-atlas", 1, True), ("task_proposal", "lend-river-songs", 1, True),
        ("task_proposal", "renew-loan", 1, False),
        ("solver", "lend-tide-atlas", 1, True), ("verification", "lend-tide-atlas", 1, True),
        ("solver", "lend-river-songs", 1, True), ("verification", "lend-river-songs", 1, False),
        ("task_review", "lend-tide-atlas", 1, True),
    ]
    reasons = {(d.step, d.subject, d.attempt): d.reasons for d in final["decisions"]}
    assert reasons["database", "city-library", 1] == ("rows/books.json: [0].branch_id: a value present in branches.branch_id (got 'B9')",)
    [syntax] = reasons["tools", "city-library", 1]
    assert syntax.startswith("tools.py: (module): an importable Python module (SyntaxError: invalid syntax.")
    assert reasons["task_proposal", "renew-loan", 1] == ("task renew-loan: state.0.table 'renewals' is not a table (['books', 'branches', 'loans'])",)
    assert reasons["verification", "lend-river-songs", 1] == ("the verifier accepts a perturbed outcome: writes left out",)
    assert reasons["verification", "lend-tide-atlas", 1] == (
        ("replayed 2 calls; the verifier accepts the outcome and rejects 5 perturbed ones: answer without copies_left; "
         "answer with wrong copies_left; writes left out; empty answer, no writes; an extra change to branches"),)

    # the retries were given the problems of the previous draft
    builder_prompts = [c.messages[0].content for c in scripted.calls("builder")]
    assert "- rows/books.json: [0].branch_id: a value present in branches.branch_id (got 'B9')" in builder_prompts[1]
    assert f"- {syntax}" in builder_prompts[3] and "book_id: str member: str" in builder_prompts[3]
    assert "def search_books(db, query: str)" in builder_prompts[2]  # the tool coder starts from a module that runs
    # the declarations are asked of the tools the module added, by their names: a grammar enum
    schema = scripted.calls("builder")[4].schema.model_json_schema()
    assert list(schema["properties"]) == ["get_book", "list_books", "lend_book", "list_branches"]  # get_book redefines the starting module's
    assert schema["required"] == list(schema["properties"])  # one entry each
    lend = schema["$defs"]["Declared2"]["properties"]
    assert lend["invalid"]["minItems"] == 1 and lend["changes"]["items"]["enum"] == ["branches", "books", "loans"]  # a table, by the grammar
    assert "minItems" not in schema["$defs"]["Declared1"]["properties"]["invalid"]  # list_books takes no argument to refuse

    env = load_environment(out)
    assert (env.id, env.theme, [t.name for t in env.tables]) == ("city-library", THEME, ["branches", "books", "loans"])
    assert list(tool_infos(env)) == ["search_branches", "get_branch", "search_books", "get_book", "list_books", "lend_book", "list_branches"]
    assert [r["title"] for r in env.rows["books"]] == ["The Tide Atlas", "Mountain Birds", "River Songs"]
    assert sorted(p.name for p in (out / "tasks").iterdir()) == ["lend-tide-atlas.yaml"]
    task = yaml.safe_load((out / "tasks" / "lend-tide-atlas.yaml").read_text())
    assert task["reference"] == {"calls": [{"tool": "list_books"}, {"tool": "lend_book", "args": {"book_id": "BK-1", "member": "Ada Park"}}],
                                 "answer": "Lent The Tide Atlas to Ada Park; 1 copies are left on the shelf."}
    assert task["answer"] == [{"name": "copies_left", "value": 1}] and task["allowed_writes"] == ["loans", "books"]
    log = json.loads((out / "construction.json").read_text())
    assert log["status"] == "built" and log["kept"] == ["lend-tide-atlas"] and log["environment"] == "city-library"
    assert [(d["step"], d["subject"], d["accepted"]) for d in log["decisions"]] == [(s, n, a) for s, n, _, a in decisions(final)]
    assert sorted({u["role"] for u in log["usage"]}) == ["environment_builder", "solver", "task_proposer", "task_reviewer", "tool_coder"]


def test_the_solver_sees_only_the_instruction_the_public_context_and_the_public_tools(context, tmp_path):
    out = tmp_path / "library"
    scripted.register("builder", [LIBRARY, *coded(GOOD_TOOLS)])
    scripted.register("proposer", [{"tasks": [KEPT]}])
    scripted.register("solver", [librarian] * 3)
    scripted.register("reviewer", [ACCEPT])
    assert build(context, out)["kept"] == ["lend-tide-atlas"]
    scripted.assert_consumed()
    calls = scripted.calls("solver")
    system = Template(load_bundle("H0").prompts["system"]).substitute(context="Books and loans of the city library on 2026-03-02.")
    assert calls[0].messages == [SystemMessage(system.strip()), HumanMessage(KEPT["instruction"])]
    public = EnvInstance(load_environment(out)).public_tools
    assert [t.name for t in public] == ["search_branches", "get_branch", "search_books", "get_book", "list_books", "lend_book",
                                        "list_branches"] and all(c.tools == public for c in calls)
    seen = "\n".join(str(m.content) for c in calls for m in c.messages)
    for private in ("Harbor Branch", "Hillcrest Branch", "allowed_writes", "match"):
        assert private not in seen  # no row the tools did not return, no verification rule
    assert public_context(out) == "Books and loans of the city library on 2026-03-02."
    assert sorted(p.name for p in out.iterdir()) == ["construction.json", "environment.yaml", "rows", "tasks", "tools.checks.json", "tools.py"]
    (tmp_path / "stage").mkdir()
    staged = stage_public(out, tmp_path / "stage")  # what a sandboxed tool server gets: no tasks, no log
    assert sorted(p.name for p in staged.iterdir()) == ["environment.yaml", "rows", "tools.checks.json", "tools.py"]


def test_the_solver_tries_again_when_the_verifier_rejects_its_outcome_not_when_it_rejects_the_rules(context, tmp_path):
    starts = collections.Counter()

    def forgetful_first(messages, tools):  # its first attempt at the Tide Atlas answers without lending the book
        request = next(m.content for m in messages if isinstance(m, HumanMessage))
        looked = any(isinstance(m, ToolMessage) for m in messages)
        starts[request] += not looked
        if "Tide Atlas" in request and starts[request] == 1 and looked:
            return "The Tide Atlas is on the shelf."
        return librarian(messages, tools)

    scripted.register("builder", [LIBRARY, *coded(GOOD_TOOLS)])
    scripted.register("proposer", [{"tasks": [KEPT, LOOSE]}])
    scripted.register("solver", [forgetful_first] * 8)  # Tide Atlas: 2 + 3 calls; River Songs: 3, once
    scripted.register("reviewer", [ACCEPT])
    final = build(context, tmp_path / "library", solver_tries=2, max_attempts=1)
    scripted.assert_consumed()
    assert final["kept"] == ["lend-tide-atlas"] and starts == {KEPT["instruction"]: 2, LOOSE["instruction"]: 1}
    reasons = {(d.step, d.subject): (d.accepted, d.reasons[0]) for d in final["decisions"]}
    assert reasons["solver", "lend-tide-atlas"][1].startswith("final_answer: 2 calls (try 2); answer 'Lent The Tide Atlas")
    assert reasons["verification", "lend-tide-atlas"][0] is True
    assert reasons["verification", "lend-river-songs"] == (False, "the verifier accepts a perturbed outcome: writes left out")


def test_the_coding_loop_is_bounded_and_ends_with_the_example_write_tool(context, tmp_path):
    out = tmp_path / "library"
    again = SYNTAX_CODE.replace("Lists every book", "Lists all the books")
    # the second draft first repeats the functions that failed: they are asked for again, differently, not retried as
    # they were; the third and last takes the example write tool with its own declaration, and asks the coder nothing
    scripted.register("builder", [LIBRARY, module(SYNTAX_CODE), module(SYNTAX_CODE), module(again)])
    scripted.register("proposer", [{"tasks": []}] * 3)
    final = build(context, out, max_attempts=3)
    scripted.assert_consumed()  # no fourth draft
    calls = scripted.calls("builder")
    assert [c.temperature for c in calls[1:3]] == [None, None] and calls[3].temperature == 1.0
    assert "def list_books" in calls[2].messages[0].content.split("Your previous functions:")[1]
    reasked = calls[3].messages[0].content.split("Your previous functions:")[1]
    assert "(none yet)" in reasked and "def list_books" not in reasked and "repeated the functions that failed" in reasked
    assert decisions(final)[:4] == [("database", "city-library", 1, True), ("tools", "city-library", 1, False), ("tools", "city-library", 2, False),
                                    ("tools", "city-library", 3, True)]
    assert final["decisions"][3].reasons == ("5 tools (the coder's own write tools failed; the example one written for this database); "
                                             "every declared call behaves as declared",)
    assert list(tool_infos(load_environment(out))) == ["search_branches", "get_branch", "search_books", "get_book", "add_loan"]


KWARGS_CODE = GOOD_CODE + """
@write_tool
def update_book(db, **changes) -> dict:
    \"\"\"Changes a book.\"\"\"
    return {}
"""


@pytest.mark.parametrize("broken, dropped, tools", [
    (KWARGS_CODE, "dropped update_book, which failed their declared calls",  # the loader refuses it: it stops the whole module
     ["search_branches", "get_branch", "search_books", "get_book", "list_books", "lend_book", "list_branches"]),
    (RAISING_CODE, "dropped get_book, which failed their declared calls",  # both definitions: the coder's replaced the starting one
     ["search_branches", "get_branch", "search_books", "list_books", "lend_book", "list_branches"]),
    (GOOD_CODE.replace('    loan_id = f"L-', '    1 / 0\n    loan_id = f"L-'),
     "dropped lend_book, which failed their declared calls; took the example write tool written for this database",
     ["search_branches", "get_branch", "search_books", "get_book", "list_books", "list_branches", "add_loan"]),
])
def test_tools_that_fail_are_dropped_when_the_rest_passes(context, tmp_path, broken, dropped, tools):
    out = tmp_path / "library"
    update = {"name": "update_book", "read_only": False, "returns": {"type": "object"}, "valid": [{}], "changes": ["books"]}
    declared = DECLARED + ([update] if "update_book" in broken else [])
    scripted.register("builder", [LIBRARY, *coded({"code": broken, "tools": declared})])  # one draft of the tools, no retry
    scripted.register("proposer", [{"tasks": []}])
    final = build(context, out, max_attempts=1)
    scripted.assert_consumed()
    assert decisions(final)[:2] == [("database", "city-library", 1, True), ("tools", "city-library", 1, True)]
    [reason] = final["decisions"][1].reasons
    assert reason.startswith(f"{len(tools)} tools ({dropped}: ") and reason.endswith("); every declared call behaves as declared")
    assert list(tool_infos(load_environment(out))) == tools
    assert asyncio.run(check_tools(out))[0] == []


def test_the_database_loop_is_bounded(context, tmp_path):
    # an id written as a name is made kebab-case, not refused
    scripted.register("builder", [{**DANGLING, "id": "City Library"}, {**LIBRARY, "id": "Library_Env", "tables": []}])
    final = build(context, tmp_path / "library", max_attempts=2)
    scripted.assert_consumed()
    assert decisions(final) == [("database", "city-library", 1, False), ("database", "library-env", 2, False)]
    assert final["decisions"][1].reasons == ("tables: at least one table",)
    assert final["status"] == "rejected"


BROKEN = HEADER + LIST_BOOKS + '''
@read_tool
def get_book(db, book_id: str) -> dict:
    """Returns a book.

    Args:
        book_id: The book's id.
    """
    return one(db, "books", book_id=book_id)["copies"] / 0


@read_tool
def touch_book(db, book_id: str) -> dict:
    """A read tool that switches the read-only guard off and writes.

    Args:
        book_id: The book's id.
    """
    db.execute("PRAGMA query_only = 0")
    db["books"].update(book_id, {"copies": 0})
    return one(db, "books", book_id=book_id)


@read_tool
def count_books(db, branch_id: str) -> dict:
    """A read tool that writes plainly.

    Args:
        branch_id: The branch's id.
    """
    db["branches"].update(branch_id, {"name": "x"})
    return {"count": len(find(db, "books", branch_id=branch_id))}


@write_tool
def lend_book(db, book_id: str, member: str) -> dict:
    """Records the loan, then finds there is no copy and refuses.

    Args:
        book_id: The book's id.
        member: The member's full name.
    """
    db["loans"].insert({"loan_id": "L-1", "book_id": book_id, "member": member})
    if one(db, "books", book_id=book_id)["copies"] < 1:
        raise ToolError("no_copies", "No copy is on the shelf.")
    return {"loan_id": "L-1"}


@write_tool
def return_book(db, book_id: str) -> dict:
    """Writes, then leaves through SystemExit, past the runtime's guard.

    Args:
        book_id: The book's id.
    """
    db["books"].update(book_id, {"copies": 5})
    raise SystemExit("bye")


@read_tool
def wait_for_book(db, book_id: str) -> dict:
    """Never returns.

    Args:
        book_id: The book's id.
    """
    while True:
        pass


@read_tool
def find_title(db, title: str) -> dict:
    """Declares a string result but returns a list, and accepts what it should refuse.

    Args:
        title: A title.
    """
    return [b["book_id"] for b in find(db, "books", title=title)]
'''
BROKEN_DECLARED = [
    DECLARED[0], DECLARED[1],
    {"name": "touch_book", "read_only": True, "returns": BOOK_SCHEMA, "valid": [{"book_id": "BK-1"}],
     "invalid": [{"args": {"book_id": "BK-9"}, "error_code": "not_found"}]},
    {"name": "count_books", "read_only": True, "returns": {"type": "object"}, "valid": [{"branch_id": "B1"}],
     "invalid": [{"args": {"branch_id": "B9"}, "error_code": "not_found"}]},
    {"name": "lend_book", "read_only": False, "returns": {"type": "object"}, "valid": [{"book_id": "BK-1", "member": "Ada Park"}],
     "changes": ["loans"], "invalid": [{"args": {"book_id": "BK-2", "member": "Ada Park"}, "error_code": "no_copies"}]},
    {"name": "return_book", "read_only": False, "returns": {"type": "object"}, "valid": [], "changes": ["books"],
     "invalid": [{"args": {"book_id": "BK-1"}, "error_code": "not_on_loan"}]},
    {"name": "find_title", "read_only": True, "returns": {"type": "string"}, "valid": [{"title": "River Songs"}],
     "invalid": [{"args": {"title": "No Such Book"}, "error_code": "not_found"}]},
    {"name": "wait_for_book", "read_only": True, "returns": {"type": "object"}, "valid": [{"book_id": "BK-1"}],
     "invalid": [{"args": {"book_id": "BK-9"}, "error_code": "not_found"}]},
    {"name": "renew_loan", "read_only": False, "returns": {"type": "object"}, "valid": [{}]},
]


def test_tool_validation_in_the_sandbox_finds_each_defect(tmp_path):
    out = written(tmp_path / "library", {"code": BROKEN, "tools": BROKEN_DECLARED})
    problems, tools, _ = asyncio.run(check_tools(out))
    assert problems == [
        "renew_loan: declared, but tools.py has no function renew_loan decorated with @read_tool or @write_tool",
        RAISING_PROBLEM,
        'touch_book({"book_id": "BK-1"}): a read-only tool changed the state: books[BK-1]',
        'touch_book({"book_id": "BK-9"}): crashed: touch_book failed: NotFoundError: ',
        'count_books({"branch_id": "B1"}): crashed: count_books failed: OperationalError: attempt to write a readonly database',
        'count_books({"branch_id": "B9"}): crashed: count_books failed: NotFoundError: ',
        "return_book: no valid call declared",
        'return_book({"book_id": "BK-1"}): escaped the runtime with SystemExit: bye',
        'return_book({"book_id": "BK-1"}): a failed call left a partial write: books[BK-1]',
        'wait_for_book({"book_id": "BK-1"}): escaped the runtime with CallTimeout: did not finish within 5s',
        'wait_for_book({"book_id": "BK-9"}): escaped the runtime with CallTimeout: did not finish within 5s',
        'find_title({"title": "River Songs"}): the result does not match `returns` at the result: [\'BK-3\'] is not of type \'string\'',
        'find_title({"title": "No Such Book"}): declared invalid (not_found) but succeeded',
        # count_books's only valid call failed, so no call was seen reading branches
        "table branches: no declared call of any tool reads it; add a tool that looks it up, or drop the table",
    ]
    # lend_book writes before it refuses: the runtime rolls the partial write back, so the check passes it
    assert [t.name for t in tools] == ["list_books", "get_book", "touch_book", "count_books", "lend_book", "return_book",
                                       "wait_for_book", "find_title"]


def test_a_refused_write_is_rolled_back_by_the_runtime(tmp_path, monkeypatch):
    monkeypatch.setattr("envs.spec._inside_sandbox", True)  # run_call runs in the sandboxed child; here, the test's own code
    out = written(tmp_path / "library", {"code": BROKEN, "tools": BROKEN_DECLARED})
    env = load_environment(out)
    refused = run_call(env, "lend_book", {"book_id": "BK-2", "member": "Ada Park"})
    assert (refused.observation.ok, refused.observation.error_code, refused.escaped, refused.changes) == (False, "no_copies", "", ())
    lent = run_call(env, "lend_book", {"book_id": "BK-1", "member": "Ada Park"})
    assert lent.observation.ok and [(c.table, c.key) for c in lent.changes] == [("loans", "L-1")]
    escaped = run_call(env, "return_book", {"book_id": "BK-3"})
    assert escaped.observation is None and escaped.escaped == "SystemExit: bye"
    assert [(c.table, c.key, c.before["copies"], c.after["copies"]) for c in escaped.changes] == [("books", "BK-3", 1, 5)]


def test_cli_builds_an_environment(context, tmp_path, capsys):
    out = tmp_path / "built"
    scripted.register("maker", [LIBRARY, *coded(GOOD_TOOLS), {"tasks": [KEPT]}, ACCEPT])
    scripted.register("solver", [librarian] * 3)
    code = cli.main(["--ledger", context.ledger, "envs", "build", "--theme", THEME, "--model", "scripted:maker",
                     "--solver-model", "scripted:solver", "--solver-harness", "H0", "--task-proposals", "free", "--out", str(out), "--tasks", "1", "--rows", "0", "--pairs", "0", "--json"])
    scripted.assert_consumed()
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (result["status"], result["environment"], result["kept"]) == ("built", "city-library", ["lend-tide-atlas"])
    assert load_environment(out).id == "city-library"
    assert cli.main(["envs", "build", "--theme", THEME, "--out", str(out)]) == 2  # not empty: refused before any model runs


def test_task_pre_checks_name_each_problem(tmp_path):
    out = written(tmp_path / "library", GOOD_TOOLS)
    _, tables, rows = load_database(out)
    tools = EnvInstance(load_environment(out)).public_tools
    draft = TaskDraft.model_validate({
        "id": "Tide", "instruction": "Lend The Tide Atlas to Ada Park; there should be 1 copy left. It may be impossible.",
        "answer": [{"name": "copies_left", "value": 1}, {"name": "title"}],
        "state": [{"table": "loans", "match": {"book": "BK-1"}}], "allowed_writes": ["loans", "members"],
        "forbidden": [{"tool": "delete_loan"}]})
    assert task_problems(draft, tables, rows, tools) == [
        "task Tide: id must be kebab-case",
        "task Tide: state.0.match.book is not a column of loans",
        "task Tide: allowed_writes names 'members', not a table",
        "task Tide: forbidden names 'delete_loan', not a tool",
        "task Tide: the instruction states the answer value copies_left=1",
        "task Tide: answer.1 (title) has no value or any_of",
        "task Tide: the instruction says 'impossible'",
    ]
    assert task_problems(TaskDraft.model_validate(KEPT), tables, rows, tools) == []
    vague = TaskDraft.model_validate({**KEPT, "instruction": "Lend a book to a specific member and tell me how many copies are left."})
    assert task_problems(vague, tables, rows, tools) == [
        "task lend-tide-atlas: the instruction names no record of the database; name the one the user means (a name, a title "
        "or an id from the rows shown), as a user would"]
    # the id is made kebab-case and the check the instruction states dropped, before the pre-checks run
    tidied, notes = tidy_task(draft)
    assert (tidied.id, [c.name for c in tidied.answer], notes) == ("tide", ["title"], ["answer check copies_left=1 dropped: the instruction states it"])
    assert task_problems(tidied, tables, rows, tools)[0] == "task tide: state.0.match.book is not a column of loans"


def test_tasks_that_all_fail_the_pre_checks_are_proposed_again_with_the_problems(context, tmp_path):
    scripted.register("builder", [LIBRARY, *coded(GOOD_TOOLS)])
    scripted.register("proposer", [{"tasks": [UNKNOWN_TABLE]}, {"tasks": [KEPT]}])
    scripted.register("solver", [librarian] * 3)
    scripted.register("reviewer", [ACCEPT])
    final = build(context, tmp_path / "library", max_attempts=2)
    scripted.assert_consumed()
    assert final["kept"] == ["lend-tide-atlas"]
    assert [(d.subject, d.attempt, d.accepted) for d in final["decisions"] if d.step == "task_proposal"] == [
        ("renew-loan", 1, False), ("lend-tide-atlas", 2, True)]
    again = scripted.calls("proposer")[1].messages[0].content
    assert "- task renew-loan: state.0.table 'renewals' is not a table (['books', 'branches', 'loans'])" in again


def test_tasks_that_fail_verification_or_review_are_proposed_again_with_what_went_wrong(context, tmp_path):
    scripted.register("builder", [LIBRARY, *coded(GOOD_TOOLS)])
    scripted.register("proposer", [{"tasks": [LOOSE, KEPT]}, {"tasks": [KEPT]}])
    scripted.register("solver", [librarian] * 9)
    scripted.register("reviewer", [{"reasons": "nobody asks for copies left", "accept": False}, ACCEPT])
    final = build(context, tmp_path / "library", max_attempts=2)
    scripted.assert_consumed()
    assert final["kept"] == ["lend-tide-atlas"]
    assert [(s, n, a, ok) for s, n, a, ok in decisions(final) if s in ("verification", "task_review")] == [
        ("verification", "lend-river-songs", 1, False), ("verification", "lend-tide-atlas", 1, True),
        ("task_review", "lend-tide-atlas", 1, False), ("verification", "lend-tide-atlas", 2, True), ("task_review", "lend-tide-atlas", 2, True)]
    again = scripted.calls("proposer")[1].messages[0].content
    assert "- task lend-river-songs: the verifier accepts a perturbed outcome: writes left out" in again
    assert "- task lend-tide-atlas: a reviewer rejected it: nobody asks for copies left" in again


def test_perturbations_swap_a_text_value_for_another_records_and_change_an_unwritten_table(tmp_path):
    env = load_environment(written(tmp_path / "library", GOOD_TOOLS))
    task = task_spec(TaskDraft.model_validate({**KEPT, "answer": [{"name": "title", "value": "The Tide Atlas"}]}),
                     (ToolCall(tool="lend_book", args={"book_id": "BK-1", "member": "Ada Park"}),), "Lent The Tide Atlas to Ada Park.")
    cases = dict(task_perturbations(env, task))
    assert list(cases) == ["answer without title", "writes left out", "empty answer, no writes",
                           "answer with another title (Mountain Birds)", "an extra change to branches"]
    assert cases["answer with another title (Mountain Birds)"].answer == "Lent Mountain Birds to Ada Park."
    extra = cases["an extra change to branches"].diff.changes
    assert [(c.table, c.key, c.after["name"]) for c in extra if c.table == "branches"] == [("branches", "B1", "Harbor Branch (changed)")]
    check = check_task(env, task)
    assert (check.failures, check.accepted_perturbations) == ((), ())
    assert check.rejected_perturbations == tuple(cases)


def test_a_built_environments_kept_task_becomes_a_certified_pair(context, tmp_path):
    """Theme → database → tools → task → solver → verification → task review → menu → choice → reviews → certified twin."""
    out = tmp_path / "library"
    # a third branch no book is in: a row the reference never shows, which the control edit changes
    library = {**LIBRARY, "tables": [{**BRANCHES, "rows": [*BRANCHES["rows"], {"branch_id": "B3", "name": "Riverside Branch"}]}, BOOKS, LOANS]}
    chosen: dict = {}

    def choose(messages, schema):
        option = schema.model_json_schema()["properties"]["option"]
        options = option.get("enum") or [option["const"]]  # one option left is a constant
        chosen["prompt"] = messages[0].content
        return {"option": options[0], "description": "The book's record is gone.", "requirement": "the book must be on record to be lent"}

    scripted.register("builder", [library, *coded(GOOD_TOOLS)])
    scripted.register("proposer", [{"tasks": [KEPT]}])
    scripted.register("solver", [librarian] * 3)
    scripted.register("chooser", [choose])
    scripted.register("reviewer", [ACCEPT, {"reasons": "the book cannot be lent", "still_possible": False},
                                   {"reasons": "no other tool shows it", "route_found": False}])
    final = build(context, out, tasks=1, pairs=1)
    scripted.assert_consumed()
    assert final["kept"] == ["lend-tide-atlas"] and len(final["pairs_written"]) == 1
    (pair_id,) = final["pairs_written"]
    category = pair_id.split("--")[1].replace("-", "_")
    steps = [(d.step, d.subject, d.accepted) for d in final["decisions"]][-3:]
    assert steps == [("task_review", "lend-tide-atlas", True), ("mutation_menu", "lend-tide-atlas", True), ("pair", pair_id, True)]
    assert final["decisions"][-2].reasons[0].startswith(f"options in {category}")  # the first category its menu offers
    # the twin is a training pair of a catalog environment, and certifies when loaded back
    (entry,) = load_catalog(tmp_path).values()
    assert (entry.pair.id, entry.pair.split, entry.pair.mutation.category, entry.pair.task.id) == (pair_id, "train", category, "lend-tide-atlas")
    assert entry.pair.mutation.requirement == "the book must be on record to be lent"
    assert certify(entry.pair, entry.env).passed
    log = json.loads((out / "construction.json").read_text())
    assert log["pairs"] == [pair_id] and {"mutation_proposer", "semantic_reviewer", "rescue_reviewer"} <= {u["role"] for u in log["usage"]}
    assert KEPT["instruction"] in chosen["prompt"] and "list_books" in chosen["prompt"]
    # construction reads no catalog: no held-out pair's id, request or answer reaches any generation prompt
    prompts = "\n".join(str(m.content) for name in ("builder", "proposer", "chooser", "reviewer") for c in scripted.calls(name) for m in c.messages)
    for e in load_catalog().values():
        if e.pair.split != "train":
            assert e.pair.id not in prompts and e.pair.task.instruction.strip() not in prompts


def test_the_starting_module_runs_and_names_the_table_no_tool_touches(tmp_path):
    out = written(tmp_path / "library", GOOD_TOOLS)
    code, declared = starting_module(out)
    write_tools_module(ToolsDraft(code=code, tools=declared), out)
    problems, tools, _ = asyncio.run(check_tools(out))
    assert problems == ["table loans: empty, and no declared call of any tool reads or writes it"]  # it has no write tool yet
    assert [t.name for t in tools] == ["search_branches", "get_branch", "search_books", "get_book"]
    env = load_environment(out)
    assert [r["title"] for r in EnvInstance(env).call("search_books", {"query": "tide ATLAS"}).output] == ["The Tide Atlas"]
    assert module(code).count("```") == 2 and module_code(module(code)) == code
    assert module_code("no fence, only code\n") == "no fence, only code\n"
    # the write tool the coder is shown is written for this database, and runs as its own declaration says
    example, adding = example_write_tool(out)
    assert example.splitlines()[1] == "def add_loan(db, book_id: str, member: str) -> dict:"
    assert (adding.valid, [(i.args, i.error_code) for i in adding.invalid], adding.changes) == (
        [{"book_id": "BK-1", "member": "example"}], [({"book_id": "NO-SUCH-KEY", "member": "example"}, "not_found")], ["loans"])
    write_tools_module(ToolsDraft(code=code + "\n\n" + example + "\n", tools=[*declared, adding]), out)
    assert asyncio.run(check_tools(out))[0] == []
    lent = run_call(load_environment(out), "add_loan", {"book_id": "BK-2", "member": "Ben Ode"})
    assert lent.observation.output == {"loan_id": "LOA-0001"}


def test_the_example_write_tool_takes_its_optional_arguments_last(tmp_path):
    note = {"name": "note", "type": "text", "nullable": True}
    loans = {**LOANS, "columns": [LOANS["columns"][0], note, *LOANS["columns"][1:]]}  # a nullable column before required ones
    assert write_database(DatabaseDraft.model_validate({**LIBRARY, "tables": [BRANCHES, BOOKS, loans]}), tmp_path, THEME) == []
    example, adding = example_write_tool(tmp_path)
    assert example.splitlines()[1] == "def add_loan(db, book_id: str, member: str, note: str | None = None) -> dict:"
    compile(HEADER + example, "tools.py", "exec")


def test_evolve_envs_takes_a_built_environment_as_parents(context, tmp_path, capsys):
    out = tmp_path / "library"
    assert cli.main(["--ledger", context.ledger, "evolve-envs", "--diagnosis", "x.json", "--from-env", str(out)]) == 2
    assert "no tasks in" in " ".join(capsys.readouterr().err.split())
    written(out, GOOD_TOOLS)
    task_spec_ = task_spec(TaskDraft.model_validate(KEPT), (ToolCall(tool="list_books"), ToolCall(tool="lend_book", args={"book_id": "BK-1", "member": "Ada Park"})),
                           "Lent The Tide Atlas to Ada Park; 1 copy is left.")
    (out / "tasks").mkdir()
    (out / "tasks" / "lend-tide-atlas.yaml").write_text(yaml.safe_dump(task_spec_.model_dump(mode="json", exclude_defaults=True)))
    assert task_ids(out) == ["lend-tide-atlas"]
    parent = load_parent("lend-tide-atlas", out)
    assert (parent.id, parent.env.id, parent.task, parent.env_dir) == ("lend-tide-atlas", "city-library", task_spec_, out)
    assert load_parent("lend-tide-atlas", tmp_path).env_dir == out  # from a directory of environments too
    args = ["--ledger", context.ledger, "evolve-envs", "--diagnosis", "x.json", "--from-env", str(out), "--parents", "renew-loan"]
    assert cli.main(args) == 2 and "renew-loan not a task of" in " ".join(capsys.readouterr().err.split())


def test_a_table_drafted_with_few_rows_gets_more_rows_from_the_builder(context):
    from graphs.construct import _top_up

    def branches(messages, schema):
        assert "Harbor Branch" in messages[0].content and "Write 6 more rows" in messages[0].content
        return {"rows": [{"branch_id": "B1", "name": "Taken Key"}, {"branch_id": "B3", "name": "Riverside Branch"}]}

    def books(messages, schema):
        # a reference is one of the keys the referenced table has now, the new one included: the grammar's enum
        assert schema.model_json_schema()["$defs"]["BooksRow"]["properties"]["branch_id"]["enum"] == ["B1", "B2", "B3"]
        return {"rows": [{"book_id": "BK-4", "title": "Salt Roads", "branch_id": "B3", "copies": 4}]}

    scripted.register("builder", [branches, books])
    draft, usage = asyncio.run(_top_up(DatabaseDraft.model_validate(LIBRARY), THEME, context))
    scripted.assert_consumed()
    rows = {t.name: [r[t.primary_key] for r in t.rows] for t in draft.tables}
    assert rows == {"branches": ["B1", "B2", "B3"], "books": ["BK-1", "BK-2", "BK-3", "BK-4"], "loans": []}  # a taken key is dropped
    assert [u.role for u in usage] == ["environment_builder", "environment_builder"]


def test_the_database_grows_with_rows_and_names_the_builder_adds(context, tmp_path):
    out = tmp_path / "library"
    good = json.loads(json.dumps(GOOD_TOOLS).replace("BK-9", "BK-999"))  # BK-9 exists once the books grow
    more_branches = {"rows": [{"branch_id": "B3", "name": "Riverside Branch"}, {"branch_id": "B4", "name": "Old Town Branch"}]}
    more_books = {"rows": [{"book_id": "BK-4", "title": "Salt Roads", "branch_id": "B3", "copies": 3}]}
    # names come in rounds of one per initial letter, the names so far shown as taken; a name taken already is dropped
    words = ["Amber", "Birch", "Cedar", "Dune", "Ember", "Fern", "Glass", "Harbor", "Iron", "Juniper", "Kestrel", "Lantern", "Marble",
             "Night", "Opal", "Pine", "Raven", "Salt", "Thistle", "Willow"]
    titles = {f"title_{w[0].lower()}": f"{w} Tides" for w in words} | {"title_r": "River Songs"}  # River Songs is a book already
    branch_names = {f"name_{w[0].lower()}": f"{w} Branch" for w in words}
    scripted.register("builder", [LIBRARY, more_branches, more_books, *[branch_names] * 4, *[titles] * 4, *coded(good)])
    scripted.register("proposer", [{"tasks": []}])
    final = build(context, out, rows=30, max_attempts=1)
    scripted.assert_consumed()
    assert final["decisions"][0].reasons == (
        "3 tables, 46 rows (8 written; branches: 4 written, grown to 23 (no new name left to make); "  # Harbor Branch is taken
        "books: 4 written, grown to 23 (no new title left to make)); types, keys and references check",)
    calls = scripted.calls("builder")
    assert [c.schema.__name__ if c.schema else "module" for c in calls] == [
        "DatabaseDraft", "MoreRows", "MoreRows", *["Names"] * 8, "module", "ToolDeclarations"]
    assert list(calls[7].schema.model_json_schema()["properties"]) == [f"title_{c.lower()}" for c in "ABCDEFGHIJKLMNOPRSTW"]
    assert "- The Tide Atlas" in calls[7].messages[0].content and "- Amber Tides" in calls[8].messages[0].content  # taken, round 2
    env = load_environment(out)
    assert sorted(r["title"] for r in env.rows["books"][4:]) == sorted(v for v in titles.values() if v != "River Songs")  # each once
    assert {r["branch_id"] for r in env.rows["books"]} <= {r["branch_id"] for r in env.rows["branches"]}


def test_tools_that_change_nothing_are_sent_back(context, tmp_path):
    scripted.register("builder", [LIBRARY, module(HEADER + LIST_BOOKS), by_name(DECLARED[:1])])
    final = build(context, tmp_path / "library", max_attempts=1)
    scripted.assert_consumed()
    assert decisions(final)[-1] == ("tools", "city-library", 1, False)
    assert final["decisions"][-1].reasons[-1] == "no tool changes state: add the @write_tool functions this environment needs"


def test_seeds_are_write_calls_that_succeed_on_records_like_the_declared_ones_with_the_checks_their_outcome_implies(tmp_path):
    out = written(tmp_path / "library", GOOD_TOOLS)  # lend_book is declared on BK-1; BK-2 has no copy to lend
    seeds = asyncio.run(sandboxed_seeds(out, 3, 1))
    assert [s.args for s in seeds] == [{"book_id": "BK-3", "member": "Ada Park"}, {"book_id": "BK-1", "member": "Ada Park"}]
    assert seeds[0] == TaskSeed(
        tool="lend_book", description="Lends a copy of a book to a member.", args={"book_id": "BK-3", "member": "Ada Park"},
        named=(Named(arg="book_id", table="books", key="BK-3", label="River Songs"),), details={"member": "Ada Park"},
        answer=(AnswerCheck(name="loan_id", value="L-1"), AnswerCheck(name="copies_left", value=0)),
        state=(StateCheck(table="books", match={"book_id": "BK-3", "copies": 0}),
               StateCheck(table="books", match={"book_id": "BK-3", "copies": 1}, absent=True),
               StateCheck(table="loans", match={"book_id": "BK-3", "member": "Ada Park"})),
        tables=("books", "loans"))
    lent = tmp_path / "lent"  # a book already on loan is not lent again while another can be
    loans = {**LOANS, "rows": [{"loan_id": "L-1", "book_id": "BK-3", "member": "Ben Ode"}]}
    assert write_database(DatabaseDraft.model_validate({**LIBRARY, "tables": [BRANCHES, BOOKS, loans]}), lent, THEME) == []
    write_tools_module(ToolsDraft.model_validate(GOOD_TOOLS), lent)
    assert [s.args for s in asyncio.run(sandboxed_seeds(lent, 3, 1))] == [{"book_id": "BK-1", "member": "Ada Park"}]
    read_only = json.loads(json.dumps(GOOD_TOOLS).replace('"read_only": false', '"read_only": true'))
    assert asyncio.run(sandboxed_seeds(written(tmp_path / "reading", read_only), 3, 1)) == []  # no write tool, no seed


def lender(messages, tools):
    """A solver policy for any request: the book whose title it names, lent to the member it names."""
    request = next(m.content for m in messages if isinstance(m, HumanMessage))
    results = [json.loads(m.content) for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return {"tool_calls": [{"name": "list_books", "args": {}}]}
    if len(results) == 1:
        book = next(b for b in results[0] if b["title"] in request)
        member = "Ada Park" if "Ada Park" in request else "Ben Ode"
        return {"tool_calls": [{"name": "lend_book", "args": {"book_id": book["book_id"], "member": member}}]}
    return f"Done: loan {results[1]['loan_id']}, {results[1]['copies_left']} copies left."


def test_a_menu_task_is_a_seed_whose_request_the_writer_words_and_words_again_with_what_it_lacked(context, tmp_path):
    out = tmp_path / "library"
    scripted.register("builder", [LIBRARY, *coded(GOOD_TOOLS)])
    scripted.register("proposer", [{"instruction": "Please lend me River Songs and tell me the loan id and the copies left."},
                                   {"instruction": "Please lend River Songs to Ada Park and tell me the loan id and the copies left."}])
    scripted.register("solver", [lender] * 3)
    # the reviewer reads what the request asks to have done and to be told, from the write tools and the values
    scripted.register("reviewer", [{"reasons": "lend a book; the loan and the copies left",
                                    "wants_done": ["lend_book: Lends a copy of a book to a member."], "wants_told": ["loan_id", "copies_left"]}])
    final = build(replace(context, task_proposals="menu"), out, tasks=1)
    scripted.assert_consumed()
    assert final["kept"] == ["lend-book-river-songs"]
    review = next(d for d in final["decisions"] if d.step == "task_review")
    assert review.reasons == ("lend a book; the loan and the copies left (read as its task checks)",)
    schema = scripted.calls("reviewer")[0].schema.model_json_schema()
    assert schema["properties"]["wants_done"]["items"]["enum"] == ["lend_book: Lends a copy of a book to a member.", "nothing of these"]
    assert schema["properties"]["wants_told"]["items"]["enum"] == ["loan_id", "copies_left", "book_id", "title", "branch_id", "copies",
                                                                   "member", "nothing of these"]
    prompts = [c.messages[0].content for c in scripted.calls("proposer")]
    assert "- the book 'River Songs'" in prompts[0] and '- member: "Ada Park"' in prompts[0]
    assert "- the request does not give the member Ada Park" in prompts[1].split("to fix:")[1]
    assert not any(s in p for p in prompts for s in ("L-1", "copies_left: 0", "match"))  # nor the values to be told, nor the rules
    task = yaml.safe_load((out / "tasks" / "lend-book-river-songs.yaml").read_text())
    assert task["instruction"] == "Please lend River Songs to Ada Park and tell me the loan id and the copies left."
    assert task["answer"] == [{"name": "loan_id", "value": "L-1"}, {"name": "copies_left", "value": 0}]
    assert [c["table"] for c in task["state"]] == ["books", "books", "loans"] and task["allowed_writes"] == ["books", "loans"]
    assert task["reference"]["calls"] == [{"tool": "list_books"}, {"tool": "lend_book", "args": {"book_id": "BK-3", "member": "Ada Park"}}]


def test_a_request_that_leaves_out_the_values_of_its_call_gets_them_added_and_its_id_names_its_records():
    seed = TaskSeed(tool="add_rental", description="Records a rental.", args={"user_id": 17, "bike_id": 42, "start": "2023-10-05", "days": 3},
                    named=(Named(arg="user_id", table="users", key=17, label="Mila Clark"), Named(arg="bike_id", table="bikes", key=42)),
                    details={"start": "2023-10-05", "days": 3}, answer=(AnswerCheck(name="rental_id", value=201),))
    assert seed_task_id(seed) == "add-rental-mila-clark-bikes-42"
    request = "Please rent bike 42 to Mila Clark from October 5, 2023 and give me the rental id."
    assert request_problems(request, seed) == ["the request does not give the days 3"]
    assert with_details(request, seed) == (f"{request} The days is 3.", ["The days is 3."])
    assert request_problems(with_details(request, seed)[0], seed) == []
    assert request_problems("Rent a bike to Mila for 3 days from 2023-10-05; the rental id will be 201.", seed) == [
        "the request does not name 'Mila Clark'; name it exactly so", "the request does not give the bike id 42",
        "the request gives away the rental id (201); ask for it instead"]
