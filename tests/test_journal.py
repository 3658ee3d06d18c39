"""The call journal: a resumed scope reads back the calls it made, in order; a fresh scope is looked up once, not
call by call; a journal written before scopes were kept is still read back."""

import asyncio
import json
import threading

import pytest

from state import journal


@pytest.fixture(params=["sqlite", "postgres"])
def lookups(request, tmp_path, monkeypatch) -> list[str]:
    """A journal of its own (a runs root, or a new PostgreSQL database); the keys looked up one by one."""
    monkeypatch.setenv("HERA_RUNS", str(tmp_path / "runs"))
    if request.param == "postgres":
        monkeypatch.setenv("HERA_STORE", request.getfixturevalue("postgres_url"))
    else:
        monkeypatch.delenv("HERA_STORE", raising=False)
    seen, read = [], journal._read
    monkeypatch.setattr(journal, "_read", lambda key: seen.append(key) or read(key))
    monkeypatch.setattr(journal, "_legacy", {})
    return seen


def episode(scope: str, requests: list[dict], made: list[dict]) -> list[dict]:
    """The replies to `requests` made in `scope`, in a context of their own (as an episode's); each call made is logged."""

    async def run() -> list[dict]:
        replies = []
        with journal.call_scope(scope):
            for request in requests:
                async def call(request=request) -> dict:
                    made.append(request)
                    return {"reply": len(made)}
                replies.append(await journal.journaled(request, call, json.dumps, json.loads))
        return replies

    return asyncio.run(run())


REQUESTS = [{"q": "a"}, {"q": "b"}, {"q": "a"}]  # the same request twice: two calls, in order


def test_a_fresh_scope_is_looked_up_once_and_a_resumed_one_reads_its_calls_back(lookups):
    made = []
    first = episode("run-1/episode:x", REQUESTS, made)
    assert first == [{"reply": 1}, {"reply": 2}, {"reply": 3}] and len(made) == 3
    assert lookups == []  # the journal held nothing of the scope: no call was looked up
    assert episode("run-1/episode:x", REQUESTS + [{"q": "c"}], made) == first + [{"reply": 4}]  # resumed: 3 read back, 1 new
    assert len(made) == 4 and len(lookups) == 4
    assert episode("run-1/episode:y", REQUESTS, made) == [{"reply": 5}, {"reply": 6}, {"reply": 7}]  # another scope: its own calls


def test_a_journal_from_before_scopes_were_kept_is_read_back(lookups):
    made = []
    first = episode("run-1/episode:x", REQUESTS, made)
    journal.flush()
    db, _ = journal._db()
    db.execute("delete from scopes", [])  # as a journal written before: calls, no scopes
    journal._legacy.clear()
    assert episode("run-1/episode:x", REQUESTS, made) == first and len(made) == 3


def test_the_calls_of_one_scope_share_what_it_knows_across_the_contexts_of_graph_nodes(lookups, monkeypatch):
    """An episode's graph runs each node in a copy of the episode's context: its scope is looked up once, and the same
    request made again in a later node is a call of its own, not the earlier one read back."""
    holds, made = [], []
    monkeypatch.setattr(journal, "_holds", lambda scope, holds_=journal._holds: holds.append(scope) or holds_(scope))

    async def node(request: dict) -> dict:
        async def call() -> dict:
            made.append(request)
            return {"reply": len(made)}
        return await journal.journaled(request, call, json.dumps, json.loads)

    async def run() -> list[dict]:
        with journal.call_scope("run-1/episode:z"):
            return [await asyncio.create_task(node(r)) for r in REQUESTS]  # a task copies the context, as a node does

    assert asyncio.run(run()) == [{"reply": 1}, {"reply": 2}, {"reply": 3}]
    assert holds == ["run-1/episode:z"] and lookups == []


def test_a_scope_looked_up_ahead_makes_no_look_of_its_own_and_still_reads_its_calls_back(lookups, monkeypatch):
    """`look_ahead` (an evaluation's claim trip) answers the scope's first look: a fresh scope makes its calls, a
    resumed one reads them back, and neither asks the journal again; a look is used once."""
    holds, made = [], []
    monkeypatch.setattr(journal, "_holds", lambda scope, holds_=journal._holds: holds.append(scope) or holds_(scope))
    journal.look_ahead("run-3/episode:a")
    first = episode("run-3/episode:a", REQUESTS, made)
    assert len(made) == 3 and holds == ["run-3/episode:a"]  # the look ahead's, and no other
    journal.look_ahead("run-3/episode:a")  # resumed: this look waits for the replies queued and finds them
    assert episode("run-3/episode:a", REQUESTS, made) == first and len(made) == 3
    assert holds == ["run-3/episode:a"] * 2 and len(lookups) == 3
    assert episode("run-3/episode:a", REQUESTS, made) == first and len(holds) == 3  # no look ahead: one of its own


def test_a_request_names_its_items_as_their_plain_list_would():
    """`Items` (messages, tools written once per object) leaves the name of a call what the whole request's JSON made it."""
    from langchain_core.messages import AIMessage, HumanMessage, message_to_dict

    messages = [HumanMessage("What does the drill cost?"), AIMessage("", tool_calls=[{"name": "get_item", "args": {"sku": "D"}, "id": "1"}])]
    tools = [{"name": "get_item", "schema": {"b": 1, "a": [2, None]}}]
    request = {"spec": "scripted:a", "method": "complete", "messages": journal.Items(messages, message_to_dict),
               "tools": journal.Items(tools, dict), "max_tokens": None, "temperature": 0.2, "note": "\u00e9\0"}
    plain = {**request, "messages": [message_to_dict(m) for m in messages], "tools": tools}
    expected = journal.hashlib.sha256(json.dumps(["run/episode:e", plain], sort_keys=True, default=str).encode()).hexdigest()
    assert journal._digest("run/episode:e", request) == expected
    assert journal._digest("run/episode:e", request) == expected  # the second time from the kept item texts
    messages.append(HumanMessage("and the saw?"))
    assert journal._digest("run/episode:e", request) != expected


def kept(prefix: str) -> tuple[list[str], list[dict]]:
    """The scopes the journal's table holds that start with `prefix`, and the replies it holds."""
    db, _ = journal._db()
    return [r["id"] for r in db.select("scopes") if r["id"].startswith(prefix)], sorted((json.loads(r["reply"]) for r in db.select("calls")), key=str)


def test_a_scopes_first_look_waits_for_the_replies_queued_before_it(lookups, monkeypatch):
    """The writer is held back: the replies are not in the table yet, and a resumed scope's first look waits for them
    rather than make the scope's calls again."""
    let_go, write = threading.Event(), journal._write
    monkeypatch.setattr(journal, "_write", lambda target, items: let_go.wait(10) and write(target, items))
    made = []
    first = episode("run-2/episode:q", REQUESTS, made)
    assert kept("run-2/") == ([], [])  # nothing written yet
    threading.Timer(0.2, let_go.set).start()
    assert episode("run-2/episode:q", REQUESTS, made) == first and len(made) == 3  # waited, then read back
    assert kept("run-2/") == (["run-2/episode:q"], first)


def test_a_journal_that_cannot_be_written_warns_and_costs_only_the_replay(lookups, monkeypatch, caplog):
    def broken(target, items):
        raise OSError("disk full")

    monkeypatch.setattr(journal, "_write", broken)
    made = []
    assert episode("run-3/episode:w", REQUESTS, made) == [{"reply": 1}, {"reply": 2}, {"reply": 3}]
    journal.flush()
    assert "3 replies not kept (OSError: disk full)" in caplog.text
    assert episode("run-3/episode:w", REQUESTS, made) == [{"reply": 4}, {"reply": 5}, {"reply": 6}]  # made again: none kept
