"""Programmatic certification of a matched pair (HERA App. B.3).

Each check returns a `CheckResult`; a pair is certified when all pass. The
checks and what they prove are listed in `envs/catalog/README.md`.
"""

from __future__ import annotations

from envs.answers import cut, spans, states
from envs.match import ANY
from envs.mutation import Applied, apply_mutation, apply_ops, revert
from envs.rescue import MAX_CALLS, rescue_search
from envs.runtime import EnvInstance, diff_rows
from envs.spec import SpecError, write_tools
from envs.verify import Outcome, verify
from state.records import (
    AnswerCheck,
    Certification,
    CheckResult,
    EnvironmentSpec,
    PairSpec,
    StateOp,
    TaskSpec,
    ToolCall,
)

# Whose witness is a resolving record that exists on neither side.
UNRESOLVABLE = {"conflicting_records", "ambiguous_entity"}


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
        _blocking_evidence(pair, applied.env),
        _no_rescue(pair, env, applied.env, rescue_budget),
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


def _blocking_evidence(pair: PairSpec, mutated: EnvironmentSpec) -> CheckResult:
    evidence = pair.mutation.evidence
    writes = write_tools(mutated)
    calls = pair.task.reference.calls
    first_write = next((i for i, c in enumerate(calls) if c.tool in writes), len(calls))
    outcome = replay(mutated, calls[:first_write], "")
    for i, obs in enumerate(outcome.calls):
        if obs.tool == evidence.tool and evidence.contains.casefold() in obs.text.casefold():
            return CheckResult(name="blocking_evidence", passed=True, detail=f"reference call {i + 1} ({obs.tool}) shows {evidence.contains!r}")
    where = f"the {first_write} reads before the first write" if first_write < len(calls) else f"all {len(calls)} reference calls"
    return CheckResult(name="blocking_evidence", passed=False, detail=f"no {evidence.tool} observation containing {evidence.contains!r} in {where}")


def _no_rescue(pair: PairSpec, env: EnvironmentSpec, mutated: EnvironmentSpec, budget: int) -> CheckResult:
    witness = pair.mutation.witness
    bad = rescue_search(mutated, pair.task, witness, budget)
    if bad.found is not None:
        return CheckResult(name="no_rescue", passed=False, detail=f"rescue route: {bad.found.tool}({bad.found.args}) shows a witness")
    scope = "exhausted" if bad.exhausted else "budget spent"
    detail = f"no witness in {bad.calls} read calls ({scope})"
    if pair.mutation.category in UNRESOLVABLE:
        return CheckResult(name="no_rescue", passed=True, detail=detail)
    good = rescue_search(env, pair.task, witness, budget)
    if good.found is None:
        return CheckResult(name="no_rescue", passed=False, detail=f"{detail}, but the witness is not found on the feasible side either ({good.calls} calls): it tests nothing")
    return CheckResult(name="no_rescue", passed=True, detail=f"{detail}; feasible side shows it via {good.found.tool} after {good.calls} calls")


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
    """The declared control, or an edit of a text field in a row the reference never touches."""
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
            if text_cols and str(key) not in seen and row[text_cols[0]] is not None:
                col = text_cols[0]
                return (StateOp(op="set", table=table.name, key=key, fields={col: f"{row[col]} (rev. 2)"}),)
    return ()


def _control(pair: PairSpec, env: EnvironmentSpec) -> CheckResult:
    ops = control_ops(pair, env)
    if not ops:
        return CheckResult(name="control", passed=False, detail="no row the reference leaves untouched; declare `control`")
    scoped = [op for op in ops if op.key in pair.mutation.scope.rows.get(op.table, ())]
    if scoped:
        return CheckResult(name="control", passed=False, detail=f"control edits mutation-scope row {scoped[0].key!r}")
    rows, _ = apply_ops(env, ops, origin="control")
    controlled = env.model_copy(update={"rows": rows})
    shown = ", ".join(f"{op.table}[{op.key}]" for op in ops)
    return _result("control", _replay_failures(controlled, pair.task), f"edit of {shown} keeps the replay passing")


def _interface(task: TaskSpec, env: EnvironmentSpec, mutated: EnvironmentSpec) -> CheckResult:
    failures = []
    a, b = EnvInstance(env), EnvInstance(mutated)
    if a.public_tools != b.public_tools:
        failures.append("public tool interfaces differ between sides")
    a.close(), b.close()
    if env.hash == mutated.hash:
        failures.append("both sides have the same content hash")
    for check in task.answer:
        if check.value not in (None, ANY) and states(task.instruction, AnswerCheck(name=check.name, value=check.value, tolerance=check.tolerance)):
            failures.append(f"instruction states the answer value {check.name}={check.value!r}")
    for word in ("infeasible", "abstain", "impossible"):
        if word in task.instruction.casefold():
            failures.append(f"instruction says {word!r}")
    return _result("interface", failures, "same instruction and public tools; instruction reveals no answer value")

