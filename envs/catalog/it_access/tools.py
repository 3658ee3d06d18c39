"""Tools of the Calder & Finch Logistics identity and access-management desk."""

import datetime as dt
from typing import Literal

from envs.toolkit import ToolError, find, one, read_tool, write_tool

TODAY = dt.date(2026, 3, 11)


def _unavailable(field: str) -> dict:
    return {"error": "required_field_unavailable", "field": field, "scope": "current_snapshot", "recoverable": False}


def _date(value: str, name: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except (TypeError, ValueError):
        raise ToolError("invalid_date", f"{name} must be a date in YYYY-MM-DD form (got {value!r}).") from None


def _name(db, user_id):
    rows = find(db, "users", user_id=user_id) if user_id else []
    return rows[0]["full_name"] if rows else None


@read_tool
def find_users(db, name: str | None = None, department: str | None = None) -> list[dict]:
    """Searches the corporate directory. Returns every account whose full name or
    username contains `name` (case-insensitive) and, if given, whose department
    matches; with no filters, lists the whole directory.

    Args:
        name: Part of a person's name or username, for example "Raman".
        department: Department name, for example "Finance".
    """
    out = []
    for u in find(db, "users"):
        if name and name.strip().casefold() not in u["full_name"].casefold() and name.strip().casefold() not in u["username"].casefold():
            continue
        if department and department.strip().casefold() != u["department"].casefold():
            continue
        out.append({k: u[k] for k in ("user_id", "username", "full_name", "department", "title", "status")})
    return out


@read_tool
def get_user(db, user_id: str) -> dict:
    """Returns a user's directory profile: contact details, department, title and
    manager, employment type (employee or contractor) with the contract end date
    for contractors, account status, group memberships, training completions and
    the IT tickets concerning the user.

    Args:
        user_id: A user id such as "u99999".
    """
    u = one(db, "users", user_id=user_id)
    profile = {k: u[k] for k in ("user_id", "username", "full_name", "email", "department", "title")}
    profile["manager"] = {"user_id": u["manager_id"], "full_name": _name(db, u["manager_id"])} if u["manager_id"] else None
    profile["employment_type"] = u["employment_type"]
    if u["employment_type"] == "contractor":
        profile["contract_end"] = u["contract_end"] if u["contract_end"] is not None else _unavailable("contract_end")
    else:
        profile["contract_end"] = None
    profile.update({k: u[k] for k in ("status", "termination_date", "location", "hire_date")})
    profile["groups"] = [{"group_id": m["group_id"], "added_on": m["added_on"]} for m in find(db, "group_members", user_id=user_id)]
    profile["training"] = [
        {k: t[k] for k in ("record_id", "course", "completed_on", "expires_on")} for t in find(db, "training_records", user_id=user_id)
    ]
    profile["tickets"] = [
        {k: t[k] for k in ("ticket_id", "type", "subject", "user_id", "opened_on", "status")} for t in find(db, "tickets", user_id=user_id)
    ]
    return profile


@read_tool
def list_user_grants(db, user_id: str) -> dict:
    """Lists every access grant a user holds or held (active, expired or revoked),
    with the role, the system it belongs to, the role's maximum grant duration,
    and the grant and expiry dates. Served by the entitlement aggregation service.

    Args:
        user_id: A user id such as "u99999".
    """
    one(db, "users", user_id=user_id)
    grants = []
    for g in find(db, "access_grants", user_id=user_id):
        role = one(db, "roles", role_id=g["role_id"])
        system = one(db, "systems", system_id=role["system_id"])
        grants.append({
            "grant_id": g["grant_id"], "user_id": g["user_id"], "role_id": g["role_id"], "role_name": role["name"],
            "system_id": system["system_id"], "system_name": system["name"], "role_max_days": role["max_days"],
            "granted_on": g["granted_on"], "expires_on": g["expires_on"], "status": g["status"], "revoked_on": g["revoked_on"],
        })
    return {"user_id": user_id, "as_of": TODAY.isoformat(), "grants": grants}


@read_tool
def list_access_requests(db, user_id: str) -> list[dict]:
    """Lists the access requests raised for a user, newest first, each with the
    requested role, its required approval steps, and every approval decision
    (approver, decision, date, comment).

    Args:
        user_id: The user the access was requested for, such as "u99999".
    """
    one(db, "users", user_id=user_id)
    out = []
    for r in sorted(find(db, "access_requests", user_id=user_id), key=lambda r: r["submitted_on"], reverse=True):
        role = one(db, "roles", role_id=r["role_id"])
        approvals = [
            {"approval_id": a["approval_id"], "step": a["step"], "approver_id": a["approver_id"],
             "approver_name": _name(db, a["approver_id"]), "decision": a["decision"], "decided_on": a["decided_on"],
             "comment": a["comment"]}
            for a in find(db, "approvals", request_id=r["request_id"])
        ]
        out.append({
            "request_id": r["request_id"], "role_id": r["role_id"], "role_name": role["name"], "system_id": role["system_id"],
            "privileged": bool(role["privileged"]), "approvals_required": role["approvals_required"].split(","),
            "requested_by": r["requested_by"], "submitted_on": r["submitted_on"], "duration_days": r["duration_days"],
            "justification": r["justification"], "status": r["status"], "approvals": approvals,
        })
    return out


@read_tool
def search_catalog(db, query: str) -> dict:
    """Searches the access catalog: systems (with owner and current service
    status), roles (privileged flag, maximum duration, required approvals) and
    directory groups (privileged flag, training requirement, owner). Every word
    of the query must appear in the entry's id, name, description or system name.

    Args:
        query: Words to look for, for example "wiki editor" or "looker".
    """
    words = [w.casefold() for w in query.split() if w.strip()]
    if not words:
        raise ToolError("invalid_query", "Give at least one word to search for.")
    systems = {s["system_id"]: s for s in find(db, "systems")}

    def hit(*texts):
        blob = " ".join(t for t in texts if t).casefold()
        return all(w in blob for w in words)

    out = {"systems": [], "roles": [], "groups": []}
    for s in systems.values():
        if hit(s["system_id"], s["name"]):
            out["systems"].append({
                "system_id": s["system_id"], "name": s["name"], "owner_id": s["owner_id"], "owner_name": _name(db, s["owner_id"]),
                "criticality": s["criticality"], "status": s["status"], "status_note": s["status_note"],
            })
    for r in find(db, "roles"):
        s = systems[r["system_id"]]
        if hit(r["role_id"], r["name"], s["system_id"], s["name"]):
            out["roles"].append({
                "role_id": r["role_id"], "name": r["name"], "system_id": s["system_id"], "system_name": s["name"],
                "privileged": bool(r["privileged"]), "max_days": r["max_days"], "approvals_required": r["approvals_required"].split(","),
            })
    for g in find(db, "groups"):
        s = systems.get(g["system_id"]) if g["system_id"] else None
        if hit(g["group_id"], g["description"], s and s["system_id"], s and s["name"]):
            out["groups"].append({
                "group_id": g["group_id"], "description": g["description"], "system_id": g["system_id"],
                "owner_id": g["owner_id"], "owner_name": _name(db, g["owner_id"]), "privileged": bool(g["privileged"]),
                "requires_training": bool(g["requires_training"]),
                "member_count": len(find(db, "group_members", group_id=g["group_id"])),
            })
    return out


def _next_grant_id(db) -> str:
    numbers = [int(g["grant_id"].split("-")[1]) for g in find(db, "access_grants")]
    return f"AG-{max(numbers) + 1}"


@write_tool
def provision_access(db, request_id: str) -> dict:
    """Provisions the role of an approved access request: creates the grant,
    starting today and running for the requested duration (capped at the role's
    maximum), and marks the request fulfilled.

    Args:
        request_id: The access request to fulfil, such as "REQ-99999".
    """
    req = one(db, "access_requests", request_id=request_id)
    if req["status"] != "approved":
        raise ToolError("not_approved", f"Request {request_id} has status {req['status']!r}; only approved requests can be provisioned.")
    user = one(db, "users", user_id=req["user_id"])
    if user["status"] != "active":
        raise ToolError("user_inactive", f"User {user['user_id']} is {user['status']}.")
    role = one(db, "roles", role_id=req["role_id"])
    if find(db, "access_grants", user_id=user["user_id"], role_id=role["role_id"], status="active"):
        raise ToolError("duplicate_grant", f"{user['user_id']} already holds an active {role['role_id']} grant.")
    days = min(req["duration_days"], role["max_days"])
    expires = TODAY + dt.timedelta(days=days)
    if user["employment_type"] == "contractor" and user["contract_end"] and expires > dt.date.fromisoformat(user["contract_end"]):
        expires = dt.date.fromisoformat(user["contract_end"])
    grant_id = _next_grant_id(db)
    db["access_grants"].insert({
        "grant_id": grant_id, "user_id": user["user_id"], "role_id": role["role_id"], "granted_on": TODAY.isoformat(),
        "expires_on": expires.isoformat(), "status": "active", "request_id": request_id, "revoked_on": None, "change_ticket": None,
    })
    db["access_requests"].update(request_id, {"status": "fulfilled"})
    return {"grant_id": grant_id, "user_id": user["user_id"], "role_id": role["role_id"], "granted_on": TODAY.isoformat(),
            "expires_on": expires.isoformat(), "request_status": "fulfilled"}


@write_tool
def modify_grant(
    db, grant_id: str, action: Literal["revoke", "extend"], ticket_id: str, new_expires_on: str | None = None
) -> dict:
    """Revokes an active access grant, or extends its expiry date. Every change
    must cite an open IT ticket concerning the grant's user.

    Args:
        grant_id: The grant to change, such as "AG-24135".
        action: "revoke" to end the grant today, "extend" to move its expiry date later.
        ticket_id: The open ticket authorising the change, such as "IT-58011".
        new_expires_on: For "extend", the new expiry date (YYYY-MM-DD); at most the role's maximum duration from today.
    """
    grant = one(db, "access_grants", grant_id=grant_id)
    if grant["status"] != "active":
        raise ToolError("grant_not_active", f"Grant {grant_id} is {grant['status']}.")
    ticket = one(db, "tickets", ticket_id=ticket_id)
    if ticket["status"] not in ("open", "in_progress"):
        raise ToolError("ticket_closed", f"Ticket {ticket_id} is {ticket['status']}; cite an open ticket.")
    if ticket["user_id"] != grant["user_id"]:
        raise ToolError("ticket_mismatch", f"Ticket {ticket_id} does not concern the holder of {grant_id}.")
    if action == "revoke":
        db["access_grants"].update(grant_id, {"status": "revoked", "revoked_on": TODAY.isoformat(), "change_ticket": ticket_id})
        return {"grant_id": grant_id, "status": "revoked", "revoked_on": TODAY.isoformat(), "change_ticket": ticket_id}
    if new_expires_on is None:
        raise ToolError("missing_argument", "An extension needs new_expires_on.")
    new = _date(new_expires_on, "new_expires_on")
    role = one(db, "roles", role_id=grant["role_id"])
    user = one(db, "users", user_id=grant["user_id"])
    if user["status"] != "active":
        raise ToolError("user_inactive", f"User {user['user_id']} is {user['status']}.")
    if new <= dt.date.fromisoformat(grant["expires_on"]):
        raise ToolError("not_an_extension", f"{new_expires_on} is not after the current expiry {grant['expires_on']}.")
    if new > TODAY + dt.timedelta(days=role["max_days"]):
        raise ToolError("exceeds_max_duration", f"{role['role_id']} may be granted for at most {role['max_days']} days from today.")
    if user["contract_end"] and new > dt.date.fromisoformat(user["contract_end"]):
        raise ToolError("beyond_contract_end", "The new expiry falls after the contractor's contract end date.")
    db["access_grants"].update(grant_id, {"expires_on": new.isoformat(), "change_ticket": ticket_id})
    return {"grant_id": grant_id, "status": "active", "expires_on": new.isoformat(), "change_ticket": ticket_id}


@write_tool
def add_group_member(db, group_id: str, user_id: str, justification: str) -> dict:
    """Adds a user to a directory group.

    Args:
        group_id: The group, such as "SG-Wiki-Editors".
        user_id: The user to add, such as "u99999".
        justification: Why the membership is needed (required).
    """
    group = one(db, "groups", group_id=group_id)
    user = one(db, "users", user_id=user_id)
    if user["status"] != "active":
        raise ToolError("user_inactive", f"User {user_id} is {user['status']}.")
    if find(db, "group_members", group_id=group_id, user_id=user_id):
        raise ToolError("already_member", f"{user_id} is already a member of {group_id}.")
    if not justification.strip():
        raise ToolError("missing_justification", "Give a justification for the membership.")
    numbers = [int(m["membership_id"].split("-")[1]) for m in find(db, "group_members")]
    membership_id = f"GM-{max(numbers) + 1}"
    db["group_members"].insert({"membership_id": membership_id, "group_id": group["group_id"], "user_id": user_id,
                                "added_on": TODAY.isoformat(), "added_by": "u10038"})
    return {"membership_id": membership_id, "group_id": group["group_id"], "user_id": user_id, "added_on": TODAY.isoformat()}
