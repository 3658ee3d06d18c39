"""Tools of the Harbourview Family Health scheduling and records snapshot."""

import datetime as dt
from typing import Literal, Optional

from envs.toolkit import ToolError, find, one, read_tool, write_tool

TODAY = "2026-03-16"
NOW = "2026-03-16T08:00"
RECORD_TYPES = Literal["appointments", "referrals", "authorizations", "consents", "disclosures"]
RELEASE_ITEMS = Literal["hba1c", "ldl", "egfr", "inr", "birth_year", "sex", "zip3", "visit_history"]
IMAGING = {"MRI", "CT", "X-ray"}


def _unavailable(field: str) -> dict:
    return {"error": "required_field_unavailable", "field": field, "scope": "current_snapshot", "recoverable": False}


def _date(value: str, name: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value[:10])
    except ValueError:
        raise ToolError("invalid_date", f"{name} must be a date written YYYY-MM-DD (got {value!r}).") from None


def _list(text: Optional[str]) -> list[str]:
    return [x for x in (text or "").split(",") if x]


def _patient(db, patient_id: str) -> dict:
    return one(db, "patients", patient_id=patient_id)


@read_tool
def find_patients(db, name: str, date_of_birth: Optional[str] = None) -> list[dict]:
    """Looks up patients by name (any part of the name, case-insensitive) or by
    patient id, optionally narrowed by date of birth. Returns demographics,
    preferred language, insurance plan (with the plan's referral and prior
    authorisation rules), member id and primary care provider.

    Args:
        name: Part of the patient's name, for example "Okafor", or a patient id such as "P-99999".
        date_of_birth: Optional date of birth, YYYY-MM-DD.
    """
    wanted = name.strip().casefold()
    if not wanted:
        raise ToolError("invalid_query", "Give at least part of a name.")
    out = []
    for row in find(db, "patients"):
        if wanted not in row["name"].casefold() and wanted != row["patient_id"].casefold():
            continue
        if date_of_birth and row["date_of_birth"] != date_of_birth.strip():
            continue
        payer = one(db, "payers", payer_id=row["payer_id"])
        pcp = one(db, "providers", provider_id=row["primary_provider_id"])
        out.append(
            {
                "patient_id": row["patient_id"],
                "name": row["name"],
                "date_of_birth": row["date_of_birth"],
                "sex": row["sex"],
                "zip": row["zip"],
                "phone": row["phone"],
                "preferred_language": row["preferred_language"],
                "status": row["status"],
                "insurance": {
                    "payer_id": payer["payer_id"],
                    "plan": payer["name"],
                    "plan_type": payer["plan_type"],
                    "member_id": row["member_id"],
                    "specialist_referral_required": bool(payer["specialist_referral_required"]),
                    "prior_auth_required": bool(payer["prior_auth_required"]),
                },
                "primary_provider": {"provider_id": pcp["provider_id"], "name": pcp["name"]},
            }
        )
    return out


@read_tool
def list_providers(db, specialty: Optional[str] = None, language: Optional[str] = None) -> list[dict]:
    """Lists clinicians and imaging resources with their specialty, credentials,
    spoken languages (ISO codes), the payer networks they are in, whether they
    accept new patients, and their location.

    Args:
        specialty: Optional specialty filter, for example "Podiatry", "MRI" or "Sleep Clinic".
        language: Optional ISO language code the provider must speak, for example "es".
    """
    out = []
    for row in find(db, "providers"):
        if specialty and row["specialty"].casefold() != specialty.strip().casefold():
            continue
        if language and language.strip().casefold() not in _list(row["languages"]):
            continue
        out.append(
            {
                "provider_id": row["provider_id"],
                "name": row["name"],
                "credentials": row["credentials"],
                "kind": row["kind"],
                "specialty": row["specialty"],
                "languages": _list(row["languages"]),
                "networks": _list(row["networks"]),
                "accepting_new_patients": bool(row["accepting_new_patients"]),
                "location": row["location"],
            }
        )
    return out


@read_tool
def list_services(db, specialty: Optional[str] = None) -> list[dict]:
    """Lists the bookable services: internal service code, CPT code, name,
    specialty that performs it, duration, whether it is a specialty service,
    whether it needs payer prior authorisation, and whether it uses IV contrast.

    Args:
        specialty: Optional specialty filter, for example "CT".
    """
    rows = find(db, "services")
    if specialty:
        rows = [r for r in rows if r["specialty"].casefold() == specialty.strip().casefold()]
    for r in rows:
        for k in ("specialty_service", "requires_prior_auth", "iv_contrast"):
            r[k] = bool(r[k])
    return rows


@read_tool
def search_open_slots(db, specialty: str, date_from: str, date_to: str, provider_id: Optional[str] = None) -> list[dict]:
    """Lists the open appointment slots of a specialty between two dates
    (inclusive), earliest first, optionally for a single provider. Booked and
    blocked slots are not shown.

    Args:
        specialty: A specialty such as "Podiatry", "MRI" or "Sleep Clinic".
        date_from: First day, YYYY-MM-DD.
        date_to: Last day, YYYY-MM-DD (at most 45 days after date_from).
        provider_id: Optional provider id such as "CL-999".
    """
    start, end = _date(date_from, "date_from"), _date(date_to, "date_to")
    if end < start or (end - start).days > 45:
        raise ToolError("invalid_range", "date_to must be on or after date_from and at most 45 days later.")
    providers = {p["provider_id"]: p for p in find(db, "providers")}
    if provider_id and provider_id not in providers:
        raise ToolError("not_found", f"No provider with id {provider_id!r}.")
    out = []
    for row in find(db, "slots", status="open"):
        p = providers[row["provider_id"]]
        if provider_id and row["provider_id"] != provider_id:
            continue
        if p["specialty"].casefold() != specialty.strip().casefold():
            continue
        day = dt.date.fromisoformat(row["start"][:10])
        if not (start <= day <= end) or row["start"] < NOW:
            continue
        out.append(
            {
                "slot_id": row["slot_id"],
                "provider_id": row["provider_id"],
                "provider_name": p["name"],
                "start": row["start"],
                "weekday": day.strftime("%A"),
                "duration_min": row["duration_min"],
                "modality": row["modality"],
                "location": row["location"],
                "status": row["status"],
            }
        )
    return sorted(out, key=lambda s: (s["start"], s["provider_id"]))


@read_tool
def get_patient_records(db, patient_id: str, record_type: RECORD_TYPES) -> list[dict]:
    """Returns one kind of a patient's records: appointments (past and future),
    referrals and imaging orders, payer prior authorisations, consents, or the
    log of disclosures (releases of information) made to outside recipients.

    Args:
        patient_id: A patient id such as "P-99999".
        record_type: "appointments", "referrals", "authorizations", "consents" or "disclosures".
    """
    _patient(db, patient_id)
    providers = {p["provider_id"]: p["name"] for p in find(db, "providers")}
    recipients = {r["recipient_id"]: r["name"] for r in find(db, "recipients")}
    if record_type == "appointments":
        services = {s["service_code"]: s["name"] for s in find(db, "services")}
        rows = find(db, "appointments", patient_id=patient_id)
        for r in rows:
            r["provider_name"] = providers[r["provider_id"]]
            r["service_name"] = services[r["service_code"]]
        return sorted(rows, key=lambda r: r["start"])
    if record_type == "referrals":
        rows = find(db, "referrals", patient_id=patient_id)
        for r in rows:
            r["referring_provider_name"] = providers[r["referring_provider_id"]]
        return rows
    if record_type == "authorizations":
        payers = {p["payer_id"]: p["name"] for p in find(db, "payers")}
        rows = find(db, "authorizations", patient_id=patient_id)
        for r in rows:
            r["payer_name"] = payers[r["payer_id"]]
        return rows
    if record_type == "consents":
        rows = find(db, "consents", patient_id=patient_id)
        for r in rows:
            r["recipient_name"] = recipients.get(r["recipient_id"])
            r["scope"] = _list(r["scope"]) if r["consent_type"] != "telehealth" else r["scope"]
        return rows
    rows = find(db, "disclosures", patient_id=patient_id)
    for r in rows:
        r["recipient_name"] = recipients[r["recipient_id"]]
        r["items"] = _list(r["items"])
    return sorted(rows, key=lambda r: r["disclosed_on"])


@read_tool
def get_lab_results(db, patient_id: str, test_code: Optional[str] = None) -> list[dict]:
    """Returns a patient's lab results, most recently collected first, with
    value, unit, reference range, abnormal flag, collection and result dates.

    Args:
        patient_id: A patient id.
        test_code: Optional test code filter, such as "VITD"; leave out for every test.
    """
    _patient(db, patient_id)
    rows = find(db, "lab_results", patient_id=patient_id)
    if test_code:
        rows = [r for r in rows if r["test_code"].casefold() == test_code.strip().casefold()]
    out = []
    for r in rows:
        r = dict(r)
        if r["value"] is None:
            r["value"] = _unavailable("value")
            r["flag"] = _unavailable("flag")
        out.append(r)
    return sorted(out, key=lambda r: (r["collected_on"], r["result_id"]), reverse=True)


def _latest_value(db, patient_id: str, code: str) -> dict:
    rows = [r for r in find(db, "lab_results", patient_id=patient_id, test_code=code.upper())]
    if not rows:
        raise ToolError("item_unavailable", f"No {code.upper()} result on file for {patient_id}.")
    latest = max(rows, key=lambda r: (r["collected_on"], r["result_id"]))
    if latest["value"] is None:
        raise ToolError("item_unavailable", f"The latest {code.upper()} result of {patient_id} has no value.")
    return {"value": latest["value"], "unit": latest["unit"], "collected_on": latest["collected_on"]}


@write_tool
def book_appointment(
    db, patient_id: str, slot_id: str, service_code: str, referral_id: Optional[str] = None, auth_id: Optional[str] = None
) -> dict:
    """Books an open slot for a patient and a service. Specialty services for
    patients whose plan requires referrals, and all imaging services, must cite
    the referral or imaging order; services needing prior authorisation under
    the patient's plan must cite the authorisation. The clinic policy decides
    which documents are usable.

    Args:
        patient_id: The patient to book.
        slot_id: An open slot id from search_open_slots.
        service_code: The internal service code, for example "PODI-NP".
        referral_id: The referral or imaging order the visit is booked under, if any.
        auth_id: The payer prior authorisation the visit is booked under, if any.
    """
    patient = _patient(db, patient_id)
    if patient["status"] != "active":
        raise ToolError("patient_inactive", f"Patient {patient_id} is {patient['status']}.")
    slot = one(db, "slots", slot_id=slot_id)
    if slot["status"] != "open" or slot["start"] < NOW:
        raise ToolError("slot_unavailable", f"Slot {slot_id} is not open.")
    service = one(db, "services", service_code=service_code)
    provider = one(db, "providers", provider_id=slot["provider_id"])
    if provider["specialty"] != service["specialty"]:
        raise ToolError("wrong_specialty", f"{provider['name']} ({provider['specialty']}) does not perform {service['name']}.")
    if service_code.endswith("-NP") or service_code == "PC-NEW":
        if not provider["accepting_new_patients"]:
            raise ToolError("not_accepting", f"{provider['name']} is not accepting new patients.")
    payer = one(db, "payers", payer_id=patient["payer_id"])
    needs_referral = service["specialty"] in IMAGING or (service["specialty_service"] and payer["specialist_referral_required"])
    if needs_referral and not referral_id:
        raise ToolError("referral_required", f"{service['name']} for this patient must be booked under a referral or imaging order.")
    if referral_id:
        ref = one(db, "referrals", referral_id=referral_id)
        if ref["patient_id"] != patient_id or ref["to_specialty"] != service["specialty"]:
            raise ToolError("referral_mismatch", f"Referral {referral_id} is not a {service['specialty']} referral of {patient_id}.")
        if ref["service_code"] and ref["service_code"] != service_code:
            raise ToolError("referral_mismatch", f"Order {referral_id} is for {ref['service_code']}, not {service_code}.")
    needs_auth = service["requires_prior_auth"] and payer["prior_auth_required"]
    if needs_auth and not auth_id:
        raise ToolError("authorization_required", f"{service['name']} under {payer['name']} must be booked under a prior authorisation.")
    if auth_id:
        auth = one(db, "authorizations", auth_id=auth_id)
        if auth["patient_id"] != patient_id or auth["service_code"] != service_code:
            raise ToolError("authorization_mismatch", f"Authorisation {auth_id} does not cover {service_code} for {patient_id}.")
    if find(db, "appointments", patient_id=patient_id, start=slot["start"], status="scheduled"):
        raise ToolError("double_booking", f"{patient_id} already has an appointment at {slot['start']}.")
    numbers = [int(r["appt_id"].split("-")[1]) for r in find(db, "appointments")]
    appt_id = f"AP-{max(numbers) + 13}"
    db["appointments"].insert(
        {"appt_id": appt_id, "patient_id": patient_id, "provider_id": provider["provider_id"], "slot_id": slot_id,
         "start": slot["start"], "service_code": service_code, "status": "scheduled", "referral_id": referral_id,
         "auth_id": auth_id, "booked_on": TODAY}
    )
    db["slots"].update(slot_id, {"status": "booked"})
    return {"appt_id": appt_id, "patient_id": patient_id, "provider": provider["name"], "start": slot["start"],
            "location": slot["location"], "service": service["name"], "status": "scheduled"}


@write_tool
def release_records(db, patient_id: str, consent_id: str, items: list[RELEASE_ITEMS], purpose: str) -> dict:
    """Releases items of a patient's record to the outside recipient named in a
    release consent, and logs the disclosure. Lab items send the most recent
    result; birth_year, sex and zip3 (first three ZIP digits) come from the
    demographics; visit_history lists completed visits.

    Args:
        patient_id: The patient whose information is released.
        consent_id: The patient's release consent (registry_release or release_of_information) naming the recipient.
        items: What to release: any of hba1c, ldl, egfr, inr, birth_year, sex, zip3, visit_history.
        purpose: Why the information is released, for example "Registry intake".
    """
    patient = _patient(db, patient_id)
    consent = one(db, "consents", consent_id=consent_id)
    if consent["patient_id"] != patient_id:
        raise ToolError("consent_mismatch", f"Consent {consent_id} does not belong to {patient_id}.")
    if consent["consent_type"] not in ("registry_release", "release_of_information") or not consent["recipient_id"]:
        raise ToolError("consent_mismatch", f"Consent {consent_id} is not a release consent.")
    if consent["status"] != "active" or (consent["expires_on"] and consent["expires_on"] < TODAY):
        raise ToolError("consent_inactive", f"Consent {consent_id} is not in force.")
    if not items:
        raise ToolError("nothing_to_release", "Name at least one item.")
    outside = sorted(set(items) - set(_list(consent["scope"])))
    if outside:
        raise ToolError("outside_consent_scope", f"Consent {consent_id} does not cover {outside}.")
    released = {}
    for item in sorted(set(items)):
        if item in ("hba1c", "ldl", "egfr", "inr"):
            released[item] = _latest_value(db, patient_id, item)
        elif item == "birth_year":
            released[item] = int(patient["date_of_birth"][:4])
        elif item == "sex":
            released[item] = patient["sex"]
        elif item == "zip3":
            released[item] = patient["zip"][:3]
        else:
            released[item] = [
                {"date": a["start"][:10], "service_code": a["service_code"]}
                for a in find(db, "appointments", patient_id=patient_id, status="completed")
            ]
    numbers = [int(r["disclosure_id"].split("-")[1]) for r in find(db, "disclosures")]
    disclosure_id = f"DS-{max(numbers) + 23}"
    db["disclosures"].insert(
        {"disclosure_id": disclosure_id, "patient_id": patient_id, "recipient_id": consent["recipient_id"],
         "consent_id": consent_id, "items": ",".join(sorted(set(items))), "disclosed_on": TODAY,
         "purpose": purpose, "released_by": "Scheduling assistant"}
    )
    recipient = one(db, "recipients", recipient_id=consent["recipient_id"])
    return {"disclosure_id": disclosure_id, "recipient": recipient["name"], "released": released}
