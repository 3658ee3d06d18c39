"""Tools of the Larkspur Residential Management property system snapshot."""

from datetime import date
from typing import Literal, Optional

from envs.toolkit import ToolError, find, one, read_tool, write_tool

TODAY = "2026-04-15"
FISCAL_YEAR = 2026
Trade = Literal["plumbing", "electrical", "hvac", "appliance", "roofing", "general"]
OPEN_WORK = ("scheduled", "in_progress")


def _unavailable(field: str) -> dict:
    return {"error": "required_field_unavailable", "field": field, "scope": "current_snapshot", "recoverable": False}


def _tenant_name(db, tenant_id: Optional[str]) -> Optional[str]:
    if tenant_id is None:
        return None
    t = one(db, "tenants", tenant_id=tenant_id)
    return f"{t['first_name']} {t['last_name']}"


def _committed(db, line: dict) -> float:
    return round(sum(w["not_to_exceed"] for w in find(db, "work_orders", budget_line_id=line["budget_line_id"])
                     if w["status"] in OPEN_WORK), 2)


def _remaining(db, line: dict) -> float:
    return round(line["annual_amount"] - line["spent_to_date"] - _committed(db, line), 2)


def _iso(value: str, field: str) -> str:
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError:
        raise ToolError("invalid_date", f"{field} must be a date in YYYY-MM-DD form.") from None


@read_tool
def search_directory(db, query: str) -> dict:
    """Searches the directory for buildings (by name or street address),
    tenants (by first or last name) and units (by unit number or unit id).
    Tenants are returned with their unit and the status of their lease.

    Args:
        query: A building name, street, tenant name or unit number, e.g. "Linden Row", "Brooks", "108".
    """
    q = query.strip().casefold()
    if not q:
        raise ToolError("invalid_query", "Give a name, street or unit number to search for.")
    buildings = {b["building_id"]: b for b in find(db, "buildings")}
    units = {u["unit_id"]: u for u in find(db, "units")}
    out_b = [{k: b[k] for k in ("building_id", "name", "address")} for b in buildings.values()
             if q in b["name"].casefold() or q in b["address"].casefold()]
    out_u = [{"unit_id": u["unit_id"], "building_id": u["building_id"], "building": buildings[u["building_id"]]["name"],
              "unit_number": u["unit_number"], "status": u["status"]}
             for u in units.values() if q in (u["unit_number"].casefold(), u["unit_id"].casefold())]
    out_t = []
    for t in find(db, "tenants"):
        full = f"{t['first_name']} {t['last_name']}".casefold()
        if q not in full and q != t["tenant_id"].casefold():
            continue
        leases = [l for l in find(db, "leases") if t["tenant_id"] in (l["primary_tenant_id"], l["co_tenant_id"])]
        for l in sorted(leases, key=lambda l: l["start_date"], reverse=True)[:1]:
            u = units[l["unit_id"]]
            out_t.append({"tenant_id": t["tenant_id"], "name": f"{t['first_name']} {t['last_name']}",
                          "unit_id": u["unit_id"], "building": buildings[u["building_id"]]["name"],
                          "lease_id": l["lease_id"], "lease_status": l["status"]})
    return {"buildings": out_b[:10], "units": out_u[:20], "tenants": out_t[:20]}


@read_tool
def get_building(db, building_id: str) -> dict:
    """Returns a building's details (owner, delegated spending limit, property
    manager), its units, its fiscal-year 2026 budget lines with what remains
    on each after spending and open work orders, the owner approvals on file
    for larger jobs, and open maintenance requests for common areas.

    Args:
        building_id: A building id such as "BLD-QQQ".
    """
    b = one(db, "buildings", building_id=building_id)
    view = dict(b)
    view["units"] = [{k: u[k] for k in ("unit_id", "unit_number", "bedrooms", "status")}
                     for u in find(db, "units", building_id=building_id)]
    view["budget_lines"] = [
        {"budget_line_id": l["budget_line_id"], "fiscal_year": l["fiscal_year"], "category": l["category"],
         "annual_amount": l["annual_amount"], "spent_to_date": l["spent_to_date"],
         "open_work_orders": _committed(db, l),
         "remaining": _remaining(db, l)}
        for l in find(db, "budget_lines", building_id=building_id)
    ]
    view["owner_approvals"] = [
        {k: a[k] for k in ("approval_id", "scope", "amount_cap", "status", "granted_on", "granted_by", "revoked_on", "note")}
        for a in find(db, "owner_approvals", building_id=building_id)
    ]
    view["common_area_requests"] = [
        {k: r[k] for k in ("request_id", "category", "description", "priority", "reported_on", "status")}
        for r in find(db, "maintenance_requests", building_id=building_id) if r["unit_id"] is None
        and r["status"] in ("open", "scheduled")
    ]
    return view


@read_tool
def get_unit(db, unit_id: str) -> dict:
    """Returns a unit's details, its leases (current, upcoming and past, with
    tenant names, rent, deposit and when it was received), its inspection
    history (type, date, inspector, result, damage charges, notes) and its
    maintenance requests.

    Args:
        unit_id: A unit id such as "LIN-999".
    """
    u = one(db, "units", unit_id=unit_id)
    b = one(db, "buildings", building_id=u["building_id"])
    view = dict(u)
    view["building"] = b["name"]
    view["leases"] = [
        {"lease_id": l["lease_id"], "tenants": [n for n in (_tenant_name(db, l["primary_tenant_id"]), _tenant_name(db, l["co_tenant_id"])) if n],
         "primary_tenant_id": l["primary_tenant_id"], "start_date": l["start_date"], "end_date": l["end_date"],
         "monthly_rent": l["monthly_rent"], "deposit_amount": l["deposit_amount"],
         "deposit_received_on": l["deposit_received_on"], "status": l["status"]}
        for l in sorted(find(db, "leases", unit_id=unit_id), key=lambda l: l["start_date"], reverse=True)
    ]
    view["inspections"] = [
        {k: i[k] for k in ("inspection_id", "inspection_type", "inspected_on", "inspector", "result", "damage_charges", "notes")}
        for i in sorted(find(db, "inspections", unit_id=unit_id), key=lambda i: i["inspected_on"], reverse=True)
    ]
    view["maintenance_requests"] = [
        {"request_id": r["request_id"], "category": r["category"], "description": r["description"],
         "reported_by": _tenant_name(db, r["tenant_id"]), "reported_on": r["reported_on"], "status": r["status"]}
        for r in find(db, "maintenance_requests", unit_id=unit_id)
    ]
    return view


@read_tool
def get_maintenance_request(db, request_id: str) -> dict:
    """Returns a maintenance request in full (building, unit, reporting
    tenant, category, description, priority, permission to enter, status),
    every contractor quote received for it (amount, earliest start date,
    validity) and any work orders already issued.

    Args:
        request_id: A request id such as "MR-26-9999".
    """
    r = one(db, "maintenance_requests", request_id=request_id)
    view = dict(r)
    view["building"] = one(db, "buildings", building_id=r["building_id"])["name"]
    view["reported_by"] = _tenant_name(db, r["tenant_id"])
    names = {c["contractor_id"]: c["name"] for c in find(db, "contractors")}
    view["quotes"] = [
        {"quote_id": q["quote_id"], "contractor_id": q["contractor_id"], "contractor": names[q["contractor_id"]],
         "amount": q["amount"], "earliest_start": q["earliest_start"], "valid_until": q["valid_until"],
         "submitted_on": q["submitted_on"], "scope_note": q["scope_note"]}
        for q in find(db, "quotes", request_id=request_id)
    ]
    view["work_orders"] = [
        {k: w[k] for k in ("work_order_id", "contractor_id", "scheduled_date", "not_to_exceed", "budget_line_id", "status")}
        for w in find(db, "work_orders", request_id=request_id)
    ]
    return view


@read_tool
def find_contractors(db, trade: Trade) -> list[dict]:
    """Lists the contractors of a trade on our vendor list: vendor status,
    licence number (status must be checked with the licence registry),
    phone, and the certificate of insurance on file (insurer, policy number,
    general liability limits, workers' compensation, effective and expiry
    dates).

    Args:
        trade: plumbing, electrical, hvac, appliance, roofing or general.
    """
    out = []
    for c in find(db, "contractors", trade=trade):
        view = {k: c[k] for k in ("contractor_id", "name", "trade", "status", "licence_number", "phone", "vendor_since")}
        certs = sorted(find(db, "insurance_certificates", contractor_id=c["contractor_id"]), key=lambda x: x["expires_on"])
        if certs:
            cert = certs[-1]
            coi = {k: cert[k] for k in ("certificate_id", "insurer", "policy_number", "effective_on", "expires_on", "received_on")}
            coi["workers_comp"] = bool(cert["workers_comp"])
            for field in ("gl_per_occurrence", "gl_aggregate"):
                coi[field] = cert[field] if cert[field] is not None else _unavailable(field)
            view["insurance"] = coi
        else:
            view["insurance"] = None
        out.append(view)
    return out


@read_tool
def check_licence(db, licence_number: str) -> dict:
    """Looks a licence up in the Oregon Construction Contractors Board
    registry: holder, licence type and endorsements, registry status
    (ACTIVE, SUSPENDED, EXPIRED, REVOKED), issue and expiry dates and bond.

    Args:
        licence_number: A CCB licence number such as "CCB-999999".
    """
    row = one(db, "licence_registry", licence_number=licence_number.strip().upper())
    return {k: row[k] for k in ("licence_number", "holder_name", "board", "licence_type", "endorsements",
                                "registry_status", "issued_on", "expires_on", "bond_amount")}


@write_tool
def create_work_order(
    db,
    request_id: str,
    contractor_id: str,
    scheduled_date: str,
    not_to_exceed: float,
    budget_line_id: str,
    approval_id: Optional[str] = None,
) -> dict:
    """Issues a work order to a contractor for a maintenance request, commits
    the not-to-exceed amount against a budget line and marks the request
    scheduled. Checks that the request is open, the contractor is approved,
    the budget line belongs to the request's building and category with
    enough remaining, and that work above the building's delegated spending
    limit names an owner approval of that building with a sufficient cap.
    Licence, insurance and the approval's current standing are the
    operator's responsibility under the vendor policy.

    Args:
        request_id: The maintenance request.
        contractor_id: The contractor to dispatch.
        scheduled_date: The work date, YYYY-MM-DD.
        not_to_exceed: The not-to-exceed amount in dollars.
        budget_line_id: The budget line to charge.
        approval_id: The owner approval, needed above the building's delegated spending limit.
    """
    req = one(db, "maintenance_requests", request_id=request_id)
    if req["status"] != "open":
        raise ToolError("request_not_open", f"{request_id} is {req['status']}.")
    c = one(db, "contractors", contractor_id=contractor_id)
    if c["status"] != "approved":
        raise ToolError("vendor_not_approved", f"{c['name']} is {c['status']} on the vendor list.")
    when = _iso(scheduled_date, "scheduled_date")
    if when < TODAY:
        raise ToolError("invalid_date", "A work order cannot be scheduled in the past.")
    if not_to_exceed <= 0:
        raise ToolError("invalid_amount", "The not-to-exceed amount must be positive.")
    line = one(db, "budget_lines", budget_line_id=budget_line_id)
    if line["building_id"] != req["building_id"] or line["category"] != req["category"] or line["fiscal_year"] != FISCAL_YEAR:
        raise ToolError("wrong_budget_line", f"{budget_line_id} is not the FY{FISCAL_YEAR} {req['category']} line of {req['building_id']}.")
    remaining = _remaining(db, line)
    if not_to_exceed > remaining:
        raise ToolError("over_budget", f"Only {remaining:,.2f} remains on {budget_line_id}.")
    building = one(db, "buildings", building_id=req["building_id"])
    if not_to_exceed > building["delegated_spend_limit"]:
        if not approval_id:
            raise ToolError("owner_approval_required", f"Work above {building['delegated_spend_limit']:,.2f} needs an owner approval id.")
        appr = one(db, "owner_approvals", approval_id=approval_id)
        if appr["building_id"] != req["building_id"] or appr["amount_cap"] < not_to_exceed:
            raise ToolError("approval_mismatch", f"{approval_id} does not cover {not_to_exceed:,.2f} at {req['building_id']}.")
    numbers = [int(w["work_order_id"].rsplit("-", 1)[1]) for w in find(db, "work_orders")]
    work_order_id = f"WO-26-{max(numbers, default=300) + 1:04d}"
    db["work_orders"].insert({
        "work_order_id": work_order_id, "request_id": request_id, "contractor_id": contractor_id, "scheduled_date": when,
        "not_to_exceed": not_to_exceed, "budget_line_id": budget_line_id, "approval_id": approval_id,
        "status": "scheduled", "created_on": TODAY,
    })
    db["maintenance_requests"].update(request_id, {"status": "scheduled"})
    return {"work_order_id": work_order_id, "status": "scheduled", "contractor": c["name"], "scheduled_date": when,
            "not_to_exceed": not_to_exceed, "budget_line_id": budget_line_id,
            "budget_remaining_after": round(remaining - not_to_exceed, 2)}


@write_tool
def schedule_move_in(db, lease_id: str, move_in_date: str, inspection_id: str) -> dict:
    """Books the move-in and key release for a signed lease, relying on a
    turnover inspection of the unit. Checks that the lease is signed and not
    yet booked, that the date is the lease's start date, and that the
    inspection is a passed turnover inspection of the same unit. The
    inspection's freshness and the deposit are the operator's responsibility
    under the move-in policy.

    Args:
        lease_id: The signed lease.
        move_in_date: The move-in date, YYYY-MM-DD.
        inspection_id: The turnover inspection relied on.
    """
    lease = one(db, "leases", lease_id=lease_id)
    if lease["status"] != "signed":
        raise ToolError("lease_not_signed", f"{lease_id} is {lease['status']}.")
    if find(db, "move_ins", lease_id=lease_id):
        raise ToolError("duplicate", f"A move-in is already booked for {lease_id}.")
    when = _iso(move_in_date, "move_in_date")
    if when != lease["start_date"]:
        raise ToolError("wrong_date", f"The move-in must be on the lease start date {lease['start_date']}.")
    ins = one(db, "inspections", inspection_id=inspection_id)
    if ins["unit_id"] != lease["unit_id"] or ins["inspection_type"] != "turnover" or ins["result"] != "pass":
        raise ToolError("invalid_inspection", f"{inspection_id} is not a passed turnover inspection of {lease['unit_id']}.")
    numbers = [int(m["move_in_id"].split("-")[1]) for m in find(db, "move_ins")]
    move_in_id = f"MI-{max(numbers, default=0) + 1:04d}"
    db["move_ins"].insert({
        "move_in_id": move_in_id, "lease_id": lease_id, "unit_id": lease["unit_id"], "move_in_date": when,
        "inspection_id": inspection_id, "keys_released_by": "Larkspur front office", "created_on": TODAY,
    })
    return {"move_in_id": move_in_id, "lease_id": lease_id, "unit_id": lease["unit_id"], "move_in_date": when,
            "inspection_id": inspection_id}
