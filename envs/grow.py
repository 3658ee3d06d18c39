"""Growing a drafted database to a realistic size from its own rows (HERA
App. B.1 "State construction", for a model that can write a few rows well
but not hundreds).

Each table the builder gave at least two rows is grown, seeded, to a target
size by using its rows as templates: a new row copies a random template and
then takes the next key in the keys' own shape, a reference drawn from the
referenced table's (grown) keys, every date of the row moved by one shared
offset (so a loan still falls due after it was made), numbers drawn within
the range the templates span, and each identifying text (a name, a title, a
phone number: a column whose written values are all distinct) made anew and
unique in its column: spelled from the row's new value of another when the
written rows do so (an email from a name), else by recombining the words the column's rows use at each
position, person names from a built-in list when the column holds them, and
fresh digits of the same length (a value that contains another, or is part
of one, is not new). Categorical values, flags and nulls stay the
template's, which keeps their mix and their pairing with other columns. A
table stops growing when its identifying values run out of new combinations.
"""

from __future__ import annotations

import datetime as dt
import random
import re

from state.construction import ColumnDraft, TableDraft

MAX_TRIES = 40  # draws of a row from a template before the template is set aside
SHIFT_DAYS = 365
_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})(T[\d:.]+Z?)?$")
_TOKEN = re.compile(r"[A-Za-z]+|\d+|[^A-Za-z\d]+")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'-]*")
_PERSON = re.compile(r"(first|last|full|given|family|middle)_?name|surname|author|member|patron|customer|client|owner|guest|contact|"
                     r"person|instructor|teacher|student|doctor|patient|driver|employee|staff|passenger|tenant|borrower|rider|user", re.I)
_LAST = re.compile(r"last|family|surname", re.I)
FIRST = ("Ada", "Alan", "Amara", "Ana", "Ben", "Carla", "Chen", "Dara", "David", "Elena", "Emma", "Farah", "Felix", "Grace",
         "Hana", "Hugo", "Ines", "Ivan", "Jamal", "Jana", "Jonas", "Kai", "Kofi", "Lara", "Leo", "Lina", "Luis", "Maya", "Mei",
         "Mila", "Nadia", "Noah", "Nora", "Omar", "Oscar", "Priya", "Rafael", "Rosa", "Sami", "Sara", "Tariq", "Tomas", "Uma",
         "Vera", "Wei", "Yara", "Yusuf", "Zoe", "Alice", "Bob", "John", "Mary", "James", "Linda", "Robert", "Sofia", "Daniel",
         "Laura", "Michael", "Anna", "Peter", "Julia", "Mark", "Olivia", "Paul", "Emily", "Sam", "Hannah", "Eric", "Chloe")
LAST = ("Abe", "Alvarez", "Brooks", "Carter", "Chen", "Costa", "Diaz", "Dubois", "Evans", "Fischer", "Garcia", "Gupta",
        "Haddad", "Hansen", "Ito", "Jensen", "Kaur", "Kim", "Kowalski", "Lee", "Lopez", "Martin", "Meyer", "Mensah", "Moreau",
        "Nakamura", "Novak", "Okafor", "Olsen", "Park", "Patel", "Perez", "Quinn", "Rossi", "Santos", "Schmidt", "Silva",
        "Singh", "Smith", "Suzuki", "Tanaka", "Torres", "Nguyen", "Walker", "Weber", "Wright", "Yilmaz", "Young", "Zhang",
        "Johnson", "Brown", "Miller", "Davis", "Wilson", "Taylor", "Thomas", "Moore", "Clark", "Lewis", "Hall", "Allen")


def grow(tables: list[TableDraft], target: int, seed: int,
         vocabulary: dict[tuple[str, str], list[str]] | None = None) -> tuple[list[TableDraft], list[str]]:
    """The tables with every templated table grown to `target` rows (the written rows first, kept as they are),
    and one note per grown table saying how far it grew and, when it stopped short, why. `vocabulary` gives, by
    (table, column), the values a naming column (see `naming_columns`) takes in new rows, each once."""
    rng = random.Random(seed)
    vocabulary = vocabulary or {}
    keys = {t.name: [r.get(t.primary_key) for r in t.rows] for t in tables}
    grown, notes = {}, []
    for table in referenced_first(tables):
        rows = list(table.rows)
        if len(rows) >= 2 and len(rows) < target:
            words = {c: list(v) for (t, c), v in vocabulary.items() if t == table.name}
            rows, stop = _grow_table(table, rows, target, keys, rng, words)
            keys[table.name] = [r.get(table.primary_key) for r in rows]
            notes.append(f"{table.name}: {len(table.rows)} written, grown to {len(rows)}" + (f" ({stop})" if stop else ""))
        grown[table.name] = table.model_copy(update={"rows": rows})
    return [grown[t.name] for t in tables], notes


def referenced_first(tables: list[TableDraft]) -> list[TableDraft]:
    by_name, done, order = {t.name: t for t in tables}, set(), []

    def visit(table: TableDraft, path: frozenset) -> None:
        if table.name in done or table.name in path:
            return
        for c in table.columns:
            parent = (c.references or "").split(".")[0]
            if parent in by_name and parent != table.name:
                visit(by_name[parent], path | {table.name})
        done.add(table.name)
        order.append(table)

    for t in tables:
        visit(t, frozenset())
    return order


def naming_columns(tables: list[TableDraft]) -> list[tuple[str, str]]:
    """(table, column) of each identifying column of a table that grows whose values are names of things, several
    words long (a title, a product): recombined words would read as nonsense, so new ones are asked of the builder."""
    found = []
    for table in tables:
        if len(table.rows) < 2:
            continue
        for c in table.columns:
            values = [r.get(c.name) for r in table.rows if isinstance(r.get(c.name), str)]
            if (c.name != table.primary_key and not c.references and _identifying(c, table.rows) and not person_column(table.name, c.name)
                    and "@" not in "".join(values)
                    and sum(" " in v for v in values) * 2 > len(values) and sum(bool(re.search(r"\d", v)) for v in values) * 2 <= len(values)):
                found.append((table.name, c.name))
    return found


def _grow_table(table: TableDraft, rows: list[dict], target: int, keys: dict[str, list], rng: random.Random,
                words: dict[str, list[str]]) -> tuple[list[dict], str]:
    templates = list(rows)
    identifying = {c.name for c in table.columns if c.name != table.primary_key and not c.references and _identifying(c, templates)}
    pools = {name: _pools(table.name, c, templates) for c in table.columns if (name := c.name) in identifying}
    # a first-name or last-name column is drawn from the names, not kept unique: people share first names
    parts = {n for n in identifying if all(len(slots) == 1 and (set(FIRST) <= set(slots[0]) or set(LAST) <= set(slots[0]))
                                           for slots in pools[n].values())}
    unique = identifying - parts
    seen = {name: {str(r.get(name)).casefold() for r in rows} for name in unique}
    fresh = {name: [v for v in dict.fromkeys(values) if isinstance(v, str) and v.strip() and not _taken(v, seen.get(name, set()))]
             for name, values in words.items() if name in identifying}
    for values in fresh.values():
        rng.shuffle(values)
    digits = {name: sum(bool(re.search(r"\d", str(r.get(name) or ""))) for r in templates) * 2 > len(templates) for name in identifying}
    spelled = {c: sources for c, sources in _spelled_from(identifying, templates).items() if c in unique}
    next_key = _key_maker(next((c for c in table.columns if c.name == table.primary_key), None), [r.get(table.primary_key) for r in rows])
    usable = list(templates)  # a template whose identifying values admit nothing new is set aside
    while len(rows) < target:
        if not usable:
            return rows, f"no new {' or '.join(sorted(unique))} left to make"
        template = rng.choice(usable)
        row = None
        for _ in range(MAX_TRIES):
            row = _draw(table, template, templates, rows, keys, pools, parts, seen, digits, spelled, fresh, rng)
            if row is not None:
                break
        if row is None:
            usable.remove(template)
            continue
        for name in unique:
            if row.get(name) is not None:
                seen[name].add(str(row[name]).casefold())
        row[table.primary_key] = next_key()
        rows.append(row)
    return rows, ""


def _draw(table, template, templates, rows, keys, pools, parts, seen, digits, spelled, fresh, rng) -> dict | None:
    """One new row from `template`, or None when one of its unique values came out not new."""
    row, shift = dict(template), rng.randint(-SHIFT_DAYS, 0)
    for c in sorted(table.columns, key=lambda c: c.name in spelled):  # a value spelled from others comes after them
        value = template.get(c.name)
        if c.name == table.primary_key or value is None:
            continue
        parent = (c.references or "").partition(".")[0]
        if parent:
            choices = [k for k in keys.get(parent, ()) if k is not None] if parent != table.name else [r[table.primary_key] for r in rows]
            row[c.name] = rng.choice(choices) if choices else value
        elif c.name in spelled:
            sources = spelled[c.name]
            row[c.name] = _respell(value, [str(template[n]) for n in sources], [str(row[n]) for n in sources])
            if row[c.name] == value or _taken(row[c.name], seen[c.name]):
                return None
        elif c.name in fresh:  # the builder's own names, each once; none left, no new row
            while fresh[c.name] and _taken(fresh[c.name][-1], seen[c.name]):
                fresh[c.name].pop()
            if not fresh[c.name]:
                return None
            row[c.name] = fresh[c.name].pop()
        elif c.name in parts:
            row[c.name] = _made(value, pools[c.name], digits[c.name], rng)
        elif c.name in seen:
            row[c.name] = _made(value, pools[c.name], digits[c.name], rng)
            if _taken(row[c.name], seen[c.name]):
                return None
        elif isinstance(value, str) and _DATE.match(value):
            row[c.name] = _shift(value, shift)
        elif c.type in ("integer", "real") and not isinstance(value, bool):
            row[c.name] = _number(c, [r.get(c.name) for r in templates], rng, value)
    return row


def _taken(value: str, seen: set[str]) -> bool:
    # a part of another value, or the other way round, is not new either: "The Tide" beside "The Tide Atlas" reads as the same
    folded = value.casefold()
    return any(folded in v or v in folded for v in seen)


def _identifying(column: ColumnDraft, rows: list[dict]) -> bool:
    """A text column whose written values are all distinct and are not single words of a vocabulary that repeats (a
    status, a brand, a condition), unless they are people's first or last names."""
    values = [r.get(column.name) for r in rows if isinstance(r.get(column.name), str)]
    if column.type != "text" or len(values) < 2 or len(set(values)) < len(values) or all(_DATE.match(v) for v in values):
        return False
    if not all(_WORD.fullmatch(v) for v in values):
        return True
    return bool(_PERSON.search(column.name)) or sum(v in FIRST or v in LAST for v in values) * 2 >= len(values)


def person_column(table: str, column: str) -> bool:
    """The column is named for a person, or is the `name` of a table of people."""
    return bool(_PERSON.search(column) or column == "name" and _PERSON.search(table))


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.casefold())


def _spelled_from(identifying: set[str], rows: list[dict]) -> dict[str, list[str]]:
    """Identifying columns that spell other identifying columns' words in every written row (an email from a first
    and a last name), with those others."""
    found: dict[str, list[str]] = {}
    for column in sorted(identifying):
        sources = [source for source in sorted(identifying - {column})
                   if all(isinstance(r.get(column), str) and isinstance(r.get(source), str) and _words(r[source])
                          and set(_words(r[source])) <= set(_words(r[column])) for r in rows)]
        if sources and not any(column in found.get(source, ()) for source in sources):
            found[column] = sources
    return found


def _respell(value: str, old: list[str], new: list[str]) -> str:
    """`value` with the words of each `old` text replaced by those of the `new` one, in order
    ("ada.park@x.org", ["Ada", "Park"] → ["Bo", "Lee"]: "bo.lee@x.org")."""
    swap = {}
    for before, after in zip(old, new):
        if len(_words(before)) != len(_words(after)):
            return value
        swap.update(zip(_words(before), _words(after)))
    return re.sub(r"[A-Za-z]+", lambda m: swap.get(m.group(0).casefold(), m.group(0)), value)


def _pools(table: str, column: ColumnDraft, rows: list[dict]) -> dict[tuple, list[list[str]]]:
    """The words each position of the column's values takes, by the values' shape (the sequence of token kinds); a
    position that holds first or last names (most of its words are such names, or the column, or a `name` column's
    table, is named for a person) takes the built-in names too."""
    values = [r[column.name] for r in rows if isinstance(r.get(column.name), str)]
    person = person_column(table, column.name)
    pools: dict[tuple, list[list[str]]] = {}
    split = [_TOKEN.findall(v) for v in values]
    for tokens in split:
        slots = pools.setdefault(tuple(_kind(t) for t in tokens), [[] for _ in tokens])
        for i, t in enumerate(tokens):
            if t not in slots[i]:
                slots[i].append(t)
    for shape, slots in pools.items():
        words = [i for i, k in enumerate(shape) if k == "word" and all(w[:1].isupper() for w in slots[i])]
        if not words:
            continue
        first = sum(w in FIRST for w in slots[words[0]]) * 2 >= len(slots[words[0]])
        last = sum(w in LAST for w in slots[words[-1]]) * 2 >= len(slots[words[-1]])
        single = len(words) == 1
        if first or (person and not single) or (person and _LAST.search(column.name) is None and single):
            slots[words[0]] = sorted(set(slots[words[0]]) | set(FIRST))
        if (last or (first or person) and not single) or (person and single and _LAST.search(column.name)):
            slots[words[-1]] = sorted(set(slots[words[-1]]) | set(LAST))
    return pools


def _kind(token: str) -> str:
    return "word" if token[0].isalpha() else "digits" if token[0].isdigit() else token


def _made(value: str, pools: dict[tuple, list[list[str]]], digits: bool, rng: random.Random) -> str:
    """A value of the template's shape: each word from its position's pool, each number (in a column of numbers, such as
    phone numbers or ISBNs) new digits of the same length."""
    tokens = _TOKEN.findall(value)
    slots = pools.get(tuple(_kind(t) for t in tokens))
    made = []
    for i, t in enumerate(tokens):
        if t[0].isdigit() and digits:
            made.append(str(rng.randint(1 if len(t) > 1 and t[0] != "0" else 0, 9)) + "".join(str(rng.randint(0, 9)) for _ in t[1:]))
        elif t[0].isalpha() and slots:
            made.append(rng.choice(slots[i]))
        else:
            made.append(t)
    return "".join(made)


def _key_maker(column: ColumnDraft | None, existing: list):
    """The next keys in the shape of the written ones: integers count on; a text key's last number counts on with its
    zero padding ("BK-0007" → "BK-0008"); a key without a number gets one appended."""
    used = {str(k) for k in existing}
    if column is not None and column.type == "integer":
        counter = iter(range(max([k for k in existing if isinstance(k, int)] or [0]) + 1, 10**12))
        return lambda: next(counter)
    sample = next((str(k) for k in existing if k is not None), "row")
    match = re.search(r"(\d+)(?!.*\d)", sample)
    head, tail, width = (sample[:match.start()], sample[match.end():], len(match.group(1))) if match else (f"{sample}-", "", 3)
    numbers = [int(m.group(1)) for k in used if (m := re.search(r"(\d+)(?!.*\d)", k))]
    state = {"n": max(numbers or [0])}

    def make() -> str:
        while True:
            state["n"] += 1
            key = f"{head}{state['n']:0{width}d}{tail}"
            if key not in used:
                used.add(key)
                return key

    return make


def _shift(value: str, days: int) -> str:
    match = _DATE.match(value)
    try:
        day = dt.date.fromisoformat(match.group(1)) + dt.timedelta(days=days)
    except ValueError:
        return value
    return day.isoformat() + (match.group(2) or "")


def _number(column: ColumnDraft, values: list, rng: random.Random, value):
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return value
    low, high = min(numbers), max(numbers)
    if column.type == "integer":
        return rng.randint(int(low), int(high))
    places = max(len(repr(float(v)).split(".")[1]) for v in numbers)
    return round(rng.uniform(low, high), places)
