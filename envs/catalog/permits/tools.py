"""Tools of the Cedar Ridge Permit & Inspection Center snapshot."""

import datetime as _dt
import re
from typing import Literal

from envs.toolkit import ToolError, find, one, read_tool, write_tool

TODAY = "2026-03-17"

PermitType = Literal["building", "roofing", "accessibility", "fence", "demolition", "sign", "electrical", "plumbing", "mechanical"]
Discipline = Literal["building", "electrical", "plumbing", "mechanical"]
InspectionType = Literal[
    "footing", "framing", "roof sheathing", "final building",
    "rough electrical", "final electrical", "rough plumbing", "final plumbing",
    "rough mechanical", "final mechanical",
]
ReleaseField = Literal[
    "site_address", "permit_type", "work_description", "valuation", "status", "issued_on", "contractor", "applicant_name"
]

_SEQUENCES = {
    "building": ["footing", "framing", "final building"],
    "roofing": ["roof sheathing", "final building"],
    "accessibility": ["framing", "final building"],
    "fence": ["final building"],
    "demolition": ["final building"],
    "sign": ["final building"],
    "electrical": ["rough electrical", "final electrical"],
    "plumbing": ["rough plumbing", "final plumbing"],
    "mechanical": ["rough mechanical", "final mechanical"],
}

_SUFFIXES = {
    "street": "st", "avenue": "ave", "road": "rd", "drive": "dr", "court": "ct", "lane": "ln",
    "boulevard": "blvd", "place": "pl", "way": "way",
}


def _discipline(inspection_type: str) -> str:
    for d in ("electrical", "plumbing", "mechanical"):
        if d in inspection_type:
            return d
    return "building"


def _norm_address(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.casefold())
    return " ".join(_SUFFIXES.get(w, w) for w in words)


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.casefold())


def _parcel(db, parcel_id: str) -> dict:
    return one(db, "parcels", parcel_id=parcel_id)


def _summary(db, p: dict) -> dict:
    parcel = _parcel(db, p["parcel_id"])
    applicant = one(db, "applicants", applicant_id=p["applicant_id"])
    return {
        "permit_no": p["permit_no"], "permit_type": p["permit_type"], "work_description": p["work_description"],
        "status": p["status"], "site_address": parcel["address"], "applicant_name": applicant["name"],
        "applied_on": p["applied_on"], "issued_on": p["issued_on"],
    }


@read_tool
def search_permits(
    db,
    applicant_name: str | None = None,
    address: str | None = None,
    permit_type: PermitType | None = None,
    status: str | None = None,
) -> list[dict]:
    """Searches permits and applications by applicant name, site address, permit
    type and/or status, and lists the matches (permit number, type, work,
    status, site address, applicant, application and issue dates). At least one
    filter is required.

    Args:
        applicant_name: The applicant's name or part of it, e.g. "Nwosu" or "Summit Ridge Roofing"; every word must match a whole word of the name.
        address: Part of the site address, e.g. "Juniper Bend Rd" or "4410 Juniper Bend Road".
        permit_type: One of building, roofing, accessibility, fence, demolition, sign, electrical, plumbing, mechanical.
        status: One of submitted, in_review, approved, issued, finaled, expired, withdrawn.
    """
    if not any((applicant_name, address, permit_type, status)):
        raise ToolError("missing_filter", "Give at least one of applicant_name, address, permit_type or status.")
    out = []
    for p in find(db, "permits"):
        if permit_type and p["permit_type"] != permit_type:
            continue
        if status and p["status"] != status.strip().casefold():
            continue
        s = _summary(db, p)
        if address and f" {_norm_address(address)} " not in f" {_norm_address(s['site_address'])} ":
            continue
        if applicant_name:
            have = set(_tokens(s["applicant_name"]))
            if not all(t in have for t in _tokens(applicant_name)):
                continue
        out.append(s)
    return out


@read_tool
def get_permit(db, permit_no: str) -> dict:
    """Returns the full record of a permit or application: work, valuation,
    status and key dates; the parcel (APN, address, zoning, owner); the
    applicant; the contractor named on it; the owner's authorization when an
    agent applied; assessed fees and payments; its inspection history; and the
    public-records releases that included it.

    Args:
        permit_no: A permit number such as "B26-00412".
    """
    p = one(db, "permits", permit_no=permit_no.strip().upper())
    parcel = _parcel(db, p["parcel_id"])
    applicant = one(db, "applicants", applicant_id=p["applicant_id"])
    contractor = None
    if p["contractor_license"]:
        c = one(db, "contractors", license_no=p["contractor_license"])
        contractor = {"license_no": c["license_no"], "business_name": c["business_name"]}
    auths = [
        {k: a[k] for k in ("authorization_id", "owner_name", "signed_on", "status", "revoked_on")}
        for a in find(db, "owner_authorizations", permit_no=p["permit_no"])
    ]
    inspectors = {i["inspector_id"]: i["name"] for i in find(db, "inspectors")}
    inspections = [
        {"inspection_id": i["inspection_id"], "inspection_type": i["inspection_type"], "date": i["date"],
         "inspector": inspectors[i["inspector_id"]], "result": i["result"], "notes": i["notes"]}
        for i in find(db, "inspections", permit_no=p["permit_no"])
    ]
    releases = []
    for r in find(db, "releases"):
        if p["permit_no"] in r["permit_nos"].split(","):
            req = one(db, "records_requests", request_id=r["request_id"])
            releases.append({"release_id": r["release_id"], "request_id": r["request_id"], "requester_id": req["requester_id"],
                             "released_on": r["released_on"], "fields": r["fields"].split(",")})
    return {
        "permit_no": p["permit_no"], "permit_type": p["permit_type"], "work_description": p["work_description"],
        "valuation": p["valuation"], "status": p["status"], "applied_on": p["applied_on"],
        "plan_approved_on": p["plan_approved_on"], "issued_on": p["issued_on"], "expires_on": p["expires_on"],
        "parcel": {k: parcel[k] for k in ("parcel_id", "address", "zoning", "owner_name")} | {"historic_district": bool(parcel["historic_district"])},
        "applicant": applicant,
        "contractor": contractor,
        "owner_authorizations": auths,
        "fees": [{k: f[k] for k in ("fee_id", "description", "amount", "status")} for f in find(db, "fees", permit_no=p["permit_no"])],
        "payments": [{k: x[k] for k in ("payment_id", "paid_on", "amount", "method")} for x in find(db, "payments", permit_no=p["permit_no"])],
        "inspections": inspections,
        "releases": releases,
    }


@read_tool
def get_contractor(db, license_no: str) -> dict:
    """Returns the city's copy of a state contractor licence record: business
    name, classification, licence status and expiry, workers' compensation
    status, and the date the status was last verified with the State
    Contractors Board.

    Args:
        license_no: The state licence number, e.g. "9999999".
    """
    return one(db, "contractors", license_no=license_no.strip())


@read_tool
def list_inspection_slots(db, discipline: Discipline, date_from: str | None = None, date_to: str | None = None) -> list[dict]:
    """Lists the open inspection slots of a discipline, earliest first, with the
    slot id, date, start time and inspector.

    Args:
        discipline: building, electrical, plumbing or mechanical.
        date_from: Optional first date, YYYY-MM-DD.
        date_to: Optional last date, YYYY-MM-DD.
    """
    inspectors = {i["inspector_id"]: i for i in find(db, "inspectors")}
    out = []
    for s in find(db, "inspection_slots", discipline=discipline, status="open"):
        if s["date"] < TODAY or (date_from and s["date"] < date_from) or (date_to and s["date"] > date_to):
            continue
        out.append({"slot_id": s["slot_id"], "discipline": s["discipline"], "date": s["date"], "start_time": s["start_time"],
                    "inspector_id": s["inspector_id"], "inspector": inspectors[s["inspector_id"]]["name"], "status": s["status"]})
    return sorted(out, key=lambda s: (s["date"], s["start_time"], s["inspector_id"]))


@read_tool
def get_records_request(db, request_id: str) -> dict:
    """Returns a public-records request (requester, date received, what was
    asked for, status) together with the requester's other requests and every
    release already made to that requester.

    Args:
        request_id: A request number such as "PRR-9999-0102".
    """
    req = one(db, "records_requests", request_id=request_id.strip().upper())
    requester = one(db, "requesters", requester_id=req["requester_id"])

    def releases_of(request_id: str) -> list[dict]:
        return [
            {"release_id": r["release_id"], "released_on": r["released_on"], "permit_nos": r["permit_nos"].split(","),
             "fields": r["fields"].split(","), "record_count": r["record_count"]}
            for r in find(db, "releases", request_id=request_id)
        ]

    history = [
        {"request_id": r["request_id"], "received_on": r["received_on"], "description": r["description"],
         "status": r["status"], "releases": releases_of(r["request_id"])}
        for r in find(db, "records_requests", requester_id=req["requester_id"])
        if r["request_id"] != req["request_id"]
    ]
    return {
        "request_id": req["request_id"], "requester_id": requester["requester_id"], "requester_name": requester["name"],
        "organization": requester["organization"], "requester_kind": requester["kind"], "received_on": req["received_on"],
        "description": req["description"], "status": req["status"], "releases": releases_of(req["request_id"]),
        "requester_history": history,
    }


@write_tool
def issue_permit(db, permit_no: str) -> dict:
    """Issues an approved permit today: sets its status to issued and its expiry
    date to 180 days from today. Refused unless the permit is approved and
    every assessed fee is paid or waived.

    Args:
        permit_no: The permit number.
    """
    p = one(db, "permits", permit_no=permit_no.strip().upper())
    if p["status"] != "approved":
        raise ToolError("not_approved", f"{p['permit_no']} is {p['status']}; only approved permits can be issued.")
    due = [f for f in find(db, "fees", permit_no=p["permit_no"]) if f["status"] == "due"]
    if due:
        total = sum(f["amount"] for f in due)
        raise ToolError("fees_due", f"{p['permit_no']} has {len(due)} unpaid fee(s) totalling ${total:,.2f}.")
    expires = (_dt.date.fromisoformat(TODAY) + _dt.timedelta(days=180)).isoformat()
    db["permits"].update(p["permit_no"], {"status": "issued", "issued_on": TODAY, "expires_on": expires})
    return {"permit_no": p["permit_no"], "status": "issued", "issued_on": TODAY, "expires_on": expires}


@write_tool
def schedule_inspection(db, permit_no: str, inspection_type: InspectionType, slot_id: str) -> dict:
    """Books an inspection of an issued permit into an open inspection slot of
    the matching discipline. Refused when the permit is not issued or has
    expired, when the inspection is not part of the permit's sequence or the
    one before it has not passed, or when the slot is not open or belongs to
    another discipline.

    Args:
        permit_no: The permit number.
        inspection_type: The inspection to book, e.g. "rough plumbing" or "final building".
        slot_id: An open slot id from list_inspection_slots.
    """
    p = one(db, "permits", permit_no=permit_no.strip().upper())
    if p["status"] != "issued":
        raise ToolError("not_issued", f"{p['permit_no']} is {p['status']}; inspections are booked on issued permits only.")
    if p["expires_on"] and p["expires_on"] < TODAY:
        raise ToolError("expired", f"{p['permit_no']} expired on {p['expires_on']}.")
    sequence = _SEQUENCES[p["permit_type"]]
    if inspection_type not in sequence:
        raise ToolError("wrong_inspection", f"A {p['permit_type']} permit has the inspections {', '.join(sequence)}.")
    history = find(db, "inspections", permit_no=p["permit_no"])
    position = sequence.index(inspection_type)
    if position > 0:
        before = sequence[position - 1]
        if not any(i["inspection_type"] == before and i["result"] == "pass" for i in history):
            raise ToolError("out_of_sequence", f"The {before} inspection of {p['permit_no']} has not passed.")
    if any(i["inspection_type"] == inspection_type and i["result"] in ("scheduled", "pass") for i in history):
        raise ToolError("duplicate", f"A {inspection_type} inspection of {p['permit_no']} is already scheduled or passed.")
    slot = one(db, "inspection_slots", slot_id=slot_id.strip().upper())
    if slot["status"] != "open" or slot["date"] < TODAY:
        raise ToolError("slot_unavailable", f"Slot {slot['slot_id']} is {slot['status']}.")
    if slot["discipline"] != _discipline(inspection_type):
        raise ToolError("wrong_discipline", f"Slot {slot['slot_id']} is a {slot['discipline']} slot; {inspection_type} needs {_discipline(inspection_type)}.")
    numbers = [int(i["inspection_id"].rsplit("-", 1)[1]) for i in find(db, "inspections") if i["inspection_id"].startswith("INS-26-")]
    inspection_id = f"INS-26-{max(numbers, default=0) + 1:05d}"
    db["inspections"].insert({
        "inspection_id": inspection_id, "permit_no": p["permit_no"], "inspection_type": inspection_type, "date": slot["date"],
        "inspector_id": slot["inspector_id"], "slot_id": slot["slot_id"], "result": "scheduled", "notes": "",
    })
    db["inspection_slots"].update(slot["slot_id"], {"status": "booked"})
    inspector = one(db, "inspectors", inspector_id=slot["inspector_id"])
    return {"inspection_id": inspection_id, "permit_no": p["permit_no"], "inspection_type": inspection_type,
            "date": slot["date"], "start_time": slot["start_time"], "inspector": inspector["name"], "slot_id": slot["slot_id"]}


@write_tool
def release_records(db, request_id: str, permit_nos: list[str], fields: list[ReleaseField]) -> dict:
    """Releases the chosen fields of the listed permits to the requester of an
    open public-records request, logs the release and marks the request
    fulfilled.

    Args:
        request_id: The open request being answered.
        permit_nos: The permit numbers to release.
        fields: The fields released for each permit: site_address, permit_type, work_description, valuation, status, issued_on, contractor, applicant_name.
    """
    req = one(db, "records_requests", request_id=request_id.strip().upper())
    if req["status"] != "open":
        raise ToolError("request_closed", f"{req['request_id']} is {req['status']}.")
    wanted = sorted({n.strip().upper() for n in permit_nos})
    if not wanted or not fields:
        raise ToolError("empty_release", "Name at least one permit and one field.")
    for n in wanted:
        one(db, "permits", permit_no=n)
    year = TODAY[:4]
    numbers = [int(r["release_id"].rsplit("-", 1)[1]) for r in find(db, "releases") if r["release_id"].startswith(f"REL-{year}-")]
    release_id = f"REL-{year}-{max(numbers, default=0) + 1:04d}"
    chosen = [f for f in ReleaseField.__args__ if f in set(fields)]
    db["releases"].insert({
        "release_id": release_id, "request_id": req["request_id"], "released_on": TODAY,
        "permit_nos": ",".join(wanted), "fields": ",".join(chosen), "record_count": len(wanted),
    })
    db["records_requests"].update(req["request_id"], {"status": "fulfilled"})
    return {"release_id": release_id, "request_id": req["request_id"], "record_count": len(wanted), "permit_nos": wanted, "fields": chosen}
