"""Generic control-logic components a bundle can enable in `components.yaml`.

Each component watches the public episode (instruction, tool schemas,
observations) and may block a call, add guidance to a tool result, or
question the final answer. None of them names a task, an entity or a value:
they are what a structured edit (HERA Fig. 4) selects and parameterises.
`Stack` layers the enabled components over the bundle's own `Harness`:
the first component that blocks a call or overrides a final answer wins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, ClassVar, Literal

from langchain_core.messages import HumanMessage
from pydantic import Field

from harness.abi import BaseHarness, Decision, EpisodeView, Final, ToolRequest, action_schema, answer_schema, call_hook
from state.evolution import Replay, answered_by, pair_halves
from state.records import Observation, Record, ToolInfo, scalars

NEGATIVE_MARKERS = ("unavailable", "revoked", "expired", "suspended", "withdrawn", "unauthorized", "not authorized",
                    "denied", "conflict", "outage", "stale", "superseded", "out of service", "no longer")
AUTH_KEYS = ("authoriz", "authoris", "consent", "permission", "approval", "delegat", "power_of_attorney", "access")
AUTH_NEGATIVE = ("revoked", "expired", "withdrawn", "denied", "suspended", "inactive", "rejected", "pending", "none", "false")


class Component:
    """A hook-level behaviour with typed parameters; hooks return None for no opinion."""

    name: ClassVar[str]
    summary: ClassVar[str]
    addresses: ClassVar[tuple[str, ...]] = ()  # the failure kinds (state.evolution.FailureKind) it is built for
    categories: ClassVar[tuple[str, ...]] = ()  # the mutation categories (state.records.CATEGORIES) whose twins it refuses

    class Params(Record):
        pass

    @classmethod
    def built_for(cls, group: str) -> bool:
        """Whether it is built for a failure group ("kind/category", or a kind alone): it addresses the kind, or it
        refuses the twins of the category (an ambiguous twin answered or refused without evidence alike)."""
        kind, _, category = group.partition("/")
        return kind in cls.addresses or category in cls.categories

    def __init__(self, params: dict[str, Any] | None = None):
        self.params = self.Params.model_validate(params or {})

    def initialize(self, view: EpisodeView) -> None:
        """Before the first turn; may be `async` (and may then use `view.lookup`) and may add to `view.instruction`."""
        return None

    def instructions(self, view: EpisodeView) -> str:
        """Text for the system prompt; may be `async` (and may then use `view.lookup`)."""
        return ""

    def before_tool_call(self, view: EpisodeView, call: ToolRequest) -> Decision | None:
        """May be `async` (and may then use `view.lookup`)."""
        return None

    def present(self, view: EpisodeView, call: ToolRequest, observation: Observation) -> str | None:
        """The text the model is shown of a result instead of the whole of it."""
        return None

    def after_tool_result(self, view: EpisodeView, call: ToolRequest, observation: Observation) -> str | None:
        return None

    async def finalize(self, view: EpisodeView, answer: str) -> Final | None:
        return None


def _records(value: Any) -> list[dict]:
    """Every record (dict) of a JSON-like value, nested ones too, each before those it holds (walked without
    recursion: a tool's result may nest as deep as its JSON parses)."""
    found, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            found.append(v)
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
    return found


def _writes(view: EpisodeView) -> set[str]:
    return {t.name for t in view.tools if not t.read_only}


def _committed(view: EpisodeView) -> bool:
    return any(o.ok and not o.read_only for o in view.observations)


class LookBeforeAct(Component):
    name = "look_before_act"
    addresses = ('wrong_answer', 'forbidden_action')
    summary = "blocks a state-changing call until a read-only tool has returned something"

    def before_tool_call(self, view, call):
        if call.name in _writes(view) and not any(o.ok and o.read_only for o in view.observations):
            return Decision(action="block", message="Not run. Before changing anything, look up the records this request depends on with the read-only tools.")
        return None


class StopOnNegativeEvidence(Component):
    name = "stop_on_negative_evidence"
    addresses = ('did_not_abstain', 'forbidden_action')
    categories = ('broken_tool', 'authorization_revoked', 'stale_record', 'conflicting_records')
    summary = ("after a result reports unavailable, revoked, expired, conflicting or similar evidence about a record the "
               "change relies on, blocks the change and tells the agent to explain instead")

    class Params(Record):
        markers: tuple[str, ...] = Field(NEGATIVE_MARKERS, description="words that mark evidence against acting")
        anywhere: tuple[str, ...] = Field(("unavailable", "outage", "out of service"),
                                          description="markers that count in any record of a result, not only one the change relies on")

    def _marker(self, text: str) -> str | None:
        text = text.casefold()
        return next((m for m in self.params.markers if m.casefold() in text), None)

    def _evidence(self, view: EpisodeView, call: ToolRequest) -> tuple[str, str] | None:
        """The first marker in a failed result, or in a record of a result that either holds an `anywhere` marker or
        is one `call` relies on: it holds a value of the call's arguments, and no field it shares by name with them
        holds another value (the revoked consent a release names; not a former consent of the same patient, a
        superseded salary of the same employee). Field names are not read: "revoked_on": null is no evidence."""
        named = {k: str(v).casefold() for k, v in call.args.items() if v is not None and not isinstance(v, (dict, list))}
        values = {v.casefold() for v in scalars(call.args) if len(v) >= 3}
        for o in view.observations:
            if o.ok and not o.read_only:
                continue
            if not o.ok:
                if marker := self._marker(o.text):
                    return marker, o.tool
                continue
            for record in _records(o.output) or [{"": " ".join(scalars(o.output))}]:
                own = {k: str(v).casefold() for k, v in record.items() if v is not None and not isinstance(v, (dict, list))}
                marker = self._marker(" ".join(own.values()))
                if marker and (marker in self.params.anywhere
                               or values & set(own.values()) and all(named.get(k, v) == v for k, v in own.items())):
                    return marker, o.tool
        return None

    def before_tool_call(self, view, call):
        found = self._evidence(view, call) if call.name in _writes(view) else None
        if found:
            marker, tool = found
            return Decision(action="block", message=f"Not run: an earlier result of {tool} reported '{marker}'. Do not change anything; "
                                                    "tell the user plainly what cannot be done and why.")
        return None


class SuppressDuplicateCalls(Component):
    name = "suppress_duplicate_calls"
    addresses = ('turn_limit',)
    summary = ("answers a repeated identical tool call with the earlier result instead of running it again; "
               "after a few repeats, tells the agent to stop calling tools and answer")

    class Params(Record):
        stop_after: int = Field(2, ge=1, description="repeats answered with the earlier result before the agent is told to answer")

    def before_tool_call(self, view, call):
        for o in view.observations:
            if o.tool == call.name and o.args == call.args:
                repeats = view.memory["duplicate_calls"] = view.memory.get("duplicate_calls", 0) + 1
                if repeats > self.params.stop_after:
                    return Decision(action="block", message="Not run: you keep repeating calls whose results you already have. Stop calling tools "
                                                            "and give your final answer now: what you found and, if the request cannot be "
                                                            "completed, why.")
                return Decision(action="block", message=f"Already called with these arguments; the result was: {o.text[:800]}")
        return None


class CheckBeforeCommit(Component):
    name = "check_before_commit"
    addresses = ('did_not_abstain', 'forbidden_action')
    summary = "before the first state-changing call, makes the agent check every requirement of the request against the results once"

    class Params(Record):
        message: str = ("Before you change anything, check each requirement of the request against what the tools returned: "
                        "every fact it needs is present, records agree, permissions and statuses allow it, and all constraints hold together. "
                        "If any requirement is not met or cannot be confirmed, do not act: explain what is missing. Otherwise make the call again.")

    def before_tool_call(self, view, call):
        if call.name in _writes(view) and not view.memory.get("checked_before_commit"):
            view.memory["checked_before_commit"] = True
            return Decision(action="replan", message=self.params.message)
        return None


class FlagMultipleMatches(Component):
    name = "flag_multiple_matches"
    addresses = ('did_not_abstain',)
    categories = ('ambiguous_entity',)
    summary = "when a lookup returns several records, tells the agent to make sure which one is meant before acting"

    class Params(Record):
        min_matches: int = 2

    def after_tool_result(self, view, call, observation):
        output = observation.output
        rows = output if isinstance(output, list) else next((v for v in output.values() if isinstance(v, list)), None) if isinstance(output, dict) else None
        if observation.ok and rows is not None and len(rows) >= self.params.min_matches:
            return (f"Note: {len(rows)} records matched. Make sure exactly one of them is the one the request means before acting on it; "
                    "if the request does not tell them apart, say so instead of guessing.")
        return None


class CheckRelatedAuthorization(Component):
    name = "check_related_authorization"
    addresses = ('did_not_abstain', 'forbidden_action')
    categories = ('authorization_revoked',)
    summary = "points out authorisation, consent or permission fields in a result whose value does not allow acting"

    class Params(Record):
        keys: tuple[str, ...] = AUTH_KEYS
        negative: tuple[str, ...] = AUTH_NEGATIVE

    def _flags(self, value: Any, path: str = "") -> list[str]:
        if isinstance(value, dict):
            return [f for k, v in value.items() for f in self._flags(v, f"{path}.{k}" if path else str(k))]
        if isinstance(value, list):
            return [f for v in value for f in self._flags(v, path)]
        key = path.rsplit(".", 1)[-1].casefold()
        text = json.dumps(value).strip('"').casefold()
        if any(k in key for k in self.params.keys) and (value is None or text in self.params.negative):
            return [f"{path}={text}"]
        return []

    def after_tool_result(self, view, call, observation):
        flags = self._flags(observation.output) if observation.ok else []
        if flags:
            return f"Note: {', '.join(flags[:5])}. Acting requires valid authorisation; if it is not in place, do not act and explain why."
        return None


class FinalCheck(Record):
    can_complete: bool = Field(description="true only if every requirement of the request was confirmed by the tool results")
    reason: str = Field(description="what is missing, conflicting or not allowed; empty when it can be completed")


class ConfirmFinalDecision(Component):
    name = "confirm_final_decision"
    addresses = ('did_not_abstain',)
    summary = "before accepting an answer that changed nothing, asks the model one structured question: could the request really be completed?"

    async def finalize(self, view, answer):
        if _committed(view) or view.ask is None:
            return None
        results = "\n".join(f"- {o.tool}({json.dumps(o.args)}) -> {o.text[:400]}" for o in _read(view)[-8:]) or "(no tool results)"
        question = (f"Request:\n{view.instruction}\n\nTool results:\n{results}\n\nDraft answer:\n{answer}\n\n"
                    "Could the request be completed correctly from these results, with every required fact present, consistent and allowed?")
        check = await view.ask([HumanMessage(question)], FinalCheck)
        if not check.can_complete:
            return Final(action="abstain", text=f"I cannot complete this request: {check.reason}".strip())
        return None


# What a record key looks like: letters and digits (at least one digit), maybe dashes; not a date or a time.
KEY_SHAPE = re.compile(r"^(?=[^ ]*\d)[A-Za-z0-9][A-Za-z0-9\-_./:#]{2,}$")
KEY_FIELD = re.compile(r"(^id$|_id$|_ids$|_code$|_number$|_no$|_ref$|^sku$|_key$)", re.IGNORECASE)
NOT_A_KEY = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[T ][\d:.]+Z?)?$|^\d{1,2}:\d{2}(?::\d{2})?$|^-?\d+(?:\.\d+)?$")


def _read_tools(view: EpisodeView) -> list[ToolInfo]:
    return [t for t in view.tools if t.read_only]


def _tools_carrying(view: EpisodeView, field: str) -> list[str]:
    """The read-only tools whose description names `field` (or what it identifies), else the ones that do not need it."""
    stem = re.sub(KEY_FIELD, "", field) or field
    named = [t.name for t in _read_tools(view) if field in t.description or stem.replace("_", " ") in t.description.casefold()]
    return named or [t.name for t in _read_tools(view) if field not in t.input_schema.get("required", ())]


def _identifiers(args: dict[str, Any], tool: ToolInfo | None) -> list[tuple[str, str]]:
    """The (field, value) pairs of a call's arguments that name a record: a key-shaped value, or any value of a key-named field."""
    properties = (tool.input_schema.get("properties", {}) if tool else {})
    found = []
    for field, value in args.items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (str, int)) or "enum" in properties.get(field, {}):
                continue
            text = str(v).strip()
            if not text or NOT_A_KEY.match(text) and not KEY_FIELD.search(field):
                continue
            if KEY_SHAPE.match(text) or KEY_FIELD.search(field):
                found.append((field, text))
    return found


def _mentioned(value: str, text: str) -> bool:
    return re.search(r"(?<![A-Za-z0-9])" + re.escape(value.casefold()) + r"(?![A-Za-z0-9])", text) is not None


EXAMPLE = re.compile(r"\b(?:such as|e\.g\.,?|for example|for instance)\s+(?:\"[^\"]*\"|'[^']*'|\S+)", re.IGNORECASE)


def without_examples(text: str) -> str:
    """`text` without the example values it gives ("an id such as "P-99999""): a small model copies a tool
    description's example id into its call, and an example is no record."""
    return EXAMPLE.sub("", text)


def _unseen(args: dict[str, Any], tool: ToolInfo | None, known: str) -> list[tuple[str, str]]:
    """The identifiers among `args` that `known` (casefolded text the agent had seen) never mentions: guesses."""
    return [(f, v) for f, v in _identifiers(args, tool) if not _mentioned(v, known)]


def _known(view: EpisodeView) -> str:
    """What the agent has seen, casefolded: the request, the context, the tool descriptions (without their examples),
    every result so far and the arguments of the calls that found something (an id a call found is no guess)."""
    return "\n".join([view.instruction, view.context, *(f"{t.name} {without_examples(t.description)}" for t in view.tools),
                      *(o.text for o in view.observations),
                      *(json.dumps(o.args, ensure_ascii=False) for o in view.observations if o.ok and _nonempty(o.output))]).casefold()


def guessed_calls(before: str, observations: list[Observation]) -> list[str]:
    """The agent's calls, as `tool(field='value')`, that named a record by an identifier seen nowhere before them
    (`before`: the request and the tool descriptions; then the earlier results) and failed or found nothing: the
    trace of an agent that invents ids instead of looking them up."""
    known, found = before.casefold(), []
    for o in observations:
        if o.source == "agent" and (not o.ok or not _nonempty(o.output)):
            found += [f"{o.tool}({f}={v!r})" for f, v in _unseen(o.args, None, known)]
        known += "\n" + o.seen.casefold()
    return found


class GroundIdentifiers(Component):
    name = "ground_identifiers"
    addresses = ('guessed_identifier',)
    summary = ("does not run a call whose identifier appears nowhere in the request, the tool descriptions or an earlier "
               "result (a guessed id); names the read-only tools that can find it and a search by what the request names, "
               "and from the second guess on makes that search and shows its result")

    class Params(Record):
        search_from: int = Field(2, ge=0, description="the guess from which the harness makes the search itself (0: never)")

    async def before_tool_call(self, view, call):
        tool = next((t for t in view.tools if t.name == call.name), None)
        unseen = _unseen(call.args, tool, _known(view))
        if not unseen:
            return None
        field, value = unseen[0]
        guesses = view.memory["guesses"] = view.memory.get("guesses", 0) + 1
        message = (f"Not run: {field}={value!r} appears nowhere in the request or in any result so far, so it would be a guess. "
                   f"Find the real value first, with {', '.join(_tools_carrying(view, field)) or 'the read-only tools'}.")
        searches = _searches(view)
        if searches and self.params.search_from and guesses >= self.params.search_from and view.lookup is not None:
            name, args = searches[0]
            o = await view.lookup(name, args)
            shown = (f"failed ({o.error_code}: {o.message})" if not o.ok else "found nothing" if not _nonempty(o.output)
                     else f"returned: {json.dumps(_compact(o.visible, 5)[0], ensure_ascii=False, default=str)}\nUse the ids it shows.")
            return Decision(action="block", message=f"{message} I searched for you: {_call_text(name, args)} {shown}")
        if searches:
            message += f" Search by what the request names, for example {' or '.join(_call_text(*c) for c in searches[:2])}."
        return Decision(action="block", message=message)


def _call_text(name: str, args: dict[str, Any]) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def _searches(view: EpisodeView) -> list[tuple[str, dict[str, str]]]:
    """Searches by what the request names (`request_terms`, `search_tools`) not made yet, as (tool, arguments): the
    local model, told only which tools find an id, called get_order with the same invented order id until the turn
    limit (std17: 5 of c1's 34 training and validation episodes ended so, every call blocked as a guess)."""
    made = [(o.tool, o.args) for o in view.observations]
    return [(t.name, {arg: term}) for term in request_terms(view.instruction) for t, arg in search_tools(view)
            if (t.name, {arg: term}) not in made]


class ReadBeforeWrite(Component):
    name = "read_before_write"
    addresses = ('forbidden_action', 'did_not_abstain')
    summary = ("before a state-changing call on a record nobody has read yet, reads it with the read-only tool that takes "
               "its id and shows the agent the result first")

    async def before_tool_call(self, view, call):
        if call.name not in _writes(view) or view.lookup is None:
            return None
        for field, value in _identifiers(call.args, next((t for t in view.tools if t.name == call.name), None)):
            readers = detail_tools(view, field)
            if not readers or any(o.tool in {t.name for t in readers} and str(o.args.get(field)) == value for o in view.observations):
                continue
            o = await view.lookup(readers[0].name, {field: value})
            shown = json.dumps(_compact(o.visible, 5)[0], ensure_ascii=False, default=str)
            return Decision(action="block", message=f"Not run yet: first check the record it changes. {readers[0].name}({field}={value!r}) "
                                                    f"returned: {shown}\nIf nothing in it blocks the change, call {call.name} again with "
                                                    "the same arguments now. If something blocks it, give your final answer: what and why.")
        return None


class OneWritePerTurn(Component):
    name = "one_write_per_turn"
    addresses = ('forbidden_action',)
    summary = "runs at most one state-changing call per model turn; the others wait until the agent has seen its result"

    def before_tool_call(self, view, call):
        if call.name not in _writes(view):
            return None
        if view.memory.get("write_turn") == view.turn:
            return Decision(action="block", message="Not run: one change at a time. Read the result of the change you just made, then decide on the next.")
        view.memory["write_turn"] = view.turn
        return None


class RefuseFailedRepeat(Component):
    name = "refuse_failed_repeat"
    addresses = ('turn_limit', 'guessed_identifier')
    summary = "does not rerun a call that just failed with the same arguments; restates the error and names tools that could resolve it"

    def before_tool_call(self, view, call):
        last = next((o for o in reversed(view.observations) if o.source == "agent"), None)
        if last is None or last.ok or last.tool != call.name or last.args != call.args:
            return None
        tools = ", ".join(t.name for t in _read_tools(view) if t.name != call.name) or "the read-only tools"
        return Decision(action="block", message=f"Not run: this exact call just failed ({last.error_code}: {last.message}). It would fail "
                                                f"again. Change the arguments using what {tools} return, or explain in your answer why it cannot be done.")


def _compact(value: Any, rows: int) -> tuple[Any, bool]:
    """`value` without empty strings, lists and objects, and with lists cut to `rows` items plus a count of the rest.
    Nulls stay: a value that is absent is information."""
    if isinstance(value, dict):
        out, cut = {}, False
        for k, v in value.items():
            if v == "" or v == [] or v == {}:
                cut = True
                continue
            out[k], more = _compact(v, rows)
            cut |= more
        return out, cut
    if isinstance(value, list):
        items = [_compact(v, rows) for v in value[:rows]]
        out = [v for v, _ in items]
        if len(value) > rows:
            out.append(f"... {len(value) - rows} more; narrow the search to see them")
        return out, len(value) > rows or any(more for _, more in items)
    return value, False


class CompactObservations(Component):
    name = "compact_observations"
    addresses = ('turn_limit',)
    summary = "shows long results compactly (the first rows, a count of the rest, empty fields dropped); the full result is kept"

    class Params(Record):
        min_chars: int = Field(1200, ge=0, description="results shorter than this are shown whole")
        rows: int = Field(5, ge=1, description="list items shown")

    def present(self, view, call, observation):
        if not observation.ok or len(observation.text) < self.params.min_chars:
            return None
        compact, cut = _compact(observation.output, self.params.rows)
        return json.dumps(compact, ensure_ascii=False, default=str) if cut else None


CAPITALISED = re.compile(r"\b[A-Z][\w'’&-]*(?:(?:\s+(?:of|de|la|van|von|and|&|for|to))*\s+[A-Z][\w'’&-]*)*")
QUOTED = re.compile(r"[\"“]([^\"”]{3,60})[\"”]|(?<!\w)'([^']{3,60})'(?!\w)")
COMMON = frozenset("""a an the i i'm i've we we're you he she it they my our your his her their this that these those please
can could would will should may might must do does did is are was were be been am has have had not no yes if then when where
which who whom what why how also and or but so for to of in on at by with from as hi hello thanks thank dear monday tuesday
wednesday thursday friday saturday sunday january february march april may june july august september october november
december today tomorrow yesterday morning afternoon evening spring summer fall autumn winter dr mr mrs ms prof
i'd i'll we'd we'll you'd you'll they'd they'll he'd she'd it's let's that's there's what's don't can't won't
before after once while since because until unless though although there here now just only all any each every some
both either per about id tell book check pick select choose let find get give send show list make confirm cancel
update schedule issue look see use following""".split())
JOINED = re.compile(r"\s+(?:and|&)\s+")


def _term(text: str) -> str:
    """`text` without possessives, surrounding punctuation and leading common words."""
    words = [re.sub(r"['’]s$", "", w.strip(" .,;:!?()'\"“”")) for w in text.split()]
    while words and words[0].casefold() in COMMON:
        words.pop(0)
    return " ".join(w for w in words if w)


def _parts(phrase: str) -> list[str]:
    """The names in a capitalised phrase: split after a possessive ("Lena Hoffmann's VPN"), and where it joins names
    of two words or more with "and" or "&" ("Amara Osei and Lucas Brandt"; "Whitmore & Hale" stays whole)."""
    parts = []
    for owned in re.split(r"(?<=['’]s)\s+", phrase):
        sides = JOINED.split(owned)
        parts += sides if len(sides) > 1 and all(len(s.split()) >= 2 for s in sides) else [owned]
    return parts


QUANTITY = re.compile(r"^\d+(?:[.:]\d+)?-?(?:am|pm|st|nd|rd|th|h|hrs?|min|mins|days?|weeks?|months?|years?|kg|g|mg|ml|lbs?|km|mi|mph|ft)$",
                      re.IGNORECASE)  # "7pm", "20th", "90-day": no record a search finds


def request_terms(instruction: str, limit: int = 6) -> list[str]:
    """What a request names that a search could find: quoted text, record keys (not times, dates or quantities) and
    capitalised phrases, in order."""
    terms: list[str] = []
    found = [m.group(1) or m.group(2) for m in QUOTED.finditer(instruction)]
    found += [t for t in re.findall(r"[A-Za-z0-9][\w\-/#]*[A-Za-z0-9]", instruction)
              if KEY_SHAPE.match(t) and not NOT_A_KEY.match(t) and not QUANTITY.match(t)]
    found += [part for m in CAPITALISED.finditer(instruction) for part in _parts(m.group(0))]
    for raw in found:
        term = _term(raw)
        if len(term) >= 3 and term.casefold() not in (t.casefold() for t in terms):
            terms.append(term)
    return terms[:limit]


SEARCH_ARGS = re.compile(r"^(?:query|q|search|text|keywords?|term|location|address)$|(?:^|_)name$")


def search_tools(view: EpisodeView) -> list[tuple[ToolInfo, str]]:
    """Read-only tools that search by free text and need nothing else: (tool, a text argument), for each of its text
    arguments (a query, a name, an applicant's name, an address, a location)."""
    found = []
    for t in _read_tools(view):
        props = t.input_schema.get("properties", {})
        required = set(t.input_schema.get("required", ()))
        text = [k for k, v in props.items() if SEARCH_ARGS.search(k) and v.get("type", "string") == "string" and "enum" not in v]
        found += [(t, arg) for arg in text if required <= {arg}]
    return found


def _nonempty(output: Any) -> bool:
    if isinstance(output, dict):
        return any(_nonempty(v) for v in output.values())
    return output not in (None, [], {}, "")


def _held_keys(output: Any) -> list[tuple[tuple[str, str], dict]]:
    """The (field, value) record keys in a result, in order, each with the (nested) record whose field it is."""
    if isinstance(output, list):
        return [k for item in output for k in _held_keys(item)]
    if not isinstance(output, dict):
        return []
    own = [((f, str(v)), output) for f, v in output.items()
           if KEY_FIELD.search(f) and isinstance(v, (str, int)) and not isinstance(v, bool)]
    return own + [k for v in output.values() if isinstance(v, list) for k in _held_keys(v)]


def _listed_keys(output: Any) -> list[tuple[tuple[str, str], dict]]:
    """The ids a record lists under a plural key field, each as the key one such record is read by ("order_ids":
    ["CS-1"] gives ("order_id", "CS-1")), with the (nested) record that lists it, in order."""
    if isinstance(output, list):
        return [k for item in output for k in _listed_keys(item)]
    if not isinstance(output, dict):
        return []
    own = [((f[:-1], str(x)), output) for f, v in output.items() if f.casefold().endswith("_ids") and isinstance(v, list)
           for x in v if isinstance(x, (str, int)) and not isinstance(x, bool)]
    return own + [k for v in output.values() if isinstance(v, list) for k in _listed_keys(v)]


def _keys(output: Any) -> list[tuple[str, str]]:
    """The (field, value) record keys in a result, in order: what a detail lookup can take."""
    return [k for k, _ in _held_keys(output)]


def detail_tools(view: EpisodeView, field: str, named_only: bool = True) -> list[ToolInfo]:
    """Read-only tools that need nothing but `field`: the ones named after what it identifies (get_student_record for
    student_id) first, then, unless `named_only`, the others (get_leave for employee_id)."""
    stem = KEY_FIELD.sub("", field).casefold()
    takers = [t for t in _read_tools(view) if field in t.input_schema.get("properties", {})
              and set(t.input_schema.get("required", ())) <= {field}]
    named = [t for t in takers if stem and stem in t.name.casefold()]
    return named if named_only else named + [t for t in takers if t not in named]


NAME_FIELD = re.compile(r"(?:^|_)name$", re.IGNORECASE)
WORD = re.compile(r"[^\W_][\w\-]*")


def _words(text: str) -> set[str]:
    return {w.casefold() for w in WORD.findall(text)} - COMMON


def held(asked: set[str], record: Any) -> int:
    """How many of the words `asked` (`_words` of a request) a record holds."""
    return len(asked & _words(" ".join(scalars(record))))


LOOKED_UP = "\n\n(Looked up before you started"  # how resolve_named_entities adds its findings to the request


class ResolveNamedEntities(Component):
    name = "resolve_named_entities"
    addresses = ('guessed_identifier', 'over_abstained', 'ungrounded_abstain')
    summary = ("before the first turn, looks up what the request names (people, records, codes) with the search tools, "
               "reads the records that hold most of the request's words and those they list by id, and puts them in front of "
               "the agent with the request")

    class Params(Record):
        max_lookups: int = Field(10, ge=1, le=30)
        max_details: int = Field(3, ge=0, le=12)
        rows: int = Field(5, ge=1)
        share: float = Field(0.5, ge=0, le=1, description="a record found is shown when it holds at least this share of "
                                                          "the request's words that the best record found holds")

    async def initialize(self, view):
        if view.lookup is None:
            return
        asked, made, searches = _words(view.instruction), [], []
        for term in request_terms(view.instruction):
            for tool, arg in search_tools(view):
                if len(made) >= self.params.max_lookups:
                    break
                made.append(o := await view.lookup(tool.name, {arg: term}))
                if o.ok and _nonempty(o.output):
                    searches.append(o)
        # A search by one word of a name finds every record holding it (a street's other addresses): show the records
        # that hold most of the request's words, each once, and read those first.
        ranked = sorted(((held(asked, r), r, o) for o in searches for r in _rows(o.output)), key=lambda x: -x[0])  # stable
        floor = ranked[0][0] * self.params.share if ranked else 0
        kept: dict[int, list] = {}  # a search's records shown, by id of its observation
        best: list = []  # every record shown, most of the request's words first
        for score, record, o in ranked:
            if score >= floor and record not in best:
                kept.setdefault(id(o), []).append(record)
                best.append(record)
        found = [o for o in searches if id(o) in kept or not _rows(o.output)]  # a list of names, say, is shown whole
        # each key is read in the order of the (nested) record it names: a patient's prescription the request names first;
        # a record's own keys before the ids it lists (a customer's "order_ids", read by get_order's order_id)
        keyed = sorted((k for r in best for k in (*_held_keys(r), *_listed_keys(r))), key=lambda k: -held(asked, k[1]))
        keys = list(dict.fromkeys(key for key, _ in keyed))
        details = 0
        for field, value in keys:
            for reader in detail_tools(view, field, named_only=False):
                if details >= self.params.max_details:
                    break
                details += 1
                made.append(o := await view.lookup(reader.name, {field: value}))
                if not o.ok or _nonempty(o.output):  # a record's reader failing is news too (a tool down, access refused)
                    found.append(o)
        # what the agent is not shown (searches that found nothing or nothing kept) is no result it read: nothing to quote
        unshown = {id(o) for o in made} - {id(o) for o in found}
        view.memory["unshown"] = [i for i, o in enumerate(view.observations) if id(o) in unshown]
        if found:
            view.instruction += (f"{LOOKED_UP}, for what the request names; use the exact ids, and look up anything else "
                                 "you need:)\n" + "\n".join(self._line(o, kept.get(id(o))) for o in found))

    def _line(self, o: Observation, rows: list | None) -> str:
        shown = o.visible if rows is None else rows if isinstance(o.output, list) else rows[0]
        line = (f"- {o.tool}({json.dumps(o.args, ensure_ascii=False)}) -> "
                f"{json.dumps(_compact(shown, self.params.rows)[0], ensure_ascii=False, default=str)}")
        if rows is not None and len(rows) > 1:
            line += f" ({len(rows)} records match: make sure which one the request means)"
        if rows is not None and isinstance(o.output, list) and len(o.output) > len(rows):
            line += f" ({len(o.output) - len(rows)} more found hold fewer of the request's words)"
        return line


def _rows(output: Any) -> list:
    """A search result's records: its items, or the one record it is."""
    return [r for r in output if isinstance(r, dict)] if isinstance(output, list) else [output] if isinstance(output, dict) else []


def indistinct(request: str, observation: Observation) -> list[str]:
    """The ids of the records of a search result that `request` cannot tell apart: two or more named exactly what was
    searched for, with no other such record holding more of the request's words (two active students named Grace
    Lopez, both sociology juniors). Empty otherwise: one such record, or one the request's words single out."""
    def folded(text) -> str | None:
        return " ".join(text.casefold().split()) if isinstance(text, str) else None

    rows = observation.output if observation.ok and isinstance(observation.output, list) else []
    searched = {folded(v) for v in observation.args.values()} - {None}
    named = {next((v for _, v in _keys(r)), ""): r for r in rows
             if isinstance(r, dict) and any(NAME_FIELD.search(f) and folded(v) in searched for f, v in r.items())}
    named.pop("", None)  # a record without an id cannot be named back
    asked = _words(request)
    holds = {i: held(asked, r) for i, r in named.items()}
    most = max(holds.values(), default=0)
    tied = [i for i, n in holds.items() if n == most]
    return tied if len(tied) >= 2 else []


class StopOnIndistinctMatches(Component):
    name = "stop_on_indistinct_matches"
    addresses = ('did_not_abstain', 'forbidden_action')
    categories = ('ambiguous_entity',)
    summary = ("when a search finds two or more records named exactly as searched that the request's words do not tell "
               "apart, blocks changes and answers that the request does not say which one it means (unless the answer "
               "names them all)")

    def _found(self, view: EpisodeView) -> tuple[Observation, list[str]] | None:
        request = view.instruction.split(LOOKED_UP)[0]
        return next(((o, ids) for o in _read(view) if (ids := indistinct(request, o))), None)

    def before_tool_call(self, view, call):
        found = self._found(view) if call.name in _writes(view) else None
        if found is None:
            return None
        o, ids = found
        return Decision(action="block", message=f"Not run: {o.tool} found {len(ids)} records ({', '.join(ids)}) that match "
                                                "everything the request says, and it does not say which one it means. Do not "
                                                "change anything; say so.")

    async def finalize(self, view, answer):
        found = None if _committed(view) else self._found(view)
        if found is None or all(i in answer for i in found[1]):
            return None
        o, ids = found
        return Final(action="abstain", text=f"I cannot tell which record this request means: {o.tool}"
                                            f"({json.dumps(o.args, ensure_ascii=False)}) found {len(ids)} that match everything "
                                            f"it says ({', '.join(ids)}). Please say which one.")


CUT = re.compile(r"[(\[{]\s*$")


class ReaskUnparsedCalls(Component):
    name = "reask_unparsed_calls"
    addresses = ('wrong_answer', 'over_abstained')
    summary = ("when a reply names a tool but holds no call that could be run, or a structured answer breaks off at an "
               "opening bracket, asks again instead of taking it as the final answer")

    class Params(Record):
        max_asks: int = Field(2, ge=1)

    async def finalize(self, view, answer):
        asked = view.memory.get("reasked", 0)
        if asked >= self.params.max_asks:
            return None
        if view.config.action_mode == "structured":
            # A grammar-constrained turn is a call or an answer, never a mix, and the answer's text ends at the model's
            # first quote mark: "I called find_traveller({" and "...; the result was: [{" (3 of the 38 answers of H-small's
            # local episodes at 34eb6f4) were calls and results written into an answer.
            if not CUT.search(answer):
                return None
            view.memory["reasked"] = asked + 1
            return Final(action="revise", text=f"Your answer breaks off at {answer.strip()[-40:]!r}, so it answers nothing. To call a "
                                               "tool, choose that tool's action; to finish, give the final answer in plain words, "
                                               "without quotes, code or JSON.")
        named = [t.name for t in view.tools if re.search(rf"(?<![\w.]){re.escape(t.name)}(?!\w)", answer)]
        if not named:
            return None
        view.memory["reasked"] = asked + 1
        return Final(action="revise", text=f"Your reply mentions {named[0]} but holds no call I could run, so nothing was done. "
                                           f'To call a tool, reply with only {{"name": "{named[0]}", "arguments": {{...}}}}. '
                                           "If you are finished, reply with your final answer in plain text, without tool names.")


class CallBeforeAnswering(Component):
    name = "call_before_answering"
    addresses = ('ungrounded_abstain', 'wrong_answer')
    summary = "a final answer given before the agent has called any tool is sent back once: look the facts up first"

    async def finalize(self, view, answer):
        if view.calls or view.memory.get("sent_back_unlooked"):
            return None
        view.memory["sent_back_unlooked"] = True
        return Final(action="revise", text="You have not called any tool yet, so nothing is checked or done. Call the tool you "
                                           "need next; answer only from what the results show.")


class CheckChangeMade(Component):
    name = "check_change_made"
    # wrong_answer too: two of the five wrong answers of std6's adopted candidate on validation came with no change
    # call at all, one of them saying the change was approved
    addresses = ('over_abstained', 'no_change', 'wrong_answer')
    summary = ("when the agent answers a request whose words ask for a change without any state-changing call having "
               "succeeded (a refusal, or a reply that says the change was made), asks it once whether the request needed a "
               "change it has not made yet")

    async def finalize(self, view, answer):
        # a question is left alone: over the catalog's reference solutions outside the bench it sent back the right
        # answer to all 7 of its questions (benchmarks/bench_references.py)
        if (not _writes(view) or _committed(view) or view.memory.get("asked_change_made")
                or not named_changes(view.instruction.split(LOOKED_UP)[0], view.tools)):
            return None
        view.memory["asked_change_made"] = True
        changes = ", ".join(sorted(_writes(view)))
        return Final(action="revise", text=f"Nothing has been changed yet: no call of a tool that makes changes ({changes}) has "
                                           "succeeded. If the request asks for a change and nothing you found blocks it, make "
                                           "that call now. If it only asks for information, or something blocks the change, "
                                           "give your final answer again.")


class Citation(Record):
    blocked: bool = Field(description="true only if a tool result shows that the requested change or answer cannot be given")
    quote: str = Field(description="when blocked: a few words copied exactly from that tool result; else empty")


def _squash(text: str) -> str:
    return re.sub(r"[\W_]+", " ", text).strip().casefold()


CITE_QUESTION = ("Does one of these tool results show that the request cannot be carried out as asked? If so, copy the "
                 "exact words of that result.")


def _read(view: EpisodeView) -> list[Observation]:
    """The results the agent was shown: all but the harness's own lookups it never put in front of the agent."""
    unshown = set(view.memory.get("unshown", ()))
    return [o for i, o in enumerate(view.observations) if i not in unshown]


def _quoted(cited: Citation, view: EpisodeView) -> bool:
    """A refusal backed by at least three words copied from a result the agent was shown."""
    quote = _squash(cited.quote)
    return cited.blocked and len(quote.split()) >= 3 and any(quote in _squash(o.seen) for o in _read(view))


class CiteBlockingEvidence(Component):
    name = "cite_blocking_evidence"
    addresses = ('ungrounded_abstain', 'over_abstained')
    summary = ("when the agent answers without having changed anything, asks it once to quote the result that blocks the "
               "request; a quote found in no result sends it back to finish the request")

    async def finalize(self, view, answer):
        if not _writes(view) or _committed(view) or view.ask is None or view.memory.get("asked_citation"):
            return None
        view.memory["asked_citation"] = True
        results = "\n".join(f"- {o.tool}: {o.seen[:600]}" for o in _read(view)[-10:]) or "(no tool results)"
        question = (f"Request:\n{view.instruction.split(LOOKED_UP)[0]}\n\nTool results:\n{results}\n\nYour answer:\n{answer}\n\n"
                    + CITE_QUESTION)
        cited = await view.ask([HumanMessage(question)], Citation)
        if _quoted(cited, view):
            return None
        changes = ", ".join(sorted(_writes(view)))
        return Final(action="revise", text="No tool result shows anything that blocks this request. If it asks for a change, make "
                                           f"it now with the right tool ({changes}); if it only asks for information, answer it "
                                           "from the results.")


class Intent(Record):
    asks_for: Literal["a change", "information only"] = Field(
        description="a change: the request asks to create, update, cancel or approve something; "
                    "information only: it asks to find, check or report something")


# Asked "a change or only information?", the 1.5B model answered "information only" for 35 of the 42 training and
# validation requests that ask for a change ("Please enrol him and tell me his student ID"); asked which write tool,
# or yes or no, it named a change for 6 and 7 of the 7 questions. The request's own words tell them apart better.
REPORTING = frozenset("tell let check confirm find look show give say advise see verify explain help list".split())
POLITE = re.compile(r"\b(?:please|could you|can you|would you)\s+(\w+)")


def named_changes(instruction: str, tools: Iterable[ToolInfo]) -> list[str]:
    """The words of a request that ask for a change: those sharing their first five letters with a word of a write
    tool's name that no read-only tool's name has ("enrol him" for enroll_student, not "leave" when get_leave
    exists), else the verbs it politely asks for that do not ask for a report ("please send", not "can you tell").
    Empty when the words do not show it (a question, or tools named unlike the request)."""
    tools, text = list(tools), instruction.casefold()
    read = {w[:5] for t in tools if t.read_only for w in t.name.casefold().split("_")}
    own = {w[:5] for t in tools if not t.read_only for w in t.name.casefold().split("_") if len(w) >= 3 and w[:5] not in read}
    return [w for w in re.findall(r"[a-z]+", text) if len(w) >= 3 and w[:5] in own] or [v for v in POLITE.findall(text) if v not in REPORTING]


def reports_only(instruction: str) -> bool:
    """Whether a request asks, politely, only for reports ("can you tell me", "could you check"): a question, in so
    many words."""
    verbs = POLITE.findall(instruction.casefold())
    return bool(verbs) and all(v in REPORTING for v in verbs)


class FollowThrough(Component):
    name = "follow_through"
    addresses = ('over_abstained', 'no_change')
    summary = ("when the agent answers a request for a change without having changed anything, keeps a refusal only if "
               "it quotes a result the agent read that blocks the request; otherwise asks the model, grammar-constrained, "
               "for the one call that does what the request asks and hands that call to the agent to make, or, when an id "
               "of it appears in no result yet, names the tools that find it; again after the agent has called a tool since")

    class Params(Record):
        times: int = Field(2, ge=1, le=4, description="how many times it may send the agent back, each after a tool call "
                                                      "the agent made since the last")

    async def finalize(self, view, answer):
        writes = [t for t in view.tools if not t.read_only]
        sent = view.memory.get("followed_through", [])  # the results seen each time it sent the agent back; None: settled
        if (sent is None or not writes or _committed(view) or view.ask is None or len(sent) >= self.params.times
                or sent and sent[-1] == len(view.observations)):
            return None
        view.memory["followed_through"] = None
        request = view.instruction.split(LOOKED_UP)[0]
        if not sent and not named_changes(request, view.tools):  # the model is asked only when the words do not tell
            if reports_only(request):
                return None
            intent = await view.ask([HumanMessage(f"Request:\n{request}\n\nDoes this request ask for a change in the system, "
                                                  "or only for information?")], Intent)
            if intent.asks_for == "information only":  # a question is answered, not turned into a change
                return None
        results = "\n".join(f"- {o.tool}({json.dumps(o.args, ensure_ascii=False)}): {o.seen[:500]}" for o in _read(view)[-12:])
        context = f"Request:\n{request}\n\nTool results:\n{results or '(none)'}\n\nDraft answer:\n{answer}\n\n"
        cited = await view.ask([HumanMessage(context + CITE_QUESTION)], Citation)
        if _quoted(cited, view):
            return Final(action="accept")
        proposal = answer_schema("Change", action_schema(writes))
        step = (await view.ask([HumanMessage(context + "Which one call makes the change the request asks for, with the exact ids "
                                                       "from the results? If the request only asks for information, give the "
                                                       "final answer instead.")], proposal)).model_dump()
        if "tool" not in step:
            return None
        view.memory["followed_through"] = [*sent, len(view.observations)]
        unseen = [f for f, _ in _unseen(step["arguments"], next(t for t in writes if t.name == step["tool"]), _known(view))]
        if unseen:  # a guessed id is not handed over: the agent is told where to find it
            tools = ", ".join(dict.fromkeys(n for f in unseen for n in _tools_carrying(view, f))) or "the read-only tools"
            do = (f"The request asks for {step['tool']}, which needs {', '.join(dict.fromkeys(unseen))}: no result so far gives "
                  f"it. Look it up with {tools}, then make the call")
        else:
            do = (f"The call that does what the request asks is {step['tool']}"
                  f"({json.dumps(step['arguments'], ensure_ascii=False)}). Make it now")
        return Final(action="revise", text=f"Nothing has been changed yet. {do}, unless a result shows it must not be made; then "
                                           "say which and why.")


class ReportTheChange(Component):
    name = "report_the_change"
    addresses = ('wrong_answer',)
    summary = ("when the final answer after a change leaves out the ids that change returned, shows the agent the result "
               "and asks once for an answer that reports it; if it still leaves them out, the result is appended to it")

    class Params(Record):
        append_result: bool = Field(True, description="append the change's result to an answer that still leaves its ids out")

    async def finalize(self, view, answer):
        done = [o for o in view.observations if o.source == "agent" and o.ok and not o.read_only]
        if not done or not [v for _, v in _keys(done[-1].output) if not _mentioned(v, answer.casefold())]:
            return None
        shown = json.dumps(_compact(done[-1].output, 5)[0], ensure_ascii=False, default=str)
        if view.memory.get("asked_report"):
            return Final(action="replace", text=f"{answer.rstrip()}\n\n{done[-1].tool} returned: {shown}") if self.params.append_result else None
        view.memory["asked_report"] = True
        return Final(action="revise", text=f"The change went through: {done[-1].tool} returned {shown}. Give your final answer "
                                           "now: what was done, with the values the request asks for, taken from the results.")


# A value: a token with at least two digits (amounts, dates, ids, times); one-digit counts are prose.
VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-_./:#]*")


def _values(text: str) -> list[str]:
    """The value-like tokens of `text`, with thousands separators and trailing decimal zeros dropped ("86,900.00" and
    86900 are one value, "748.80" and 748.8 another)."""
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    return [re.sub(r"(?<=\d)\.$", "", re.sub(r"(?<=\d\.)(\d*?)0+$", r"\1", t.rstrip("-_./:#"))) for t in VALUE.findall(text)]


MONTHS = "january february march april may june july august september october november december".split()
WORDED_DATE = re.compile(rf"\b(?:({'|'.join(MONTHS)})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?|(\d{{1,2}})(?:st|nd|rd|th)?\s+"
                         rf"({'|'.join(MONTHS)}),?)\s+(\d{{4}})\b", re.IGNORECASE)


def _iso_dates(text: str) -> list[str]:
    """The dates `text` writes in words ("March 16, 2026", "4 November 2025"), as ISO dates."""
    return [f"{m[5]}-{MONTHS.index((m[1] or m[4]).casefold()) + 1:02d}-{int(m[2] or m[3]):02d}" for m in WORDED_DATE.finditer(text)]


RUN = re.compile(r"\d+|[a-z]+")
RANGE = re.compile(r"^(?!\d{4}-\d{1,2}-\d{1,2}$)([^-]*\d[^-]*)-([^-]+)$")  # "14:30-15:45", "5-15", "24-month"; not a date


def unseen_values(answer: str, sources: Iterable[str]) -> list[str]:
    """The values of `answer` (tokens with two digits or more) found in none of `sources`, compared without case, in
    order of appearance. A value is found whole, or as a run of its digits or letters within a source's token ("March
    30, 2026" is in "2026-03-30", "Fall 2026" in "2026FA", "13:30" in "2026-05-24T13:30:00"); a range ("14:30-15:45",
    "5-15") when each of its ends is found, a count with its unit ("24-month") when the count is."""
    tokens = {t.casefold() for source in sources for t in [*_values(source), *_iso_dates(source)]}
    runs = f" {' | '.join(' '.join(RUN.findall(t)) for t in tokens)} "

    def found(value: str) -> bool:
        return f" {' '.join(RUN.findall(value))} " in runs

    unseen = []
    for value in dict.fromkeys(t for t in _values(answer) if sum(c.isdigit() for c in t) >= 2):
        ends = RANGE.match(value.casefold())
        if not (found(value.casefold()) or ends and all(found(e) for e in ends.groups() if any(c.isdigit() for c in e))):
            unseen.append(value)
    return unseen[:6]


class AnswerFromResults(Component):
    name = "answer_from_results"
    addresses = ('did_not_abstain', 'wrong_answer')
    categories = ('missing_evidence',)
    summary = ("when the final answer gives numbers, dates or ids that are in no tool result and not in the request, "
               "names them and sends the answer back once: give only what the results show, or say what is missing")

    async def finalize(self, view, answer):
        if view.memory.get("asked_unseen"):
            return None
        unseen = unseen_values(answer, [view.instruction, view.context, *(o.seen for o in view.observations)])
        if not unseen:
            return None
        view.memory["asked_unseen"] = True
        return Final(action="revise", text=f"Your answer gives {', '.join(unseen)}, which no tool result shows and the request "
                                           "does not contain. Answer only with values the results show (say how you worked "
                                           "out any you computed); if the request asks for something the results do not "
                                           "show, say that it is missing instead of giving a value.")


def _fields(value: Any) -> Iterable[tuple[str, Any]]:
    """The (name, value) of each field of a JSON-like value that holds a scalar, a null or an empty list or record,
    nested records and lists walked."""
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _fields(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list, tuple)) and v:
                yield from _fields(v)
            else:
                yield str(k), v


def asked_fields(request: str, observations: Iterable[Observation]) -> list[tuple[str, str, Any]]:
    """The (tool, field, value) of the results' fields every word of whose name the request uses, compared by their
    first five letters ("verified_monthly_income" for "the verified monthly income we hold", "employer" for "the name
    of her employer"); words of two letters ("id") left out of the name."""
    asked = {w[:5] for w in _words(request)}
    found = []
    for o in observations:
        for name, value in _fields(o.output if o.ok else None):
            words = [w[:5] for w in re.split(r"[\W_]+", name.casefold()) if len(w) > 2]
            if words and all(w in asked for w in words):
                found.append((o.tool, name, value))
    return found


ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ][\d:.]+Z?)?")


def _said(value: Any, text: str) -> bool:
    """Whether `text` gives `value`: its words in order, each of its value-like tokens ("3,530.25" for 3530.25), or,
    for a date, its year, month (number or name) and day ("March 7, 2026" for 2026-03-07)."""
    value, words = str(value), set(re.sub(r"(?<=\d)(?:st|nd|rd|th)\b", "", _squash(text)).split())
    tokens = {t.casefold() for t in _values(value)}
    if f" {_squash(value)} " in f" {_squash(text)} " or tokens and tokens <= {t.casefold() for t in _values(text)}:
        return True
    date = ISO_DATE.fullmatch(value)
    if not date or not 1 <= int(date[2]) <= 12:
        return False
    year, month, day = date[1], int(date[2]), int(date[3])
    return year in words and bool({str(day), f"{day:02d}"} & words) and bool(
        {str(month), f"{month:02d}", MONTHS[month - 1], MONTHS[month - 1][:3]} & words)


# An answer saying that what was asked is not there ("is not listed in the output", "were not found", "does not hold
# any verified monthly income"): over recorded episodes, what a small model said of fields the results held.
ABSENT = re.compile(r"\b(?:not|never|no longer|n't)\b[^.;]{0,40}?\b(?:list|provid|found|find|availab|held|hold|ha(?:ve|s)|giv|show|"
                    r"includ|contain|record|specif|mention|present|exist|on file)|\bno\b[^.;]{0,30}?\b(?:record|information|"
                    r"data|detail|result)s?\b|\bmissing\b|\bunable to (?:find|locate|determine)\b", re.IGNORECASE)


class PointToAskedFields(Component):
    name = "point_to_asked_fields"
    addresses = ('over_abstained', 'wrong_answer')
    summary = ("when the final answer says that what the request asks for is not there while a result the agent read "
               "holds it under a field the request names (an employer, a monthly income), with one value and none of those "
               "fields empty, names the fields and their values and sends the answer back once")

    class Params(Record):
        fields: int = Field(6, ge=1, le=12, description="how many fields it names at most")

    async def finalize(self, view, answer):
        if view.memory.get("pointed_to_fields") or not ABSENT.search(answer):
            return None
        request = view.instruction.split(LOOKED_UP)[0]
        found = asked_fields(request, _read(view))
        if not found or any(v is None or v == "" or v == [] or v == {} for _, _, v in found):  # the results show one missing
            return None
        if len({(name, str(v)) for _, name, v in found}) > len({name for _, name, _ in found}):  # records that differ on a
            return None  # field: which one is meant is not for it to say
        given = [(tool, name, value) for tool, name, value in found if not isinstance(value, bool) and not _said(value, request)]
        if not given or any(_said(value, answer) for _, _, value in given):
            return None
        view.memory["pointed_to_fields"] = True
        held = "; ".join(f"{tool}: {name} = {str(value)[:120]}" for tool, name, value in list(dict.fromkeys(given))[:self.params.fields])
        return Final(action="revise", text=f"The results you read hold what the request asks for ({held}). Give your final "
                                           "answer from them, unless a result shows the request cannot be carried out as "
                                           "asked; then say which result and why.")


LIBRARY: dict[str, type[Component]] = {c.name: c for c in (
    LookBeforeAct, StopOnNegativeEvidence, SuppressDuplicateCalls, CheckBeforeCommit, FlagMultipleMatches,
    CheckRelatedAuthorization, ConfirmFinalDecision, GroundIdentifiers, OneWritePerTurn, RefuseFailedRepeat,
    CompactObservations, ResolveNamedEntities, StopOnIndistinctMatches, ReaskUnparsedCalls, ReadBeforeWrite,
    CallBeforeAnswering, CheckChangeMade, CiteBlockingEvidence, FollowThrough, ReportTheChange, AnswerFromResults,
    PointToAskedFields,
)}
ComponentName = Literal[tuple(LIBRARY)]  # type: ignore[valid-type]


class Undecided(Exception):
    """A component asked the model or looked a record up while replaying a recorded episode (`stepped_in`): what it
    would have done depends on an answer the record does not hold."""


async def _undecided(*_):
    raise Undecided


async def stepped_in(component: Component, view: EpisodeView, observations: list[Observation], answer: str) -> bool | None:
    """Whether `component` would have stepped into a recorded episode: blocked or held back one of the agent's calls,
    shown a result otherwise or added a note to it, or changed or sent back the final answer; None when that turns on
    a model's answer or a lookup (`view`'s `ask` and `lookup` raise `Undecided`). Each call is taken as a turn of its
    own, and only the first time counts: what the agent would have done next is not in the record."""
    view.ask = view.lookup = _undecided
    calls = [(i, o) for i, o in enumerate(observations) if o.source == "agent"]
    try:
        await call_hook(component.initialize, view)
        for turn, (i, o) in enumerate(calls):
            view.observations, view.turn, view.calls = observations[:i], turn, turn + 1
            call = ToolRequest(id=f"replay-{i}", name=o.tool, args=o.args)
            decision = await call_hook(component.before_tool_call, view, call)
            if decision is not None and decision.action != "allow":
                return True
            view.observations = observations[: i + 1]
            if (await call_hook(component.present, view, call, o) is not None
                    or await call_hook(component.after_tool_result, view, call, o)):
                return True
        view.observations = list(observations)
        final = await component.finalize(view, answer)
    except Undecided:
        return None
    return final is not None and final.action != "accept"


def stops_going_on(name: str, group: str, start: str, replay: Replay | None = None) -> bool:
    """Whether the library's component `name` is built for the agent going on with the twin of `group`, a twin's group
    on the other side of the pairs from `start` (`answered_by`), and, with a `replay`, steps into more of the training
    pairs' twins than of their feasible sides when their reference solutions are replayed (`Replay.tells_apart`):
    what the agent does there once it acts, which no episode shows yet."""
    target = answered_by(group, start)
    return (target != group and name in LIBRARY and LIBRARY[name].built_for(target)
            and (replay is None or replay.tells_apart(name)))


def catalog_text(groups: Iterable[str] = (), replay: Replay | None = None) -> str:
    """The library as the roles that choose components read it: the components built for the failure `groups` of a
    diagnosis (`Component.built_for`) first, in its order, each marked with what it is built for (a 1.5B panel never
    picked ground_identifiers for agents that invented ids until the failures were named so and the component said
    it was built for them); with a `replay` of the training episodes, each marked with how many failed and passed ones
    it would have stepped into, and of those built for the same group, the ones that step into more failures than
    passed episodes first, then those that step into more of the training pairs' twins than of their feasible sides
    when their reference solutions are replayed (`Replay.references`: what it does once the agent acts); for the twin
    the agent will act on (`built`), those two the other way round."""
    order = list(dict.fromkeys(groups))
    halves = pair_halves(order)
    acting = halves[1] if len(halves) == 2 and answered_by(halves[1], halves[0]) != halves[1] else None

    def built(cls: type[Component]) -> dict[str, int]:
        """What it is built for, in words, with the first group that shows it; for a twin of the other side of the
        pairs that the agent will act on once it no longer fails as it does now (`answered_by`), the ones built for
        going on with it that step into more of its twins than of their feasible sides (`unaddressed` asks for one)."""
        found: dict[str, int] = {}
        for i, (kind, _, category) in enumerate(g.partition("/") for g in order):
            if kind in cls.addresses:
                found.setdefault(kind.replace("_", " "), i)
            if category in cls.categories:
                found.setdefault(f"{category.replace('_', ' ')} twins", i)
            elif order[i] == acting and stops_going_on(cls.name, acting, order[0], replay):
                found.setdefault(f"going on with {category.replace('_', ' ')} twins", i)
        return found

    def line(cls: type[Component], found: dict[str, int]) -> str:
        marks = [f"built for: {', '.join(found)}"] if found else []
        if replay and (replay.failed or replay.passed):
            failed, passed = replay.stepped_in.get(cls.name, (0, 0))
            undecided = replay.undecided.get(cls.name, 0)
            if undecided == replay.failed + replay.passed:
                marks.append("what it does on the training episodes turns on a model's answer or a lookup")
            else:
                marks.append(f"on the training episodes it would have stepped in on {failed} of {replay.failed} failed and {passed} "
                             f"of {replay.passed} passed" + (f", {undecided} left to a model's answer or a lookup" if undecided else ""))
        if replay and cls.name in replay.references:
            twins, feasible = replay.references[cls.name]
            marks.append(f"on the {replay.pairs} training pairs' reference solutions played on as if nothing had changed, it "
                         f"steps into {twins} twins and {feasible} feasible sides")
        return f"- {cls.name} ({'; '.join(marks)}): {cls.summary}" if marks else f"- {cls.name}: {cls.summary}"

    def rank(item: tuple[type[Component], dict[str, int]]) -> tuple[int, tuple[int, int]]:
        cls, found = item
        first = min(found.values(), default=len(order))
        return first, replay.preference(cls.name, first < len(order) and order[first] == acting) if replay else (0, 0)

    marks = {cls: built(cls) for cls in LIBRARY.values()}
    return "\n".join(line(cls, found) for cls, found in sorted(marks.items(), key=rank))


class Stack(BaseHarness):
    """The bundle's harness with the enabled components layered over it."""

    def __init__(self, inner: BaseHarness, components: list[Component]):
        self.inner, self.components = inner, components

    async def initialize(self, view):
        await call_hook(self.inner.initialize, view)
        for c in self.components:
            await call_hook(c.initialize, view)

    async def compose_instructions(self, view):
        parts = [await call_hook(self.inner.compose_instructions, view)]
        for c in self.components:
            parts.append(await call_hook(c.instructions, view))
        return "\n\n".join(p for p in parts if p)

    async def prepare_turn(self, view, messages):
        return await call_hook(self.inner.prepare_turn, view, messages)

    async def before_tool_call(self, view, call):
        for c in self.components:
            decision = await call_hook(c.before_tool_call, view, call)
            if decision is not None:
                return decision
        return await call_hook(self.inner.before_tool_call, view, call)

    async def present_result(self, view, call, observation):
        for c in self.components:
            shown = c.present(view, call, observation)
            if shown is not None:
                return shown
        return await call_hook(self.inner.present_result, view, call, observation)

    async def after_tool_result(self, view, call, observation):
        notes = [await call_hook(self.inner.after_tool_result, view, call, observation),
                 *(c.after_tool_result(view, call, observation) for c in self.components)]
        return "\n".join(n for n in notes if n) or None

    async def finalize(self, view, answer):
        for c in self.components:
            final = await c.finalize(view, answer)
            if final is not None:
                return final
        return await call_hook(self.inner.finalize, view, answer)


