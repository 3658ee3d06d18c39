"""Apply and revert declarative mutations.

Applying a mutation to an environment yields a new, content-hashed version
whose `parent_hash` names the original, together with the inverse row edits;
`revert` applies those and drops the mutation's tool patches, which must give
back the original hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from envs.spec import SpecError, check_row
from state.records import EnvironmentSpec, Mutation, StateOp, content_hash


@dataclass(frozen=True)
class Applied:
    env: EnvironmentSpec
    inverse: tuple[StateOp, ...]
    patch_count: int


def apply_ops(env: EnvironmentSpec, ops: tuple[StateOp, ...], origin: str = "mutation") -> tuple[dict, tuple[StateOp, ...]]:
    """New rows with `ops` applied, and the ops that undo them (in undo order)."""
    rows = {name: list(table_rows) for name, table_rows in env.rows.items()}
    inverse: list[StateOp] = []
    for i, op in enumerate(ops):
        table = env.table(op.table)
        pk = table.primary_key
        where = f"{origin}.{i}"
        current = rows.setdefault(op.table, [])
        index = next((j for j, r in enumerate(current) if r[pk] == op.key), None)
        if op.op == "insert":
            key = op.row[pk]
            if any(r[pk] == key for r in current):
                raise SpecError(origin, f"{where}.row.{pk}", f"a new key; {key!r} already exists in {op.table}")
            current.append(dict(op.row))
            inverse.append(StateOp(op="delete", table=op.table, key=key))
            continue
        if index is None:
            raise SpecError(origin, f"{where}.key", f"an existing {op.table}.{pk} (got {op.key!r})")
        old = current[index]
        if op.op == "delete":
            del current[index]
            inverse.append(StateOp(op="insert", table=op.table, row=old))
        else:
            new = {**old, **op.fields}
            check_row(origin, where, table, new)
            current[index] = new
            inverse.append(StateOp(op="set", table=op.table, key=op.key, fields={k: old[k] for k in op.fields}))
    return {k: tuple(v) for k, v in rows.items()}, tuple(reversed(inverse))


_applied: dict[tuple[str, str], Applied] = {}


def apply_mutation(env: EnvironmentSpec, mutation: Mutation) -> Applied:
    """The mutated environment, computed once per (environment, mutation)."""
    key = (env.hash, content_hash(mutation.model_dump()))
    if key not in _applied:
        _applied[key] = _apply(env, mutation)
    return _applied[key]


def _apply(env: EnvironmentSpec, mutation: Mutation) -> Applied:
    rows, inverse = apply_ops(env, mutation.state)
    mutated = env.model_copy(update={"rows": rows, "tool_patches": env.tool_patches + mutation.tools, "parent_hash": env.hash})
    return Applied(env=mutated, inverse=inverse, patch_count=len(mutation.tools))


def revert(applied: Applied) -> EnvironmentSpec:
    env = applied.env
    rows, _ = apply_ops(env, applied.inverse, origin="revert")
    patches = env.tool_patches[: len(env.tool_patches) - applied.patch_count]
    return env.model_copy(update={"rows": rows, "tool_patches": patches, "parent_hash": None})
