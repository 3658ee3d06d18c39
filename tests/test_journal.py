"""The call journal: a resumed scope reads back the calls it made, in order; a fresh scope is looked up once, not
call by call; a journal written before scopes were kept is still read back."""

import asyncio
import json

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
    db, _ = journal._db()
    db.execute("delete from scopes", [])  # as a journal written before: calls, no scopes
    journal._legacy.clear()
    assert episode("run-1/episode:x", REQUESTS, made) == first and len(made) == 3
