"""Tool calling for models that write their calls as text.

Small local models (DESIGN.md §6) do not emit native tool calls: they write
JSON objects, fenced or bare, `<tool_call>` tags, or, once earlier calls are
shown to them as prose, prose such as `I called get_item({"sku": "A"}).`; they
also follow a conversation better when earlier calls and results come back as
plain chat turns. `fold_history` turns a LangChain conversation with native
tool calls into such plain turns and describes the tools in the system prompt;
`parse_tool_calls` reads the calls back out of a reply. `number_calls` gives
calls the conversation's own ids (`call_<n>`), whatever a model invented.

The system prompt is a pure function of the caller's system text and the
tools, so it is byte-identical from turn to turn and the server's prefix cache
keeps working.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from harness.abi import action_schema
from state.records import ToolInfo

CALL_INSTRUCTION = (
    'To call a tool, reply with a JSON object {"name": "<tool name>", "arguments": {<arguments>}}; '
    "to call several, write one object per line. When you need no more tools, reply with your answer in plain text."
)
ACTION_INSTRUCTION = (
    'Each reply is one JSON object: {"tool": "<tool name>", "arguments": {<arguments>}} to call one tool '
    '(you will see its result), or {"final_answer": "<your answer to the user>"} when you are done.'
)
ARGUMENT_KEYS = ("arguments", "args", "parameters", "input", "params")
NAME_KEYS = ("name", "tool", "tool_name", "function")
CALL_KEYS = frozenset(ARGUMENT_KEYS + NAME_KEYS + ("id", "type", "call_id"))
SCAN_BUDGET = 200_000
CALL_ID = re.compile(r"^call_(\d+)$")
FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)```", re.DOTALL)
TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
PROSE_PREFIX = re.compile(
    r"(?:\b(?:I(?:'ll| will| am going to| now)?|let me|now I(?:'ll| will)?)\s+(?:now\s+)?call(?:ed)?"
    r"(?:\s+the)?(?:\s+tool)?\s*:?\s*|\bcalling\s+)$",
    re.IGNORECASE,
)


def text_of(content: str | list) -> str:
    if isinstance(content, str):
        return content
    return "".join(part if isinstance(part, str) else str(part.get("text", "")) for part in content)


def describe_argument(schema: dict[str, Any]) -> str:
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    if "anyOf" in schema or "oneOf" in schema:
        kind = " or ".join(describe_argument(option) for option in schema.get("anyOf") or schema["oneOf"])
    elif "enum" in schema:
        kind = "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    elif schema.get("type") == "object" and "properties" in schema:
        kind = describe_object(schema)
    elif schema.get("type") == "array":
        kind = f"array of {describe_argument(schema.get('items', {})) or 'values'}"
    else:
        kind = schema.get("type") or ("object" if "$ref" in schema else "value")
        kind = " or ".join(kind) if isinstance(kind, list) else kind
    # "string (a title)", not "string: a title": a 1.5B model copied the latter into its values ("string: Jane Austen")
    return f"{kind} ({schema['description']})" if schema.get("description") else kind


def describe_object(schema: dict[str, Any]) -> str:
    """An object schema as a JSON object of its fields' types: `{"sku": "string", "qty": "integer, optional"}`;
    a union of object schemas as its alternatives joined by "or"."""
    if "anyOf" in schema and "properties" not in schema:
        return " or ".join(describe_object(option) for option in schema["anyOf"])
    required = set(schema.get("required", ()))
    fields = {
        name: describe_argument(field) + ("" if name in required else ", optional")
        for name, field in schema.get("properties", {}).items()
    }
    return json.dumps(fields, ensure_ascii=False)


def describe_tools(tools: Sequence[ToolInfo], instruction: str = CALL_INSTRUCTION) -> str:
    """One line per tool (name, description, arguments) and the call instruction."""
    lines = ["Tools you can call:"]
    lines += [f"- {t.name}: {t.description.strip()} Arguments: {describe_object(t.input_schema)}" for t in tools]
    lines.append(instruction)
    return "\n".join(lines)


class ActionError(ValueError):
    """A structured turn that is not one of the turns the grammar allows."""


def parse_action(text: str, tools: Sequence[ToolInfo]) -> tuple[str, list[dict[str, Any]]]:
    """A structured turn's final answer (and no calls) or its one call (and no text); ActionError when
    `text` is outside `action_schema(tools)`."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as error:
        raise ActionError(f"the turn is not JSON: {error}") from None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(action_schema(tools)).iter_errors(value))
    if error is not None:
        raise ActionError(f"the turn is neither a call of an offered tool nor a final answer: {error.message[:300]}")
    if "final_answer" in value:
        return value["final_answer"], []
    return "", [{"name": value["tool"], "args": value["arguments"]}]


def with_system_note(messages: Sequence[BaseMessage], note: str) -> list[BaseMessage]:
    """`messages` with `note` appended to the leading system prompt (one is added if there is none)."""
    messages = list(messages)
    if messages and isinstance(messages[0], SystemMessage):
        messages[0] = SystemMessage(content=f"{text_of(messages[0].content).rstrip()}\n\n{note}")
    else:
        messages.insert(0, SystemMessage(content=note))
    return messages


def describe_call(name: str, args: dict[str, Any]) -> str:
    return f"I called {name}({json.dumps(args, ensure_ascii=False)})."


def fold_history(messages: Sequence[BaseMessage], tools: Sequence[ToolInfo] = (),
                 instruction: str = CALL_INSTRUCTION) -> list[BaseMessage]:
    """The conversation as plain chat turns, with the tools described in the system prompt.

    An assistant turn with tool calls becomes its text followed by one
    `I called name({args}).` line per call; tool results become a user turn
    `Result of name: ...`; consecutive user turns are merged.
    """
    names: dict[str, str] = {}
    folded: list[BaseMessage] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            name = message.name or names.get(message.tool_call_id, "the tool")
            _append_user(folded, f"Result of {name}: {text_of(message.content)}")
        elif isinstance(message, AIMessage):
            lines = [text_of(message.content).strip()] if text_of(message.content).strip() else []
            for call in message.tool_calls:
                names[call["id"]] = call["name"]
                lines.append(describe_call(call["name"], call["args"]))
            folded.append(AIMessage(content="\n".join(lines)))
        elif isinstance(message, HumanMessage) and isinstance(message.content, str):
            _append_user(folded, message.content)
        else:
            folded.append(message)
    return with_system_note(folded, describe_tools(tools, instruction)) if tools else folded


def _append_user(folded: list[BaseMessage], text: str) -> None:
    if folded and isinstance(folded[-1], HumanMessage) and isinstance(folded[-1].content, str):
        folded[-1] = HumanMessage(content=f"{folded[-1].content}\n\n{text}")
    else:
        folded.append(HumanMessage(content=text))


def parse_tool_calls(text: str, tools: Sequence[ToolInfo]) -> tuple[str, list[dict[str, Any]]]:
    """Split a reply into its text and its calls of offered tools, in order of appearance.

    Calls are `{"name", "args"}` dicts. Recognised forms: JSON call objects or
    arrays of them (bare, fenced or in `<tool_call>` tags; also OpenAI-style
    `{"function": {...}}` and `{"tool_calls": [...]}`, and a name beside the
    arguments themselves, `{"name": "get_order", "order_id": "A"}`), lenient
    about single quotes, trailing commas and Python literals; prose calls
    `name({...})` or `name(key=value)`; and a call described, a fenced JSON
    object of arguments after prose that names one tool ("use the
    `get_order` tool with the following arguments: ```json {...}```"). A
    call of a tool that was not offered is not a call: its text stays in the
    content; nor are arguments beside a name, or described, that the tool's
    schema does not take (a record a reply quotes is not a call).
    """
    names = {tool.name for tool in tools}
    schemas = {tool.name: tool.input_schema or {} for tool in tools}
    if not names or not text:
        return text, []
    # Every JSON call quotes its tool's name, and scanning stops after a budget: a long reply full of
    # unbalanced braces (code, a cut-off answer) must not cost quadratic time.
    quoted = [m.start() for m in re.finditer(r"[\"'](?:" + "|".join(map(re.escape, names)) + r")[\"']", text)]
    budget = SCAN_BUDGET
    spans: list[tuple[int, int, list[dict[str, Any]]]] = []
    position = 0
    while position < len(text) and quoted and budget > 0:
        if text[position] in "{[" and quoted[-1] > position:
            end, stopped = _closing(text, position)
            budget -= stopped - position
            calls = _json_calls(text[position:end], schemas) if end else None
            if calls:
                spans.append((position, end, calls))
                position = end
                continue
        position += 1
    spans += _prose_calls(text, names, spans)
    spans += _described_calls(text, schemas, spans)
    spans.sort(key=lambda span: span[0])
    removed = [(start, end) for start, end, _ in spans]
    removed += _wrappers(text, removed)
    content = _cut(text, removed)
    return content, [call for _, _, calls in spans for call in calls]


def _closing(text: str, start: int) -> tuple[int | None, int]:
    """Index just past the bracket that closes the one at `start` (None if none does), skipping quoted
    strings; and the index where the scan stopped."""
    pairs = {"{": "}", "[": "]", "(": ")"}
    stack: list[str] = []
    quote = None
    escaped = False
    for index in range(start, len(text)):
        char = text[index]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in pairs:
            stack.append(pairs[char])
        elif char in ")]}":
            if not stack or stack.pop() != char:
                return None, index
            if not stack:
                return index + 1, index
    return None, len(text)


def _loads(text: str) -> Any:
    """JSON, else a Python literal, else None: also for a value nested deeper than a parser recurses (a reply of ten
    thousand brackets is text, not a crash)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return _literal(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


LITERALS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.AST) -> Any:
    """A JSON-like value from Python syntax: what small models write when they drift from JSON."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in LITERALS:
        return LITERALS[node.id]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise ValueError("dict unpacking")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand)
        if isinstance(value, (int, float)):
            return -value
    raise ValueError(f"not a literal: {ast.dump(node)[:60]}")


def _json_calls(text: str, schemas: dict[str, dict]) -> list[dict[str, Any]] | None:
    value = _loads(text)
    calls = _calls_in(value)
    if calls is None:
        return None
    known = [{"name": call["name"], "args": call["args"]} for call in calls
             if call["name"] in schemas and (not call.get("beside") or _takes(schemas[call["name"]], call["args"]))]
    return known or None


def _takes(schema: dict, args: dict[str, Any]) -> bool:
    """Whether a tool's input schema takes exactly these arguments: each a property of it, every required one there."""
    properties, required = schema.get("properties"), schema.get("required") or []
    if not isinstance(properties, dict) or not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return False  # a schema that is not one names no arguments
    return bool(args) and set(args) <= set(properties) and set(required) <= set(args)


def _described_calls(text: str, schemas: dict[str, dict], taken: list[tuple[int, int, Any]]) -> list[tuple[int, int, list]]:
    """Fenced JSON objects of arguments, each after prose (since the previous fence) that names offered tools of which
    exactly one takes them."""
    spans: list[tuple[int, int, list]] = []
    previous = 0
    for match in FENCE.finditer(text):
        start, end = match.span()
        before, previous = text[previous:start][-400:], end
        if any(s < end and e > start for s, e, _ in taken):
            continue
        args = _loads(match.group(1))
        if not isinstance(args, dict) or _calls_in(args) is not None:
            continue
        named = [name for name in schemas if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", before) and _takes(schemas[name], args)]
        if len(named) == 1:
            spans.append((start, end, [{"name": named[0], "args": args}]))
    return spans


def _calls_in(value: Any) -> list[dict[str, Any]] | None:
    """The calls a JSON value spells, or None when it is not call-shaped."""
    if isinstance(value, list):
        found = [_calls_in(item) for item in value]
        if not value or any(calls is None for calls in found):
            return None
        return [call for calls in found for call in calls]
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("tool_calls"), list):
        return _calls_in(value["tool_calls"])
    if isinstance(value.get("function"), dict):
        return _calls_in(value["function"])
    name = next((value[key] for key in NAME_KEYS if isinstance(value.get(key), str)), None)
    if name is None:
        if len(value) == 1:
            (name, args), = value.items()
            return [{"name": name, "args": args}] if isinstance(args, dict) else None
        return None
    if not set(value) <= CALL_KEYS:
        if any(key in value for key in ARGUMENT_KEYS):
            return None
        beside = {k: v for k, v in value.items() if k not in CALL_KEYS}  # checked against the tool's schema
        return [{"name": name, "args": beside, "beside": True}]
    args = next((value[key] for key in ARGUMENT_KEYS if key in value), {})
    if isinstance(args, str):
        args = _loads(args) if args.strip() else {}
    return [{"name": name, "args": args}] if isinstance(args, dict) else None


def _prose_calls(text: str, names: set[str], taken: list[tuple[int, int, Any]]) -> list[tuple[int, int, list]]:
    pattern = re.compile(r"(?<![\w.\"'])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\s*\(")
    spans: list[tuple[int, int, list]] = []
    budget = SCAN_BUDGET
    for match in pattern.finditer(text):
        start, opening = match.start(), match.end() - 1
        if any(s <= start < e for s, e, _ in taken + spans):
            continue
        if budget <= 0:
            break
        end, stopped = _closing(text, opening)
        budget -= stopped - opening
        if end is None:
            continue
        args = _prose_arguments(text[opening + 1 : end - 1])
        if args is None:
            continue
        prefix = PROSE_PREFIX.search(text, 0, start)
        start = prefix.start() if prefix else start
        if text[start - 1 : start] == "`" and text[end : end + 1] == "`":
            start, end = start - 1, end + 1
        if text[end : end + 1] == ".":
            end += 1
        spans.append((start, end, [{"name": match.group(1), "args": args}]))
    return spans


def _prose_arguments(inner: str) -> dict[str, Any] | None:
    inner = inner.strip()
    if not inner:
        return {}
    if inner[0] in "{[":
        value = _loads(inner)
        return value if isinstance(value, dict) else None
    try:
        call = ast.parse(f"f({inner})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
            return None
        return {keyword.arg: _literal(keyword.value) for keyword in call.keywords}
    except (SyntaxError, ValueError):
        return None


def _wrappers(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Fences and tags that hold nothing but calls go with them."""
    wrappers = []
    for pattern in (FENCE, TAG):
        for match in pattern.finditer(text):
            start, end = match.span(1)
            inner = [(max(s, start) - start, min(e, end) - start) for s, e in spans if s < end and e > start]
            if inner and not _cut(text[start:end], inner).strip(" \t\n,;"):
                wrappers.append(match.span())
    return wrappers


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    pieces, position = [], 0
    for start, end in sorted(spans):
        if end > position:
            pieces.append(text[position:max(start, position)])
            position = end
    pieces.append(text[position:])
    joined = pieces[0]
    for piece in pieces[1:]:
        spaced = joined.endswith(" ") and piece.startswith(" ")
        joined = f"{joined.rstrip(' ')} {piece.lstrip(' ')}" if spaced else joined + piece
    return re.sub(r"\n{3,}", "\n\n", joined).strip()


def number_calls(calls: Sequence[dict[str, Any]], history: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain tool calls with ids `call_<n>`, numbered on from those already in the conversation.

    Numbering from the conversation (not a process counter) keeps ids unique
    within an episode across a resume from a checkpoint.
    """
    seen = 0
    for message in history:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                match = CALL_ID.match(call.get("id") or "")
                seen = max(seen + 1, int(match.group(1)) if match else 0)
        elif isinstance(message, ToolMessage):
            match = CALL_ID.match(message.tool_call_id or "")
            seen = max(seen, int(match.group(1)) if match else 0)
    return [
        {"name": call["name"], "args": dict(call.get("args") or {}), "id": f"call_{seen + offset}", "type": "tool_call"}
        for offset, call in enumerate(calls, start=1)
    ]
