"""Tools of the Valley Oak Pharmacy snapshot (today is 2026-04-14)."""

import re
from datetime import date, timedelta
from typing import Literal

from envs.toolkit import ToolError, find, one, read_tool, write_tool

TODAY = date(2026, 4, 14)
BLOCKING_SEVERITIES = ("contraindicated", "major")
SCHEDULE_CODE = {"C-II": "2", "C-III": "3", "C-IV": "4", "C-V": "5"}


def _day(text: str) -> date:
    return date.fromisoformat(text[:10])


def _age_years(dob: str) -> float:
    born = _day(dob)
    years = TODAY.year - born.year - ((TODAY.month, TODAY.day) < (born.month, born.day))
    return years


def _store(db, store_id: str) -> dict:
    """A store by id, or by an unambiguous fragment of its name or city."""
    rows = find(db, "stores", store_id=store_id.strip().upper())
    if rows:
        return rows[0]
    wanted = store_id.strip().casefold()
    hits = [s for s in find(db, "stores") if wanted and (wanted in s["name"].casefold() or wanted == s["city"].casefold())]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise ToolError("not_found", f"No store matches {store_id!r}.")
    listed = "; ".join(f"{s['store_id']} ({s['name']})" for s in hits)
    raise ToolError("ambiguous_store", f"{store_id!r} matches several stores: {listed}.")


def _drug_brief(drug: dict) -> dict:
    return {"drug_id": drug["drug_id"], "name": drug["name"], "strength": drug["strength"], "schedule": drug["schedule"]}


def _active_coverage(db, patient_id: str) -> dict | None:
    rows = find(db, "coverage", patient_id=patient_id, status="active")
    return rows[0] if rows else None


def _current_medications(db, patient_id: str, exclude_rx: str | None = None) -> list[dict]:
    meds = []
    for rx in find(db, "prescriptions", patient_id=patient_id, status="active"):
        if rx["rx_id"] == exclude_rx or not find(db, "fills", rx_id=rx["rx_id"]):
            continue
        meds.append(rx)
    return meds


def _ingredients(drug: dict) -> list[str]:
    return [p.strip().casefold() for p in drug["ingredients"].split(";") if p.strip()]


def _screen(db, patient: dict, drug: dict, exclude_rx: str | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    meds = _current_medications(db, patient["patient_id"], exclude_rx)
    mine = set(_ingredients(drug))
    findings = []
    for rx in meds:
        other = one(db, "drugs", drug_id=rx["drug_id"])
        theirs = set(_ingredients(other))
        for rule in find(db, "interaction_rules"):
            a, b = rule["ingredient_a"].casefold(), rule["ingredient_b"].casefold()
            if (a in mine and b in theirs) or (b in mine and a in theirs):
                findings.append({"rule_id": rule["rule_id"], "with_rx_id": rx["rx_id"], "with_drug": other["name"],
                                 "severity": rule["severity"], "effect": rule["effect"]})
    allergies = [a.strip().casefold() for a in patient["allergies"].split(";")]
    allergy_alerts = []
    if drug["allergy_group"] and drug["allergy_group"].casefold() in allergies:
        allergy_alerts.append({"allergy_group": drug["allergy_group"], "documented_allergy": patient["allergies"]})
    current = [{"rx_id": rx["rx_id"], "drug": one(db, "drugs", drug_id=rx["drug_id"])["name"]} for rx in meds]
    return current, findings, allergy_alerts


def _coverage_view(db, patient_id: str, drug_id: str) -> dict | None:
    cov = _active_coverage(db, patient_id)
    if cov is None:
        return None
    plan = one(db, "plans", plan_id=cov["plan_id"])
    entry = find(db, "formulary", plan_id=cov["plan_id"], drug_id=drug_id)
    formulary = None
    if entry:
        e = entry[0]
        formulary = {"tier": e["tier"], "covered": bool(e["covered"]), "copay_usd": e["copay_usd"],
                     "prior_auth_required": bool(e["prior_auth_required"]), "quantity_limit": e["quantity_limit"]}
    return {"coverage_id": cov["coverage_id"], "plan_id": plan["plan_id"], "plan_name": plan["name"], "plan_type": plan["plan_type"],
            "bin": plan["bin"], "pcn": plan["pcn"], "member_id": cov["member_id"], "group_number": cov["group_number"],
            "eligibility_verified_on": cov["eligibility_verified_on"], "formulary": formulary}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", " ", str(text).casefold()).strip()


def _daily_mg(sig: str, concentration: float) -> float | None:
    volume = re.search(r"(\d+(?:\.\d+)?)\s*mL", sig)
    text = sig.casefold()
    per_day = None
    for pattern, n in (("once daily", 1), ("twice daily", 2), ("three times daily", 3), ("four times daily", 4),
                       ("every 12 hours", 2), ("every 8 hours", 3), ("every 6 hours", 4)):
        if pattern in text:
            per_day = n
            break
    if volume is None or per_day is None or " then " in text:
        return None
    return float(volume.group(1)) * concentration * per_day


@read_tool
def find_patient(db, name: str, date_of_birth: str | None = None) -> list[dict]:
    """Looks up patient profiles by name (all words must match the first or
    last name), optionally narrowed by date of birth. Each profile gives the
    patient id, date of birth, contact city, home store, documented allergies,
    the last recorded weight, the insurance coverage on file and a list of the
    patient's prescriptions (ids, drugs, status, last fill).

    Args:
        name: The patient's name, for example "Maria Lopez".
        date_of_birth: Optional date of birth, YYYY-MM-DD or MM/DD/YYYY.
    """
    words = [w for w in re.split(r"[\s,]+", name.casefold()) if w]
    if not words:
        raise ToolError("invalid_arguments", "Give at least one name word.")
    dob = None
    if date_of_birth:
        m = re.fullmatch(r"\s*(\d{1,2})/(\d{1,2})/(\d{4})\s*", date_of_birth)
        try:
            dob = date(int(m[3]), int(m[1]), int(m[2])).isoformat() if m else date.fromisoformat(date_of_birth.strip()).isoformat()
        except ValueError:
            raise ToolError("invalid_arguments", f"Unreadable date of birth {date_of_birth!r}.") from None
    out = []
    for p in find(db, "patients"):
        tokens = re.split(r"[\s-]+", f"{p['first_name']} {p['last_name']}".casefold())
        if not all(w in tokens for w in words):
            continue
        if dob and p["date_of_birth"] != dob:
            continue
        store = one(db, "stores", store_id=p["home_store_id"])
        if p["weight_kg"] is None:
            weight = {"status": "not_recorded", "detail": "No weight is recorded in this profile."}
        else:
            weight = p["weight_kg"]
        cov = _active_coverage(db, p["patient_id"])
        coverage = None
        if cov:
            plan = one(db, "plans", plan_id=cov["plan_id"])
            coverage = {"coverage_id": cov["coverage_id"], "plan_id": plan["plan_id"], "plan_name": plan["name"], "member_id": cov["member_id"]}
        prescriptions = []
        for rx in find(db, "prescriptions", patient_id=p["patient_id"]):
            fills = find(db, "fills", rx_id=rx["rx_id"])
            prescriptions.append({"rx_id": rx["rx_id"], "drug": one(db, "drugs", drug_id=rx["drug_id"])["name"],
                                  "written_on": rx["written_on"], "status": rx["status"],
                                  "last_filled_on": max((f["filled_on"] for f in fills), default=None)})
        out.append({
            "patient_id": p["patient_id"], "name": f"{p['first_name']} {p['last_name']}", "date_of_birth": p["date_of_birth"],
            "age_years": _age_years(p["date_of_birth"]), "sex": p["sex"], "phone": p["phone"], "city": p["city"],
            "home_store_id": store["store_id"], "home_store": store["name"], "allergies": p["allergies"],
            "weight_kg": weight, "weight_recorded_on": p["weight_recorded_on"], "coverage": coverage,
            "prescriptions": prescriptions,
        })
    if not out:
        raise ToolError("not_found", f"No patient matches {name!r}" + (f" born {dob}." if dob else "."))
    return out


@read_tool
def get_prescription(db, rx_id: str) -> dict:
    """Returns a prescription as recorded by the pharmacy (drug, quantity, days'
    supply, directions, refills, dates, status, substitution rule, any
    clarification), the prescriber's credentials (state licence and DEA
    registration), the original e-prescription message when it arrived
    electronically, and the fills dispensed so far.

    Args:
        rx_id: A prescription number such as "RX-9999999".
    """
    rx = one(db, "prescriptions", rx_id=rx_id)
    drug = one(db, "drugs", drug_id=rx["drug_id"])
    pres = one(db, "prescribers", prescriber_id=rx["prescriber_id"])
    fills = find(db, "fills", rx_id=rx_id)
    messages = find(db, "erx_messages", rx_id=rx_id)
    message = None
    if messages:
        m = messages[0]
        message = {k: m[k] for k in ("message_id", "message_type", "received_at", "prescriber_npi", "drug_description",
                                     "strength", "quantity", "sig", "refills")}
    return {
        "rx_id": rx["rx_id"], "patient_id": rx["patient_id"], "drug": {**_drug_brief(drug), "interchange_group": drug["interchange_group"]},
        "quantity": rx["quantity"], "dispensing_unit": drug["dispensing_unit"], "days_supply": rx["days_supply"], "sig": rx["sig"],
        "refills_authorized": rx["refills_authorized"], "refills_remaining": rx["refills_authorized"] - max(0, len(fills) - 1),
        "written_on": rx["written_on"], "expires_on": rx["expires_on"], "status": rx["status"],
        "substitution": rx["substitution"], "origin": rx["origin"], "clarification": rx["clarification"],
        "prescriber": {k: pres[k] for k in ("prescriber_id", "name", "credential", "specialty", "practice", "city", "npi",
                                            "licence_number", "licence_status", "licence_expires", "dea_number", "dea_status",
                                            "dea_schedules", "dea_expires")},
        "erx_message": message,
        "fills": [{k: f[k] for k in ("fill_id", "filled_on", "store_id", "drug_id", "quantity", "bill_to", "copay_usd")} for f in fills],
    }


@read_tool
def search_catalogue(db, query: str, store_id: str) -> list[dict]:
    """Searches the drug catalogue by drug name, drug class or drug id (every
    word must match) and shows each match with its strength, form, schedule,
    interchange group and the stock on hand at one store.

    Args:
        query: Words to match, for example "lisinopril" or "antihistamine".
        store_id: The store whose stock to show: a store id such as "ST-9999" or a fragment of its name.
    """
    store = _store(db, store_id)
    words = [w for w in query.casefold().split() if w]
    if not words:
        raise ToolError("invalid_arguments", "Give at least one search word.")
    out = []
    for drug in find(db, "drugs"):
        hay = f"{drug['drug_id']} {drug['name']} {drug['drug_class']}".casefold()
        if not all(w in hay for w in words):
            continue
        stock = find(db, "stock", store_id=store["store_id"], drug_id=drug["drug_id"])
        out.append({
            "drug_id": drug["drug_id"], "name": drug["name"], "strength": drug["strength"], "form": drug["form"],
            "drug_class": drug["drug_class"], "schedule": drug["schedule"], "interchange_group": drug["interchange_group"],
            "ndc": drug["ndc"], "store_id": store["store_id"], "on_hand": stock[0]["on_hand"] if stock else 0,
            "dispensing_unit": drug["dispensing_unit"], "stocked": bool(stock),
        })
    if not out:
        raise ToolError("not_found", f"No catalogue item matches {query!r}.")
    return out


@read_tool
def screen_drug_for_patient(db, patient_id: str, drug_id: str) -> dict:
    """Runs the pre-dispensing check of one catalogue drug for one patient:
    interaction screening against the patient's current medications, the
    allergy check, and the insurance adjudication preview (the patient's active
    coverage, when its eligibility was last verified, and the plan's formulary
    status, copay, prior-authorisation flag and quantity limit for the drug).

    Args:
        patient_id: A patient id such as "PT-999999".
        drug_id: A catalogue drug id such as "D-ATOR99".
    """
    patient = one(db, "patients", patient_id=patient_id)
    drug = one(db, "drugs", drug_id=drug_id)
    current, findings, allergy_alerts = _screen(db, patient, drug)
    return {"patient_id": patient_id, "drug": _drug_brief(drug), "current_medications": current,
            "interactions": findings, "allergy_alerts": allergy_alerts, "coverage": _coverage_view(db, patient_id, drug_id)}


@read_tool
def dispensing_report(db, drug_id: str, quarter: str) -> dict:
    """Quarterly dispensing statistics of one drug: for each store, the number
    of unique patients who filled it and the number of fills in the quarter.

    Args:
        drug_id: A catalogue drug id such as "D-NALX9".
        quarter: A calendar quarter written like "2025-Q3".
    """
    drug = one(db, "drugs", drug_id=drug_id)
    rows = find(db, "dispensing_summary", drug_id=drug_id, quarter=quarter.strip().upper())
    if not rows:
        raise ToolError("not_found", f"No dispensing statistics for {drug_id} in {quarter!r}.")
    stores = []
    for r in rows:
        s = one(db, "stores", store_id=r["store_id"])
        stores.append({"store_id": s["store_id"], "store": s["name"], "city": s["city"], "county": s["county"],
                       "unique_patients": r["unique_patients"], "fills": r["fills"]})
    return {"drug": _drug_brief(drug), "quarter": quarter.strip().upper(), "stores": stores}


@read_tool
def get_disclosure_log(db, recipient_id: str) -> dict:
    """Returns a data-release partner (its data use agreement, expiry and the
    drugs it covers) and every aggregate count already released to it.

    Args:
        recipient_id: A recipient id such as "RCP-QQQQ", or a fragment of the recipient's name.
    """
    rows = find(db, "recipients", recipient_id=recipient_id.strip().upper())
    if not rows:
        wanted = recipient_id.strip().casefold()
        rows = [r for r in find(db, "recipients") if wanted and wanted in r["name"].casefold()]
    if not rows:
        raise ToolError("not_found", f"No data-release recipient matches {recipient_id!r}.")
    if len(rows) > 1:
        listed = "; ".join(f"{r['recipient_id']} ({r['name']})" for r in rows)
        raise ToolError("ambiguous_recipient", f"{recipient_id!r} matches several recipients: {listed}.")
    r = rows[0]
    releases = [{k: x[k] for k in ("release_id", "drug_id", "quarter", "store_ids", "patient_count", "released_on", "released_by")}
                for x in find(db, "disclosure_releases", recipient_id=r["recipient_id"])]
    return {"recipient_id": r["recipient_id"], "name": r["name"], "recipient_type": r["recipient_type"],
            "agreement_id": r["agreement_id"], "agreement_expires": r["agreement_expires"],
            "permitted_drugs": [d.strip() for d in r["permitted_drugs"].split(",")], "releases": releases}


@write_tool
def fill_prescription(db, rx_id: str, store_id: str, drug_id: str, quantity: float, bill_to: Literal["insurance", "cash"]) -> dict:
    """Dispenses a prescription at a store: records the fill, takes the
    quantity out of the store's stock and bills the patient's insurance (or
    charges cash). Refuses fills that break the dispensing policy.

    Args:
        rx_id: The prescription number.
        store_id: The filling store's id.
        drug_id: The catalogue product dispensed (the prescribed one, or an allowed interchange).
        quantity: The quantity dispensed, in the drug's dispensing unit.
        bill_to: "insurance" to bill the patient's coverage, "cash" to charge the patient.
    """
    rx = one(db, "prescriptions", rx_id=rx_id)
    store = one(db, "stores", store_id=store_id)
    patient = one(db, "patients", patient_id=rx["patient_id"])
    prescribed = one(db, "drugs", drug_id=rx["drug_id"])
    drug = one(db, "drugs", drug_id=drug_id)
    if rx["status"] != "active":
        raise ToolError("rx_not_active", f"{rx_id} has status {rx['status']}.")
    if _day(rx["expires_on"]) < TODAY:
        raise ToolError("rx_expired", f"{rx_id} expired on {rx['expires_on']}.")
    pres = one(db, "prescribers", prescriber_id=rx["prescriber_id"])
    if pres["licence_status"] != "active" or _day(pres["licence_expires"]) < TODAY:
        raise ToolError("prescriber_not_authorized", f"The prescriber's licence is {pres['licence_status']} (expires {pres['licence_expires']}).")
    if drug_id != rx["drug_id"]:
        if rx["substitution"] != "therapeutic_interchange" or not prescribed["interchange_group"] or drug["interchange_group"] != prescribed["interchange_group"]:
            raise ToolError("substitution_not_allowed", f"{rx_id} does not allow dispensing {drug['name']} in place of {prescribed['name']}.")
    if drug["schedule"]:
        code = SCHEDULE_CODE[drug["schedule"]]
        schedules = [s.strip() for s in (pres["dea_schedules"] or "").split(",")]
        if pres["dea_status"] != "active" or not pres["dea_expires"] or _day(pres["dea_expires"]) < TODAY or code not in schedules:
            raise ToolError("prescriber_not_authorized", f"The prescriber's DEA registration does not authorise {drug['schedule']} prescriptions.")
    msgs = find(db, "erx_messages", rx_id=rx_id)
    if msgs and not rx["clarification"]:
        m = msgs[0]
        if (_norm(m["strength"]) != _norm(prescribed["strength"]) or abs(m["quantity"] - rx["quantity"]) > 1e-9
                or _norm(m["sig"]) != _norm(rx["sig"]) or m["refills"] != rx["refills_authorized"]):
            raise ToolError("erx_discrepancy", f"{rx_id} differs from the prescriber's e-prescription message; clarification required.")
    fills = find(db, "fills", rx_id=rx_id)
    if len(fills) >= rx["refills_authorized"] + 1:
        raise ToolError("no_refills_remaining", f"{rx_id} has no refills remaining.")
    if fills:
        last = max(fills, key=lambda f: f["filled_on"])
        due = _day(last["filled_on"]) + timedelta(days=int(last["days_supply"] * 0.75))
        if due > TODAY:
            raise ToolError("refill_too_soon", f"{rx_id} cannot be refilled before {due.isoformat()}.")
    if abs(quantity - rx["quantity"]) > 1e-9:
        raise ToolError("quantity_mismatch", f"{rx_id} must be dispensed in full: {rx['quantity']:g} {prescribed['dispensing_unit']}.")
    stock = find(db, "stock", store_id=store["store_id"], drug_id=drug_id)
    if not stock or stock[0]["on_hand"] < quantity:
        raise ToolError("insufficient_stock", f"{store['store_id']} does not have {quantity:g} {drug['dispensing_unit']} of {drug['name']} on hand.")
    _, findings, allergy_alerts = _screen(db, patient, drug, exclude_rx=rx_id)
    blocking = [f for f in findings if f["severity"] in BLOCKING_SEVERITIES]
    if blocking:
        raise ToolError("interaction_blocked", f"{drug['name']} has a {blocking[0]['severity']} interaction with {blocking[0]['with_drug']}.")
    if allergy_alerts:
        raise ToolError("allergy_conflict", f"{patient['first_name']} {patient['last_name']} has a documented {drug['allergy_group']} allergy.")
    if drug["peds_min_mg_kg_day"] is not None and _age_years(patient["date_of_birth"]) < 12:
        if patient["weight_kg"] is None or not patient["weight_recorded_on"] or (TODAY - _day(patient["weight_recorded_on"])).days > 90:
            raise ToolError("weight_required", "Weight-based pediatric dosing needs a weight recorded within the last 90 days.")
        daily = _daily_mg(rx["sig"], drug["concentration_mg_per_ml"])
        if daily is None:
            raise ToolError("dose_unverifiable", "The directions do not give a fixed daily dose to verify.")
        per_kg = daily / patient["weight_kg"]
        if not drug["peds_min_mg_kg_day"] <= per_kg <= drug["peds_max_mg_kg_day"]:
            raise ToolError("dose_out_of_range", f"{per_kg:.1f} mg/kg/day is outside {drug['peds_min_mg_kg_day']:g}-{drug['peds_max_mg_kg_day']:g} mg/kg/day.")
    plan_id = None
    if bill_to == "insurance":
        cov = _active_coverage(db, patient["patient_id"])
        if cov is None:
            raise ToolError("no_coverage", "The patient has no active coverage on file.")
        if (TODAY - _day(cov["eligibility_verified_on"])).days > 30:
            raise ToolError("eligibility_stale", f"Eligibility was last verified on {cov['eligibility_verified_on']}; it must be within 30 days.")
        entry = find(db, "formulary", plan_id=cov["plan_id"], drug_id=drug_id)
        if not entry or not entry[0]["covered"]:
            raise ToolError("not_covered", f"{drug['name']} is not on the formulary of {cov['plan_id']}.")
        if entry[0]["prior_auth_required"]:
            raise ToolError("prior_auth_required", f"{drug['name']} needs prior authorisation under {cov['plan_id']}.")
        if entry[0]["quantity_limit"] is not None and quantity > entry[0]["quantity_limit"]:
            raise ToolError("quantity_limit_exceeded", f"The plan limits {drug['name']} to {entry[0]['quantity_limit']} per fill.")
        copay, plan_id = entry[0]["copay_usd"], cov["plan_id"]
    else:
        copay = round(drug["unit_price_usd"] * quantity + 4.99, 2)
    numbers = [int(f["fill_id"][2:]) for f in find(db, "fills") if f["fill_id"][2:].isdigit()]
    fill_id = f"F-{max(numbers, default=880000) + 1}"
    db["fills"].insert({"fill_id": fill_id, "rx_id": rx_id, "store_id": store["store_id"], "filled_on": TODAY.isoformat(),
                        "drug_id": drug_id, "quantity": float(quantity), "days_supply": rx["days_supply"], "bill_to": bill_to,
                        "plan_id": plan_id, "copay_usd": copay, "pharmacist": "Valley Oak pharmacy assistant"})
    db["stock"].update(stock[0]["stock_id"], {"on_hand": stock[0]["on_hand"] - quantity})
    counselling = [f for f in findings if f["severity"] not in BLOCKING_SEVERITIES]
    return {"fill_id": fill_id, "rx_id": rx_id, "store_id": store["store_id"], "drug": _drug_brief(drug), "quantity": quantity,
            "days_supply": rx["days_supply"], "bill_to": bill_to, "plan_id": plan_id, "copay_usd": copay,
            "refills_remaining": rx["refills_authorized"] - len(fills), "counselling": counselling}


@write_tool
def release_aggregate_count(db, recipient_id: str, drug_id: str, quarter: str, store_ids: list[str]) -> dict:
    """Releases to a data-release partner the number of unique patients who
    filled a drug in a quarter at a group of stores, and records the release in
    the log. Refuses releases that break the data-release policy.

    Args:
        recipient_id: The recipient's id.
        drug_id: The catalogue drug id.
        quarter: The calendar quarter, like "2025-Q3".
        store_ids: The stores whose patients are counted.
    """
    recipient = one(db, "recipients", recipient_id=recipient_id)
    drug = one(db, "drugs", drug_id=drug_id)
    quarter = quarter.strip().upper()
    if _day(recipient["agreement_expires"]) < TODAY:
        raise ToolError("agreement_expired", f"The data use agreement {recipient['agreement_id']} expired on {recipient['agreement_expires']}.")
    if drug_id not in [d.strip() for d in recipient["permitted_drugs"].split(",")]:
        raise ToolError("drug_not_permitted", f"The agreement with {recipient_id} does not cover {drug['name']}.")
    stores = sorted(set(store_ids))
    if not stores:
        raise ToolError("invalid_arguments", "Name at least one store.")
    count = 0
    for s in stores:
        one(db, "stores", store_id=s)
        rows = find(db, "dispensing_summary", store_id=s, drug_id=drug_id, quarter=quarter)
        if not rows:
            raise ToolError("no_statistics", f"No statistics for {s}, {drug_id}, {quarter}.")
        count += rows[0]["unique_patients"]
    if 1 <= count <= 10:
        raise ToolError("small_cell", "The count is between 1 and 10 and may not be released.")
    for prior in find(db, "disclosure_releases", recipient_id=recipient_id, drug_id=drug_id, quarter=quarter):
        before = set(prior["store_ids"].split(","))
        if before == set(stores):
            raise ToolError("duplicate_release", f"This count was already released as {prior['release_id']}.")
        if before < set(stores) or set(stores) < before:
            if 1 <= abs(prior["patient_count"] - count) <= 10:
                raise ToolError("differencing", f"Together with {prior['release_id']} this release would reveal a count between 1 and 10.")
    numbers = [int(r["release_id"][3:]) for r in find(db, "disclosure_releases")]
    release_id = f"DR-{max(numbers, default=0) + 1:04d}"
    row = {"release_id": release_id, "recipient_id": recipient_id, "drug_id": drug_id, "quarter": quarter,
           "store_ids": ",".join(stores), "patient_count": count, "released_on": TODAY.isoformat(),
           "released_by": "Pharmacy operations"}
    db["disclosure_releases"].insert(row)
    return row
