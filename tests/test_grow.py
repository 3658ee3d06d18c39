"""Growing a drafted database from its own rows: sizes, key shapes, references,
dates moved together, identifying values new and unique, categorical values
kept, seeded, and a table that stops when its values run out."""

import datetime as dt

from envs.construct import add_implied_references, add_missing_keys, allow_missing, coerce_rows, database_problems, drop_loose_references, write_database
from envs.grow import grow, naming_columns
from envs.spec import load_database
from state.construction import DatabaseDraft

MEMBERS = {"name": "members", "primary_key": "member_id",
           "columns": [{"name": "member_id", "type": "text"}, {"name": "full_name", "type": "text"},
                       {"name": "email", "type": "text"}, {"name": "status", "type": "text"}, {"name": "joined", "type": "text"}],
           "rows": [{"member_id": "M-0001", "full_name": "Ada Park", "email": "ada.park@citylib.org", "status": "active", "joined": "2024-02-11"},
                    {"member_id": "M-0002", "full_name": "Omar Haddad", "email": "omar.haddad@citylib.org", "status": "suspended",
                     "joined": "2023-09-30"},
                    {"member_id": "M-0003", "full_name": "Lina Costa", "email": "lina.costa@citylib.org", "status": "active", "joined": "2025-01-05"}]}
TITLES = {"name": "titles", "primary_key": "title_id",
          "columns": [{"name": "title_id", "type": "integer"}, {"name": "title", "type": "text"}, {"name": "pages", "type": "integer"},
                      {"name": "price", "type": "real"}],
          "rows": [{"title_id": 1, "title": "The Tide Atlas", "pages": 320, "price": 18.5},
                   {"title_id": 2, "title": "Mountain Birds", "pages": 180, "price": 24.0}]}
LOANS = {"name": "loans", "primary_key": "loan_id",
         "columns": [{"name": "loan_id", "type": "text"}, {"name": "member_id", "type": "text", "references": "members.member_id"},
                     {"name": "title_id", "type": "integer", "references": "titles.title_id"}, {"name": "lent", "type": "text"},
                     {"name": "due", "type": "text"}, {"name": "returned", "type": "boolean"}, {"name": "note", "type": "text", "nullable": True}],
         "rows": [{"loan_id": "LN-88", "member_id": "M-0001", "title_id": 1, "lent": "2025-03-01", "due": "2025-03-15", "returned": False,
                   "note": None},
                  {"loan_id": "LN-89", "member_id": "M-0003", "title_id": 2, "lent": "2025-02-10", "due": "2025-03-10", "returned": True,
                   "note": "renewed once"}]}
DRAFT = {"id": "city-library", "description": "Members, titles and loans on 2025-03-20.", "tables": [LOANS, MEMBERS, TITLES]}


NAMES = {("titles", "title"): ["Salt Roads", "The Tide Atlas", "Night Ferries", "Mountain", "Night Ferries"]}


def grown(target=200, seed=7):
    draft = DatabaseDraft.model_validate(DRAFT)
    tables, notes = grow(draft.tables, target, seed, NAMES)
    return draft, {t.name: t.rows for t in tables}, notes


def test_tables_grow_from_their_rows_with_keys_references_and_dates_that_hold():
    draft, rows, notes = grown()
    assert {n: len(r) for n, r in rows.items()} == {"loans": 200, "members": 200, "titles": 4}
    assert notes == ["members: 3 written, grown to 200", "titles: 2 written, grown to 4 (no new title left to make)",
                     "loans: 2 written, grown to 200"]
    # titles come from the builder's names, each once, none taken or part of one taken ("Mountain" of "Mountain Birds")
    assert sorted(r["title"] for r in rows["titles"][2:]) == ["Night Ferries", "Salt Roads"]
    assert naming_columns(draft.tables) == [("titles", "title")]  # not a person's name, an email or a number
    assert [t.name for t in draft.tables] == ["loans", "members", "titles"]  # the draft's order, references grown first
    for table in draft.tables:
        assert rows[table.name][: len(table.rows)] == table.rows  # the written rows come first, as written
    assert [r["member_id"] for r in rows["members"]] == [f"M-{i:04d}" for i in range(1, 201)]
    assert [r["loan_id"] for r in rows["loans"]][:4] == ["LN-88", "LN-89", "LN-90", "LN-91"]
    assert [r["title_id"] for r in rows["titles"]] == [1, 2, 3, 4]
    members, titles = {r["member_id"] for r in rows["members"]}, {r["title_id"] for r in rows["titles"]}
    assert {r["member_id"] for r in rows["loans"]} <= members and {r["title_id"] for r in rows["loans"]} <= titles
    assert len({r["member_id"] for r in rows["loans"]}) > 50  # drawn from the grown members, not the three written
    day = dt.date.fromisoformat
    assert {(day(r["due"]) - day(r["lent"])).days for r in rows["loans"]} == {14, 28}  # one shift per row: each loan keeps its term
    assert {(r["returned"], r["note"]) for r in rows["loans"]} == {(False, None), (True, "renewed once")}  # flags and nulls ride along
    assert {r["status"] for r in rows["members"]} == {"active", "suspended"}
    for column in ("full_name", "email"):
        values = [r[column].casefold() for r in rows["members"]]
        assert len(set(values)) == 200 and not any(a != b and a in b for a in values for b in values)
    assert all(r["email"].endswith("@citylib.org") and r["full_name"].count(" ") == 1 for r in rows["members"])
    assert len({r["full_name"].split()[0] for r in rows["members"]}) > 20  # person names from the built-in list, not only three
    assert all(180 <= r["pages"] <= 320 and 18.5 <= r["price"] <= 24.0 for r in rows["titles"])


def test_growth_is_seeded_and_the_result_loads(tmp_path):
    draft, rows, _ = grown()
    assert grown()[1] == rows and grown(seed=8)[1] != rows
    tables = [t.model_copy(update={"rows": rows[t.name]}) for t in draft.tables]
    assert write_database(draft.model_copy(update={"tables": tables}), tmp_path / "lib", "a city library") == []
    assert sum(len(r) for r in load_database(tmp_path / "lib")[2].values()) == 404
    assert grown(target=2)[2] == []  # nothing below the target: no table grows


def test_a_database_with_secrets_or_a_self_reference_is_refused():
    members = {**MEMBERS, "columns": [*MEMBERS["columns"], {"name": "password_hash", "type": "text"},
                                      {"name": "sponsor", "type": "text", "references": "members.sponsor"}]}
    draft = DatabaseDraft.model_validate({**DRAFT, "tables": [members]})
    assert database_problems(draft) == [
        "tables.members.columns.password_hash: an environment holds no secrets (passwords, tokens, card numbers); drop the column",
        "tables.members.columns.sponsor: refers to itself; a reference names another column",
    ]


def test_a_reference_that_names_no_column_is_dropped():
    status = {"name": "status", "type": "text", "references": "string: 'active', 'suspended'"}
    members = {**MEMBERS, "columns": [*MEMBERS["columns"][:3], status, MEMBERS["columns"][4]]}
    draft, notes = drop_loose_references(DatabaseDraft.model_validate({**DRAFT, "tables": [LOANS, members, TITLES]}))
    assert notes == ["tables.members.columns.status: reference \"string: 'active', 'suspended'\" names no column; dropped"]
    assert [c.references for c in draft.tables[1].columns] == [None] * 5
    assert [c.references for c in draft.tables[0].columns][1:3] == ["members.member_id", "titles.title_id"]  # real ones stay


def test_a_primary_key_left_out_of_the_columns_is_added_from_the_rows_or_counted():
    members = {**MEMBERS, "columns": MEMBERS["columns"][1:]}  # member_id declared, not a column; the rows carry it
    titles = {**TITLES, "columns": TITLES["columns"][1:], "rows": [{k: v for k, v in r.items() if k != "title_id"} for r in TITLES["rows"]]}
    draft, notes = add_missing_keys(DatabaseDraft.model_validate({**DRAFT, "tables": [LOANS, members, titles]}))
    assert notes == ["tables.members.primary_key: 'member_id' named no column; added as a column of type text",
                     "tables.titles.primary_key: 'title_id' named no column; added as a column of type integer, the rows numbered from 1"]
    assert draft.model_dump() == DatabaseDraft.model_validate(DRAFT).model_dump()  # LOANS' references hold again
    draft, notes = drop_loose_references(draft)
    assert notes == [] and database_problems(draft) == []


def test_a_reference_a_column_is_named_typed_and_filled_as_is_added():
    bare = [{k: v for k, v in c.items() if k != "references"} for c in LOANS["columns"]]
    loans = {**LOANS, "columns": bare}
    draft, notes = add_implied_references(DatabaseDraft.model_validate({**DRAFT, "tables": [loans, MEMBERS, TITLES]}))
    assert draft.model_dump() == DatabaseDraft.model_validate(DRAFT).model_dump()
    assert notes == ["tables.loans.columns.member_id: refers to members.member_id (named and typed as its key; every value is one)",
                     "tables.loans.columns.title_id: refers to titles.title_id (named and typed as its key; every value is one)"]
    # a value that is no key, or a type that differs, implies nothing
    stray = {**loans, "rows": [{**LOANS["rows"][0], "member_id": "M-9999"}, {**LOANS["rows"][1], "title_id": None}]}
    other = {**loans, "columns": [*bare[:2], {"name": "title_id", "type": "text"}, *bare[3:]],
             "rows": [{**r, "title_id": str(r["title_id"])} for r in LOANS["rows"]]}
    for table, references in ((stray, [None, "titles.title_id"]), (other, ["members.member_id", None])):
        draft, _ = add_implied_references(DatabaseDraft.model_validate({**DRAFT, "tables": [table, MEMBERS, TITLES]}))
        assert [c.references for c in draft.tables[0].columns][1:3] == references


def test_a_column_some_rows_leave_empty_is_made_nullable():
    loans = {**LOANS, "rows": [{k: v for k, v in LOANS["rows"][0].items() if k != "due"}, {**LOANS["rows"][1], "lent": None}]}
    draft, notes = allow_missing(DatabaseDraft.model_validate({**DRAFT, "tables": [loans, MEMBERS, TITLES]}))
    assert notes == ["tables.loans.columns.lent: no value in 1 of 2 rows; made nullable",
                     "tables.loans.columns.due: no value in 1 of 2 rows; made nullable"]
    assert [c.name for c in draft.tables[0].columns if c.nullable] == ["lent", "due", "note"]
    assert database_problems(draft) == [] and allow_missing(DatabaseDraft.model_validate(DRAFT))[1] == []


def test_values_of_another_type_with_one_reading_are_converted():
    titles = {**TITLES, "rows": [{"title_id": "1", "title": 1984, "pages": 320, "price": 18}, {**TITLES["rows"][1], "pages": "many"}]}
    draft, notes = coerce_rows(DatabaseDraft.model_validate({**DRAFT, "tables": [titles]}))
    assert draft.tables[0].rows == [{"title_id": 1, "title": "1984", "pages": 320, "price": 18.0}, {**TITLES["rows"][1], "pages": "many"}]
    assert notes == [f"tables.titles.columns.{c}: values of another type converted" for c in ("price", "title", "title_id")]


def test_single_words_that_repeat_are_kept_from_the_templates_but_first_names_are_drawn():
    bikes = {"name": "bikes", "primary_key": "bike_id",
             "columns": [{"name": "bike_id", "type": "integer"}, {"name": "brand", "type": "text"}, {"name": "rider", "type": "text"}],
             "rows": [{"bike_id": 1, "brand": "Trek", "rider": "Ada"}, {"bike_id": 2, "brand": "Giant", "rider": "Omar"}]}
    (table,), notes = grow(DatabaseDraft.model_validate({**DRAFT, "tables": [bikes]}).tables, 50, 1)
    assert notes == ["bikes: 2 written, grown to 50"]
    assert {r["brand"] for r in table.rows} == {"Trek", "Giant"} and len({r["rider"] for r in table.rows}) > 10
