"""Programmatic certification of a matched pair (HERA App. B.3).

Each check returns a `CheckResult`; a pair is certified when all pass. The
checks and what they prove are listed in `envs/catalog/README.md`.
"""

from __future__ import annotations

import json
import re

from envs.answers import cut, spans, states
from envs.match import ANY, equal, objects
from envs.mutation import Applied, apply_mutation, apply_ops, revert
from envs.rescue import MAX_CALLS, RescueResult, Values, arguments, explore, rescue_search, tokens
from envs.runtime import EnvInstance, diff_rows
from envs.spec import SpecError, tool_infos, write_tools
from envs.verify import Outcome, committed, verify
from state.records import (
    AnswerCheck,
    Certification,
    CheckResult,
    EnvironmentSpec,
    Observation,
    PairSpec,
    StateOp,
    TaskSpec,
    ToolCall,
)

# Whose witness is a resolving record that exists on neither side; `ambiguity`
# and `conflict` show instead what makes the infeasible side unresolvable.
UNRESOLVABLE = {"conflicting_records", "ambiguous_entity"}
CONTROL_CALLS = 40  # read calls per tool on the rows a control edits


def replay(env: EnvironmentSpec, calls: tuple[ToolCall, ...], answer: str) -> Outcome:
    instance = EnvInstance(env)
    try:
        for call in calls:
            instance.call(call.tool, call.args)
        return Outcome(answer=answer, calls=tuple(instance.calls), final_rows=instance.rows(), diff=instance.diff())
    finally:
        instance.close()


def certify(pair: PairSpec, env: EnvironmentSpec, rescue_budget: int = MAX_CALLS) -> Certification:
    task, mutation = pair.task, pair.mutation
    try:
        applied = apply_mutation(env, mutation)
    except SpecError as exc:
        failed = CheckResult(name="mutation_applies", passed=False, detail=str(exc))
        return Certification(pair_id=pair.id, feasible_hash=env.hash, infeasible_hash="", checks=(failed,))
    checks = [
        _feasible_replay(env, task),
        _verifier_rejects(env, task),
        _blocking_evidence(pair, env, applied.env),
        _no_rescue(pair, env, applied.env, rescue_budget),
    ]
    if mutation.category == "ambiguous_entity":
        checks.append(_ambiguity(pair, env, applied.env, rescue_budget))
    if mutation.category == "conflicting_records":
        checks.append(_conflict(pair, env, applied.env))
    checks += [
        _write_replay(task, applied.env),
        _revert(env, task, applied),
        _scope(pair, env, applied.env),
        _control(pair, env),
        _interface(task, env, applied.env),
    ]
    return Certification(pair_id=pair.id, feasible_hash=env.hash, infeasible_hash=applied.env.hash, checks=tuple(checks))


def _result(name: str, failures: list[str], ok_detail: str) -> CheckResult:
    return CheckResult(name=name, passed=not failures, detail="; ".join(failures) if failures else ok_detail)


def _replay_failures(env: EnvironmentSpec, task: TaskSpec) -> list[str]:
    outcome = replay(env, task.reference.calls, task.reference.answer)
    failures = [f"call {o.tool} failed: {o.error_code}: {o.message}" for o in outcome.calls if not o.ok]
    return failures + list(verify(task, outcome).failures)


def _feasible_replay(env: EnvironmentSpec, task: TaskSpec) -> CheckResult:
    n = len(task.reference.calls)
    return _result("feasible_replay", _replay_failures(env, task), f"{n} reference calls replayed; verifier passes")


def perturbations(env: EnvironmentSpec, task: TaskSpec) -> list[tuple[str, Outcome]]:
    """Wrong or incomplete outcomes the verifier must reject."""
    ref = task.reference
    full = replay(env, ref.calls, ref.answer)
    out = []
    for check in task.answer:
        found = spans(ref.answer, check)
        out.append((f"answer without {check.name}", _with_answer(full, cut(ref.answer, found))))
        if isinstance(check.value, (int, float)) and not isinstance(check.value, bool):
            wrong = check.value + max(1.0, abs(check.value) * 0.1, check.tolerance * 10)
            out.append((f"answer with wrong {check.name}", _with_answer(full, cut(ref.answer, found, f"{wrong:g}"))))
    reads = tuple(c for c in ref.calls if c.tool not in write_tools(env))
    if task.state and len(reads) < len(ref.calls):
        out.append(("writes left out", replay(env, reads, ref.answer)))
    out.append(("empty answer, no writes", replay(env, reads, "")))
    return out


def _with_answer(outcome: Outcome, answer: str) -> Outcome:
    return Outcome(answer=answer, calls=outcome.calls, final_rows=outcome.final_rows, diff=outcome.diff)


def _verifier_rejects(env: EnvironmentSpec, task: TaskSpec) -> CheckResult:
    cases = perturbations(env, task)
    accepted = [name for name, outcome in cases if verify(task, outcome).passed]
    failures = [f"verifier accepts: {name}" for name in accepted]
    if len(cases) < 2:
        failures.append(f"only {len(cases)} perturbation(s); add answer or state checks")
    return _result("verifier_rejects", failures, f"{len(cases)} perturbed outcomes rejected")


def reads_before_write(env: EnvironmentSpec, calls: tuple[ToolCall, ...]) -> tuple[int, Outcome]:
    writes = write_tools(env)
    first_write = next((i for i, c in enumerate(calls) if c.tool in writes), len(calls))
    return first_write, replay(env, calls[:first_write], "")


def read_observations(env: EnvironmentSpec, task: TaskSpec) -> list[Observation]:
    """The read observations of the whole reference, replayed."""
    return [o for o in replay(env, task.reference.calls, "").calls if o.read_only]


def _blocking_evidence(pair: PairSpec, env: EnvironmentSpec, mutated: EnvironmentSpec) -> CheckResult:
    evidence = pair.mutation.evidence
    calls = pair.task.reference.calls
    needle = evidence.contains.casefold()
    shown = [o for o in read_observations(env, pair.task) if needle in o.text.casefold()]
    if shown:
        return CheckResult(name="blocking_evidence", passed=False, detail=f"the feasible side shows {evidence.contains!r} too, via {shown[0].tool}({shown[0].args})")
    first_write, outcome = reads_before_write(mutated, calls)
    for i, obs in enumerate(outcome.calls):
        if obs.tool == evidence.tool and needle in obs.text.casefold():
            return CheckResult(
                name="blocking_evidence", passed=True, detail=f"reference call {i + 1} ({obs.tool}) shows {evidence.contains!r}; no feasible observation does"
            )
    where = f"the {first_write} reads before the first write" if first_write < len(calls) else f"all {len(calls)} reference calls"
    return CheckResult(name="blocking_evidence", passed=False, detail=f"no {evidence.tool} observation containing {evidence.contains!r} in {where}")


def _no_rescue(pair: PairSpec, env: EnvironmentSpec, mutated: EnvironmentSpec, budget: int) -> CheckResult:
    witness = pair.mutation.witness
    bad = rescue_search(mutated, pair.task, witness, budget)
    if bad.found is not None:
        return CheckResult(name="no_rescue", passed=False, detail=f"rescue route: {bad.found.tool}({bad.found.args}) shows a witness")
    if not bad.exhausted:
        return CheckResult(name="no_rescue", passed=False, detail=f"search budget of {budget} read calls spent before the search was exhausted: no proof that no route exists")
    detail = f"no witness in {bad.calls} read calls (exhausted)"
    if pair.mutation.category in UNRESOLVABLE:
        return CheckResult(name="no_rescue", passed=True, detail=detail)
    good = rescue_search(env, pair.task, witness, budget)
    if good.found is None:
        return CheckResult(name="no_rescue", passed=False, detail=f"{detail}, but the witness is not found on the feasible side either ({good.calls} calls): it tests nothing")
    return CheckResult(name="no_rescue", passed=True, detail=f"{detail}; feasible side shows it via {good.found.tool} after {good.calls} calls")


def _ambiguity(pair: PairSpec, env: EnvironmentSpec, mutated: EnvironmentSpec, budget: int) -> CheckResult:
    pattern = pair.mutation.candidates or {}
    keys = sorted(k for k, v in pattern.items() if v == ANY)
    if not keys:
        return CheckResult(name="ambiguity", passed=False, detail='mutation.candidates: the identifying details, with "*" on the keys that tell entities apart, are not declared')
    counts = []
    for side, spec, wanted in (("infeasible", mutated, "two or more"), ("feasible", env, "exactly one")):
        seen, search = _candidates(spec, pair.task, pattern, keys, budget)
        if not search.exhausted:
            return CheckResult(name="ambiguity", passed=False, detail=f"{side} search spent its budget of {budget} read calls before it was exhausted")
        counts.append(f"{len(seen)} on the {side} side ({search.calls} calls)")
        if (len(seen) < 2) if side == "infeasible" else (len(seen) != 1):
            return CheckResult(name="ambiguity", passed=False, detail=f"{pattern} matches {'; '.join(counts)}; want {wanted}: {sorted(seen)}")
    return CheckResult(name="ambiguity", passed=True, detail=f"entities matching {pattern}: {', '.join(counts)}")


def _candidates(spec: EnvironmentSpec, task: TaskSpec, pattern: dict, keys: list[str], budget: int) -> tuple[set[str], RescueResult]:
    """The distinct `keys` values of the records matching `pattern` that the search observes."""
    seen: set[str] = set()
    named: set[str] = set()

    def collect(obs: Observation) -> bool:
        for o in objects(obs.output if obs.ok else ()):
            if _mentions(pattern, o):
                seen.add(json.dumps([o[k] for k in keys], default=str))
        if not obs.ok and len(keys) == 1 and all(_mention(v, obs.message) for v in pattern.values() if v != ANY):
            named.update(tokens(obs.message))
        return False

    search = explore(spec, task, collect, budget)
    # a refusal naming the matches ("'Greenfield, CA' matches 2 points: MTR-PT-0733; HNX-PT-0649")
    # shows them too: its identifiers shaped like those the matching records carry
    shapes = {_shape(json.loads(s)[0]) for s in seen}
    return seen | {json.dumps([t]) for t in named if _shape(t) in shapes}, search


def _conflict(pair: PairSpec, env: EnvironmentSpec, mutated: EnvironmentSpec) -> CheckResult:
    patterns = pair.mutation.conflict
    _, outcome = reads_before_write(mutated, pair.task.reference.calls)
    bad = [p for p in patterns if _shown(p, outcome.calls)]
    good = [p for p in patterns if _shown(p, read_observations(env, pair.task))]
    failures = [f"the infeasible reference path never shows {p}" for p in patterns if p not in bad]
    if len(good) != 1:
        failures.append(f"the feasible reference path shows {len(good)} of the conflicting values ({good}); want exactly one")
    return _result("conflict", failures, f"infeasible side shows all {len(patterns)} conflicting values; feasible side only {good[0] if good else None}")


def _shown(pattern: dict, observations: list[Observation] | tuple[Observation, ...]) -> bool:
    return any(o.ok and any(_mentions(pattern, x) for x in objects(o.output)) for o in observations)


def _mentions(pattern: dict, value: object) -> bool:
    """`matches`, except that a text detail need only appear as words in the
    field ("Reilly" in "Reilly & Sons Plumbing"), as an instruction names things."""
    if not isinstance(value, dict):
        return False
    for key, want in pattern.items():
        got = value.get(key)
        if isinstance(want, dict):
            ok = _mentions(want, got)
        elif isinstance(want, str) and want != ANY and isinstance(got, str):
            ok = _mention(want, got)
        else:
            ok = key in value and equal(want, got)
        if not ok:
            return False
    return True


def _shape(value: object) -> str:
    return re.sub(r"\d", "9", re.sub(r"[A-Za-z]", "A", str(value)))


def _mention(detail: object, text: str) -> bool:
    return isinstance(detail, str) and re.search(rf"(?<!\w){re.escape(detail)}(?!\w)", text, re.IGNORECASE) is not None


def _write_replay(task: TaskSpec, mutated: EnvironmentSpec) -> CheckResult:
    """The reference writes replayed on the infeasible side: each is refused by
    its tool, caught by the commit check, or (a step the infeasible side may
    take too, such as declining the other request) not a commit; at least one
    is refused or caught, or doing the task would go unseen."""
    writes = write_tools(mutated)
    outcome = replay(mutated, task.reference.calls, "")
    caught = {id(o) for o in committed(task, outcome.calls, writes)}
    shown, blocked = [], 0
    for obs in outcome.calls:
        if obs.tool not in writes:
            continue
        if not obs.ok:
            shown.append(f"{obs.tool} refused ({obs.error_code})")
        elif id(obs) in caught:
            shown.append(f"{obs.tool} caught by the commit check")
        else:
            shown.append(f"{obs.tool}({obs.args}) succeeds and is no commit")
            continue
        blocked += 1
    if not shown:
        return CheckResult(name="write_replay", passed=True, detail="the reference makes no writes")
    if not blocked:
        return CheckResult(name="write_replay", passed=False, detail=f"no reference write is refused or caught on the infeasible side: {'; '.join(shown)}")
    return CheckResult(name="write_replay", passed=True, detail="; ".join(shown))


def _revert(env: EnvironmentSpec, task: TaskSpec, applied: Applied) -> CheckResult:
    restored = revert(applied)
    if restored.hash != env.hash:
        return CheckResult(name="revert", passed=False, detail=f"reverted hash {restored.hash} != feasible {env.hash}")
    return _result("revert", _replay_failures(restored, task), f"hash {restored.hash} restored; replay passes")


def _scope(pair: PairSpec, env: EnvironmentSpec, mutated: EnvironmentSpec) -> CheckResult:
    scope = pair.mutation.scope
    changes = diff_rows(env, env.rows, mutated.rows).changes
    failures = [
        f"{c.table} row {c.key!r} changed outside the declared scope"
        for c in changes
        if c.key not in scope.rows.get(c.table, ())
    ]
    tools = {p.tool for p in pair.mutation.tools}
    failures += [f"tool {t} patched outside the declared scope" for t in sorted(tools - set(scope.tools))]
    if not changes and not tools:
        failures.append("the mutation changes nothing")
    return _result("scope", failures, f"{len(changes)} row(s), {len(tools)} tool(s), all in scope")


def control_ops(pair: PairSpec, env: EnvironmentSpec) -> tuple[StateOp, ...]:
    """The declared control, or an edit of a text field in a row the reference never touches.

    Only a plain text value is edited: a number, boolean or json column, or
    text holding JSON, would no longer parse for the tools that read it."""
    if pair.control:
        return pair.control
    outcome = replay(env, pair.task.reference.calls, "")
    seen = " ".join(o.text for o in outcome.calls) + " " + " ".join(str(c.args) for c in pair.task.reference.calls)
    referenced = {c.references.split(".")[1] for t in env.tables for c in t.columns if c.references}
    for table in sorted(env.tables, key=lambda t: -len(env.rows.get(t.name, ()))):
        if table.name in pair.mutation.scope.rows:
            continue
        text_cols = [c.name for c in table.columns if c.type == "text" and c.name != table.primary_key and c.name not in referenced]
        for row in env.rows.get(table.name, ()):
            key = row[table.primary_key]
            col = next((c for c in text_cols if isinstance(row[c], str) and not _json_text(row[c])), None)
            if col and str(key) not in seen:
                return (StateOp(op="set", table=table.name, key=key, fields={col: f"{row[col]} (rev. 2)"}),)
    return ()


def _json_text(value: str) -> bool:
    if not value.lstrip().startswith(("{", "[", '"')):
        return False
    try:
        json.loads(value)
    except json.JSONDecodeError:
        return False
    return True


def _control(pair: PairSpec, env: EnvironmentSpec) -> CheckResult:
    ops = control_ops(pair, env)
    if not ops:
        return CheckResult(name="control", passed=False, detail="no row the reference leaves untouched; declare `control`")
    scoped = [op for op in ops if op.key in pair.mutation.scope.rows.get(op.table, ())]
    if scoped:
        return CheckResult(name="control", passed=False, detail=f"control edits mutation-scope row {scoped[0].key!r}")
    try:
        rows, _ = apply_ops(env, ops, origin="control")
    except SpecError as exc:
        return CheckResult(name="control", passed=False, detail=str(exc))
    controlled = env.model_copy(update={"rows": rows})
    shown = ", ".join(f"{op.table}[{op.key}]" for op in ops)
    broken, calls = _reads_broken(env, controlled, ops)
    failures = broken + _replay_failures(controlled, pair.task)
    return _result("control", failures, f"edit of {shown} keeps the replay passing and {calls} read calls on the edited rows working")


def _reads_broken(env: EnvironmentSpec, controlled: EnvironmentSpec, ops: tuple[StateOp, ...]) -> tuple[list[str], int]:
    """Read calls on the edited rows' values that work before the edit and fail after it."""
    values = Values()
    for op in ops:
        table = controlled.table(op.table)
        key = op.row[table.primary_key] if op.op == "insert" else op.key
        for row in controlled.rows.get(op.table, ()):
            if row[table.primary_key] == key:
                values.harvest(row)
    before, after = EnvInstance(env), EnvInstance(controlled)
    broken, calls = [], 0
    try:
        for tool in tool_infos(env).values():
            if not tool.read_only:
                continue
            for i, args in enumerate(arguments(tool, values)):
                if i >= CONTROL_CALLS:
                    break
                calls += 1
                was, now = before.call(tool.name, args), after.call(tool.name, args)
                if was.ok and not now.ok:
                    broken.append(f"control breaks {tool.name}({args}): {now.error_code}: {now.message}")
    finally:
        before.close(), after.close()
    return broken, calls


def _interface(task: TaskSpec, env: EnvironmentSpec, mutated: EnvironmentSpec) -> CheckResult:
    failures = []
    a, b = EnvInstance(env), EnvInstance(mutated)
    if a.public_tools != b.public_tools:
        failures.append("public tool interfaces differ between sides")
    a.close(), b.close()
    feasible, infeasible = (reads_before_write(side, task.reference.calls)[1].calls for side in (env, mutated))
    changed = [x.tool for x, y in zip(feasible, infeasible) if _seen(x) != _seen(y)]
    if not changed:
        failures.append(f"the mutation changes none of the {len(feasible)} reference reads before the first write")
    for check in task.answer:
        if check.value not in (None, ANY) and states(task.instruction, AnswerCheck(name=check.name, value=check.value, tolerance=check.tolerance)):
            failures.append(f"instruction states the answer value {check.name}={check.value!r}")
    for word in ("infeasible", "abstain", "impossible"):
        if word in task.instruction.casefold():
            failures.append(f"instruction says {word!r}")
    detail = f"same instruction and public tools; {len(changed)} reference read(s) before the first write observe the mutation ({', '.join(dict.fromkeys(changed))}); instruction reveals no answer value"
    return _result("interface", failures, detail)


def _seen(obs: Observation) -> tuple:
    return (obs.ok, json.dumps(obs.output, sort_keys=True), obs.error_code, obs.message)

