"""Tools of the Northgate Freight & Fulfillment snapshot (today is 2026-05-18)."""

import re
from datetime import date, timedelta

from envs.toolkit import ToolError, find, one, read_tool, write_tool

TODAY = date(2026, 5, 18)
NOW = "2026-05-18T07:30:00"
EEI_THRESHOLD_USD = 2500.0
USMCA_ORIGINS = {"US", "CA", "MX"}


def _day(text: str) -> date:
    return date.fromisoformat(text[:10])


def _total(rate: dict) -> float:
    return round(rate["linehaul_usd"] * (1 + rate["fuel_surcharge_pct"] / 100), 2)


def _hs(product: dict):
    if product["hs_code"]:
        return product["hs_code"]
    return {"status": "not_classified", "detail": "No Schedule B / HS classification is on file for this product."}


def _hazmat(product: dict) -> dict:
    return {"hazard_class": product["hazmat_class"], "un_number": product["un_number"], "packing_group": product["packing_group"],
            "proper_shipping_name": product["proper_shipping_name"]}


def _certificate(db, product: dict) -> dict | None:
    if not product["usmca_certificate_id"]:
        return None
    c = one(db, "origin_certificates", certificate_id=product["usmca_certificate_id"])
    return {k: c[k] for k in ("certificate_id", "certifier", "certifier_role", "goods_description", "blanket_start", "blanket_end")}


def _lines(db, shipment_id: str) -> list[tuple[dict, dict, dict]]:
    out = []
    for line in find(db, "shipment_lines", shipment_id=shipment_id):
        out.append((line, one(db, "products", sku=line["sku"]), one(db, "inventory_lots", lot_id=line["lot_id"])))
    return out


def _hazard_classes(db, shipment_id: str) -> set[str]:
    return {p["hazmat_class"] for _, p, _ in _lines(db, shipment_id) if p["hazmat_class"] != "not regulated"}


def _summary(db, s: dict) -> dict:
    customer = one(db, "customers", customer_id=s["customer_id"])
    return {"shipment_id": s["shipment_id"], "shipment_type": s["shipment_type"], "customer": customer["name"],
            "reference": s["reference"], "origin_warehouse_id": s["origin_warehouse_id"], "consignee": s["consignee"],
            "destination": f"{s['dest_city']}, {s['dest_state']}, {s['dest_country']}", "ship_date": s["ship_date"],
            "required_delivery_date": s["required_delivery_date"], "status": s["status"], "pallets": s["pallets"]}


@read_tool
def find_shipments(db, query: str) -> list[dict]:
    """Searches shipments by customer name, consignee, destination city,
    customer reference or shipment id (every word must match) and lists the
    matches with their route, dates, status and pallet count.

    Args:
        query: Words to match, for example "Evergreen Seattle" or "PO 41872".
    """
    words = [w for w in query.casefold().split() if w]
    if not words:
        raise ToolError("invalid_arguments", "Give at least one search word.")
    out = []
    for s in find(db, "shipments"):
        customer = one(db, "customers", customer_id=s["customer_id"])
        hay = " ".join([s["shipment_id"], customer["name"], s["consignee"], s["dest_city"], s["dest_state"], s["reference"],
                        s["origin_warehouse_id"]]).casefold()
        if all(w in hay for w in words):
            out.append(_summary(db, s))
    if not out:
        raise ToolError("not_found", f"No shipment matches {query!r}.")
    return out


@read_tool
def get_shipment(db, shipment_id: str) -> dict:
    """Returns a shipment in full: route and lane, dates, status, pallets and
    weight, the tendered carrier, rate and tracking number, each line (product,
    lot, quantity, value, Schedule B code, country of origin, hazmat data and
    the USMCA certification of origin on file), dock appointments, receiving
    records, OS&D reports and any export declaration filed.

    Args:
        shipment_id: A shipment id such as "SHP-412345".
    """
    s = one(db, "shipments", shipment_id=shipment_id)
    lines = []
    for line, product, lot in _lines(db, shipment_id):
        lines.append({
            "line_id": line["line_id"], "sku": product["sku"], "description": product["description"], "lot_id": lot["lot_id"],
            "quantity": line["quantity"], "uom": product["uom"], "weight_kg": round(product["unit_weight_kg"] * line["quantity"], 1),
            "line_value_usd": line["line_value_usd"], "hs_code": _hs(product), "country_of_origin": lot["country_of_origin"],
            "hazmat": _hazmat(product), "usmca_certificate": _certificate(db, product),
        })
    appointments = [{k: a[k] for k in ("appointment_id", "warehouse_id", "door", "direction", "carrier_id", "starts_at", "ends_at", "status")}
                    for a in find(db, "dock_appointments", shipment_id=shipment_id)]
    receipts = [{k: r[k] for k in ("receipt_id", "warehouse_id", "received_at", "pallets_received", "received_by", "condition_notes")}
                for r in find(db, "receipts", shipment_id=shipment_id)]
    osd = [dict(o) for o in find(db, "osd_reports", shipment_id=shipment_id)]
    decl = find(db, "export_declarations", shipment_id=shipment_id)
    carrier = one(db, "carriers", carrier_id=s["carrier_id"])["name"] if s["carrier_id"] else None
    customer = one(db, "customers", customer_id=s["customer_id"])
    return {
        "shipment_id": s["shipment_id"], "shipment_type": s["shipment_type"], "customer_id": s["customer_id"], "customer": customer["name"],
        "reference": s["reference"], "origin_warehouse_id": s["origin_warehouse_id"], "lane_id": s["lane_id"], "consignee": s["consignee"],
        "dest_city": s["dest_city"], "dest_state": s["dest_state"], "dest_country": s["dest_country"],
        "dest_warehouse_id": s["dest_warehouse_id"], "ship_date": s["ship_date"], "required_delivery_date": s["required_delivery_date"],
        "status": s["status"], "pallets": s["pallets"], "gross_weight_kg": s["gross_weight_kg"],
        "rate_id": s["rate_id"], "carrier_id": s["carrier_id"], "carrier": carrier, "rate_usd": s["rate_usd"],
        "estimated_delivery": s["estimated_delivery"], "tracking_number": s["tracking_number"],
        "delivered_at": s["delivered_at"], "pod_signed_by": s["pod_signed_by"], "pallets_delivered": s["pallets_delivered"],
        "lines": lines, "dock_appointments": appointments, "receipts": receipts, "osd_reports": osd,
        "export_declaration": {k: v for k, v in decl[0].items()} if decl else None,
    }


@read_tool
def search_inventory(db, query: str, warehouse_id: str) -> list[dict]:
    """Lists the inventory lots at one warehouse whose SKU or product
    description matches the query (every word must match): quantity, status,
    location, receipt and expiry dates, last cycle count, country of origin and
    the product's classification and hazmat data.

    Args:
        query: Words to match, for example "skillet" or "PCC-FD-999".
        warehouse_id: A warehouse id such as "RNO9".
    """
    one(db, "warehouses", warehouse_id=warehouse_id)
    words = [w for w in query.casefold().split() if w]
    if not words:
        raise ToolError("invalid_arguments", "Give at least one search word.")
    out = []
    for lot in find(db, "inventory_lots", warehouse_id=warehouse_id):
        product = one(db, "products", sku=lot["sku"])
        hay = f"{product['sku']} {product['description']}".casefold()
        if not all(w in hay for w in words):
            continue
        out.append({"lot_id": lot["lot_id"], "sku": product["sku"], "description": product["description"], "quantity": lot["quantity"],
                    "uom": product["uom"], "status": lot["status"], "location": lot["location"], "received_on": lot["received_on"],
                    "expires_on": lot["expires_on"], "last_counted": lot["last_counted"], "country_of_origin": lot["country_of_origin"],
                    "hs_code": _hs(product), "hazmat": _hazmat(product)})
    if not out:
        raise ToolError("not_found", f"No lot at {warehouse_id} matches {query!r}.")
    return out


@read_tool
def list_lane_carriers(db, lane_id: str) -> dict:
    """Lists every carrier rate on a lane: service, transit days, linehaul,
    fuel surcharge, all-in cost and validity dates, with the carrier's
    operating authority, hazmat authorisation (hazard classes), cargo
    insurance and safety rating.

    Args:
        lane_id: A lane id such as "LN-SAC9-PDX".
    """
    lane = one(db, "lanes", lane_id=lane_id)
    rates = []
    for r in find(db, "lane_rates", lane_id=lane_id):
        c = one(db, "carriers", carrier_id=r["carrier_id"])
        rates.append({
            "rate_id": r["rate_id"], "transit_days": r["transit_days"], "carrier_id": c["carrier_id"], "carrier": c["name"],
            "service": r["service"], "linehaul_usd": r["linehaul_usd"], "fuel_surcharge_pct": r["fuel_surcharge_pct"],
            "all_in_usd": _total(r), "effective_from": r["effective_from"], "effective_to": r["effective_to"],
            "authority_status": c["authority_status"], "hazmat_authorized": bool(c["hazmat_authorized"]),
            "hazmat_classes": c["hazmat_classes"].split(",") if c["hazmat_classes"] else [],
            "cargo_insurance_usd": c["cargo_insurance_usd"], "safety_rating": c["safety_rating"],
        })
    return {"lane_id": lane["lane_id"], "origin_warehouse_id": lane["origin_warehouse_id"],
            "destination": f"{lane['dest_city']}, {lane['dest_state']}, {lane['dest_country']}", "miles": lane["miles"],
            "cross_border": bool(lane["cross_border"]), "rates": rates}


@read_tool
def track_shipment(db, tracking_number: str) -> dict:
    """Queries the carrier's tracking service for a tracking number and
    returns its milestones (pickup, departures, arrival, out for delivery,
    delivered) with times, places and, on delivery, the signer and the number
    of pallets delivered.

    Args:
        tracking_number: A carrier tracking (PRO) number such as "CFW12345678".
    """
    events = sorted(find(db, "tracking_events", tracking_number=tracking_number.strip().upper()), key=lambda e: e["event_time"])
    if not events:
        raise ToolError("not_found", f"The carrier has no record of tracking number {tracking_number!r}.")
    shipment = find(db, "shipments", tracking_number=tracking_number.strip().upper())
    return {"tracking_number": tracking_number.strip().upper(),
            "carrier_id": shipment[0]["carrier_id"] if shipment else None,
            "latest": events[-1]["description"],
            "events": [{k: e[k] for k in ("event_id", "event_time", "code", "description", "city", "state", "signed_by", "pieces")}
                       for e in events]}


@write_tool
def tender_shipment(db, shipment_id: str, rate_id: str) -> dict:
    """Tenders a shipment to a carrier at one of its lane rates: books the
    carrier onto the shipment, assigns the carrier's tracking number and sets
    the expected delivery date. Refuses tenders that break the tendering
    policy.

    Args:
        shipment_id: The shipment to tender.
        rate_id: The lane rate (carrier and service) to tender at.
    """
    s = one(db, "shipments", shipment_id=shipment_id)
    r = one(db, "lane_rates", rate_id=rate_id)
    c = one(db, "carriers", carrier_id=r["carrier_id"])
    if s["status"] != "ready_to_tender":
        raise ToolError("not_tenderable", f"{shipment_id} has status {s['status']}.")
    if r["lane_id"] != s["lane_id"]:
        raise ToolError("wrong_lane", f"{rate_id} is not a rate on {s['lane_id']}.")
    if not r["effective_from"] <= s["ship_date"] <= r["effective_to"]:
        raise ToolError("rate_not_in_effect", f"{rate_id} is not in effect on {s['ship_date']}.")
    if c["authority_status"] != "active":
        raise ToolError("carrier_not_authorized", f"{c['name']} operating authority is {c['authority_status']}.")
    lines = _lines(db, shipment_id)
    if any(not p["hazmat_class"] for _, p, _ in lines):
        raise ToolError("hazmat_data_missing", "A product on the shipment has no hazmat classification.")
    classes = _hazard_classes(db, shipment_id)
    allowed = set((c["hazmat_classes"] or "").split(","))
    if classes and (not c["hazmat_authorized"] or not classes <= allowed):
        raise ToolError("hazmat_not_authorized", f"{c['name']} is not authorised for hazard class(es) {', '.join(sorted(classes))}.")
    if s["dest_country"] != "US" and not find(db, "export_declarations", shipment_id=shipment_id):
        raise ToolError("export_declaration_required", f"{shipment_id} needs a filed export declaration before tendering.")
    estimated = (_day(s["ship_date"]) + timedelta(days=r["transit_days"])).isoformat()
    if estimated > s["required_delivery_date"]:
        raise ToolError("late_delivery", f"{rate_id} would deliver on {estimated}, after the required date {s['required_delivery_date']}.")
    prefix = re.sub(r"[^A-Z]", "", c["carrier_id"])[:3]
    tracking = f"{prefix}{int(shipment_id[4:]) * 37 % 10**8:08d}"
    db["shipments"].update(shipment_id, {"status": "tendered", "rate_id": rate_id, "carrier_id": c["carrier_id"], "rate_usd": _total(r),
                                         "estimated_delivery": estimated, "tracking_number": tracking})
    return {"shipment_id": shipment_id, "status": "tendered", "carrier_id": c["carrier_id"], "carrier": c["name"], "service": r["service"],
            "all_in_usd": _total(r), "ship_date": s["ship_date"], "estimated_delivery": estimated,
            "required_delivery_date": s["required_delivery_date"], "tracking_number": tracking}


@write_tool
def record_delivery(db, shipment_id: str, delivered_at: str, signed_by: str, pallets: int) -> dict:
    """Closes a shipment out as delivered with its proof-of-delivery details.
    The details must match the carrier's proof of delivery; a transfer into
    one of our warehouses also needs a matching receipt (or an OS&D report).

    Args:
        shipment_id: The shipment to close out.
        delivered_at: Delivery date and time from the proof of delivery, YYYY-MM-DDTHH:MM (the date alone is accepted).
        signed_by: The name of the person who signed for the delivery.
        pallets: The number of pallets delivered.
    """
    s = one(db, "shipments", shipment_id=shipment_id)
    if s["status"] != "in_transit":
        raise ToolError("not_in_transit", f"{shipment_id} has status {s['status']}.")
    pods = [e for e in find(db, "tracking_events", tracking_number=s["tracking_number"] or "") if e["code"] == "D1"]
    if not pods:
        raise ToolError("no_proof_of_delivery", f"The carrier has not reported delivery of {shipment_id}.")
    pod = pods[-1]
    try:
        stated = _day(delivered_at.strip())
    except ValueError:
        raise ToolError("invalid_arguments", f"Unreadable delivery time {delivered_at!r}.") from None
    clean = lambda x: re.sub(r"[^a-z]", "", x.casefold())  # noqa: E731
    if stated != _day(pod["event_time"]) or clean(signed_by) != clean(pod["signed_by"] or "") or pallets != pod["pieces"]:
        raise ToolError("pod_mismatch", "The details do not match the carrier's proof of delivery.")
    if s["dest_warehouse_id"]:
        receipts = find(db, "receipts", shipment_id=shipment_id)
        if not receipts:
            raise ToolError("receipt_missing", f"{s['dest_warehouse_id']} has not receipted {shipment_id}.")
        if receipts[-1]["pallets_received"] != pod["pieces"] and not find(db, "osd_reports", shipment_id=shipment_id):
            raise ToolError("count_discrepancy", "The receipt and the proof of delivery disagree on the pallet count; an OS&D report is required.")
    db["shipments"].update(shipment_id, {"status": "delivered", "delivered_at": pod["event_time"], "pod_signed_by": pod["signed_by"],
                                         "pallets_delivered": pallets})
    return {"shipment_id": shipment_id, "status": "delivered", "delivered_at": pod["event_time"], "pod_signed_by": pod["signed_by"],
            "pallets_delivered": pallets}


@write_tool
def file_export_declaration(db, shipment_id: str, total_value_usd: float, usmca_certificate_id: str | None = None) -> dict:
    """Files the export declaration of a shipment to Canada or Mexico, with the
    EEI (AES) filing when one is required, and optionally claims USMCA
    preferential treatment under a certification of origin. Returns the
    declaration, whether EEI was required and, if so, the ITN. Refuses
    declarations that break the export policy.

    Args:
        shipment_id: The shipment to declare.
        total_value_usd: The total declared value in US dollars (the sum of the line values).
        usmca_certificate_id: The certification of origin to claim USMCA treatment under; omit to make no claim.
    """
    s = one(db, "shipments", shipment_id=shipment_id)
    if s["dest_country"] == "US":
        raise ToolError("not_an_export", f"{shipment_id} is a domestic shipment.")
    if s["status"] not in ("planned", "ready_to_tender"):
        raise ToolError("too_late", f"{shipment_id} has status {s['status']}.")
    if find(db, "export_declarations", shipment_id=shipment_id):
        raise ToolError("already_filed", f"An export declaration for {shipment_id} is already on file.")
    lines = _lines(db, shipment_id)
    unclassified = [p["sku"] for _, p, _ in lines if not p["hs_code"]]
    if unclassified:
        raise ToolError("incomplete_classification", f"No Schedule B classification for {', '.join(unclassified)}.")
    total = round(sum(line["line_value_usd"] for line, _, _ in lines), 2)
    if abs(total_value_usd - total) > 0.5:
        raise ToolError("value_mismatch", "The declared total does not equal the sum of the line values.")
    if usmca_certificate_id:
        cert = find(db, "origin_certificates", certificate_id=usmca_certificate_id)
        if not cert:
            raise ToolError("not_found", f"No certification of origin {usmca_certificate_id!r}.")
        cert = cert[0]
        if any(p["usmca_certificate_id"] != usmca_certificate_id for _, p, _ in lines):
            raise ToolError("certificate_scope", f"{usmca_certificate_id} does not cover every product on {shipment_id}.")
        if any(lot["country_of_origin"] not in USMCA_ORIGINS for _, _, lot in lines):
            raise ToolError("not_originating", "Goods of non-USMCA origin cannot be claimed.")
        if not cert["blanket_start"] <= s["ship_date"] <= cert["blanket_end"]:
            raise ToolError("certificate_not_in_effect", f"{usmca_certificate_id} does not cover the ship date {s['ship_date']}.")
    by_code: dict[str, float] = {}
    for line, p, _ in lines:
        by_code[p["hs_code"]] = by_code.get(p["hs_code"], 0.0) + line["line_value_usd"]
    eei = s["dest_country"] != "CA" and any(v > EEI_THRESHOLD_USD for v in by_code.values())
    itn = f"X{s['ship_date'].replace('-', '')}{int(shipment_id[4:]) * 7919 % 10**6:06d}" if eei else None
    row = {"declaration_id": f"EXD-{shipment_id[4:]}", "shipment_id": shipment_id, "filed_at": NOW, "total_value_usd": total,
           "eei_required": eei, "itn": itn, "exemption": None if eei else ("NOEEI 30.36" if s["dest_country"] == "CA" else "NOEEI 30.37(a)"),
           "usmca_certificate_id": usmca_certificate_id or None, "filed_by": "Northgate operations"}
    db["export_declarations"].insert(row)
    return row
