from envs.answers import cut, spans, states
from state.records import AnswerCheck


def check(value, **kw):
    return AnswerCheck(name="v", value=value, **kw)


TEXT = "Station KCQT (Los Angeles Downtown USC) is 5.4 km away; 93°F on August 1, 2026; $1,250.50 due; 40% rain."


def test_numbers_with_units_separators_and_tolerance():
    assert states(TEXT, check(5.4)) and states(TEXT, check(1250.5)) and states(TEXT, check(40))
    assert states(TEXT, check(5.38, tolerance=0.05)) and not states(TEXT, check(5.3))
    assert not states(TEXT, check(250.5))


def test_dates_in_written_forms():
    assert states(TEXT, check("2026-08-01"))
    assert states("due 08/01/2026", check("2026-08-01")) and states("due 1 Aug 2026", check("2026-08-01"))
    assert not states(TEXT, check("2026-08-02"))
    assert states("delivered on 2026-08-01T12:43:00-05:00.", check("2026-08-01"))  # the date of a timestamp
    assert not states("order 2026-08-01X", check("2026-08-01")) and not states("ref 12026-08-01", check("2026-08-01"))


def test_text_is_whole_word_and_case_insensitive():
    assert states(TEXT, check("kcqt")) and states(TEXT, check("los angeles downtown usc"))
    assert not states(TEXT, check("KCQ"))
    assert states("status: Canceled", check(None, any_of=("cancelled", "canceled")))


def test_cut_removes_every_mention():
    found = spans("KCQT then KCQT", check("KCQT"))
    assert cut("KCQT then KCQT", found) == "[omitted] then [omitted]"
