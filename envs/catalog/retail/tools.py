"""Tools of the Cedar & Summit Outfitters order-management back office."""

from datetime import date, datetime, timedelta
from typing import Literal

from envs.toolkit import ToolError, find, one, read_tool, write_tool

NOW = datetime.fromisoformat("2026-03-17T10:00:00-04:00")
DISPATCH_CUTOFF_HOUR = 15
PERSONAL_CATEGORIES = ("name", "email", "phone", "postal_address")


def _unavailable(field: str) -> dict:
    return {"error": "required_field_unavailable", "field": field, "scope": "current_snapshot", "recoverable": False}


def _money(value: float) -> float:
    return round(value + 1e-9, 2)


def _add_business_days(start: date, days: int) -> date:
    current = start
    while days > 0:
        current += timedelta(days=1)
        if current.weekday() < 5:
            days -= 1
    return current


def _dispatch_day() -> date:
    today = NOW.date()
    if today.weekday() < 5 and NOW.hour < DISPATCH_CUTOFF_HOUR:
        return today
    return _add_business_days(today, 1)


def _partner(db, partner_id: str) -> dict:
    row = one(db, "partners", partner_id=partner_id)
    return {"partner_id": row["partner_id"], "name": row["name"], "kind": row["kind"], "data_role": row["data_role"]}


def _refunded_to_card(db, order_id: str) -> float:
    return _money(sum(r["amount"] for r in find(db, "refunds", order_id=order_id, destination="original_payment")))


def _gateway_view(db, auth: dict) -> dict:
    refunded = _refunded_to_card(db, auth["order_id"])
    captured = auth["captured_amount"]
    status = auth["status"]
    if status == "captured" and refunded > 0:
        status = "refunded" if refunded >= captured else "partially_refunded"
    return {
        "auth_id": auth["auth_id"],
        "gateway_ref": auth["gateway_ref"],
        "order_id": auth["order_id"],
        "method": auth["method"],
        "card_last4": auth["card_last4"],
        "status": status,
        "authorized_amount": auth["amount"],
        "captured_amount": captured,
        "refunded_amount": refunded,
        "refundable_balance": _money(captured - refunded),
        "created_at": auth["created_at"],
    }


def _restocking_fee(paid: float, condition: str | None) -> float:
    return _money(paid * 0.15) if condition == "used" else 0.0


@read_tool
def lookup_customer(db, query: str) -> list[dict]:
    """Finds customers by customer id, email, phone number or (part of) their name.
    Each match comes with the profile, the ids of their orders (newest first) and the
    log of personal data shared about them with partners (which partner, which data
    categories, why and when).

    Args:
        query: A customer id such as "C-99999", an email address, a phone number, or a name.
    """
    wanted = query.strip().casefold()
    digits = "".join(ch for ch in wanted if ch.isdigit())
    matches = []
    for row in find(db, "customers"):
        phone_digits = "".join(ch for ch in row["phone"] if ch.isdigit())
        if (
            row["customer_id"].casefold() == wanted
            or row["email"].casefold() == wanted
            or (len(digits) >= 7 and phone_digits.endswith(digits))
            or (wanted and wanted in row["full_name"].casefold())
        ):
            matches.append(row)
    if not matches:
        raise ToolError("not_found", f"No customer matches {query!r}.")
    result = []
    for row in matches[:10]:
        orders = sorted(find(db, "orders", customer_id=row["customer_id"]), key=lambda o: o["placed_at"], reverse=True)
        sharing = []
        for d in sorted(find(db, "disclosures", customer_id=row["customer_id"]), key=lambda d: d["disclosed_at"]):
            partner = _partner(db, d["partner_id"])
            sharing.append(
                {
                    "disclosure_id": d["disclosure_id"],
                    "partner_id": partner["partner_id"],
                    "partner_name": partner["name"],
                    "partner_data_role": partner["data_role"],
                    "categories": d["categories"],
                    "purpose": d["purpose"],
                    "disclosed_at": d["disclosed_at"],
                }
            )
        profile = {k: row[k] for k in ("customer_id", "full_name", "email", "phone", "city", "state", "postal_code", "loyalty_tier", "member_since", "status")}
        profile["order_ids"] = [o["order_id"] for o in orders]
        profile["data_sharing_log"] = sharing
        result.append(profile)
    return result


@read_tool
def get_order(db, order_id: str) -> dict:
    """Returns an order with its shipping and delivery dates, charges, the payment
    authorisation it was paid with, its items, and everything after-sale attached to it:
    returns (with inspection condition), refunds, manager approvals, exchanges and
    warranty claims.

    Args:
        order_id: An order id such as "CS-999999-3388".
    """
    order = one(db, "orders", order_id=order_id)
    auths = find(db, "payment_authorizations", order_id=order_id)
    items = []
    for item in find(db, "order_items", order_id=order_id):
        product = one(db, "products", sku=item["sku"])
        items.append(
            {
                "item_id": item["item_id"],
                "sku": item["sku"],
                "name": product["name"],
                "qty": item["qty"],
                "unit_price": item["unit_price"],
                "status": item["status"],
            }
        )
    item_ids = {i["item_id"] for i in items}
    result = {k: order[k] for k in ("order_id", "customer_id", "placed_at", "status", "ship_method", "promised_by", "shipped_at", "delivered_at")}
    result["carrier"] = one(db, "partners", partner_id=order["carrier_id"])["name"] if order["carrier_id"] else None
    result["ship_to"] = {"city": order["ship_city"], "state": order["ship_state"], "postal_code": order["ship_postal"]}
    result["charges"] = {"subtotal": order["subtotal"], "shipping": order["shipping"], "total": order["total"]}
    result["payment"] = [{"auth_id": a["auth_id"], "method": a["method"], "card_last4": a["card_last4"]} for a in auths]
    result["items"] = items
    result["returns"] = [
        {k: r[k] for k in ("return_id", "item_id", "qty", "reason", "status", "requested_at", "received_at", "condition")}
        for r in find(db, "returns", order_id=order_id)
    ]
    result["refunds"] = [
        {k: r[k] for k in ("refund_id", "return_id", "reason", "amount", "destination", "price_check_id", "approval_id", "issued_at", "issued_by")}
        for r in find(db, "refunds", order_id=order_id)
    ]
    result["approvals"] = [
        {k: a[k] for k in ("approval_id", "kind", "return_id", "requested_by", "approver_id", "max_amount", "status", "granted_at", "expires_at", "note")}
        for a in find(db, "approvals", order_id=order_id)
    ]
    exchanges = []
    for r in result["returns"]:
        for x in find(db, "exchanges", return_id=r["return_id"]):
            exchanges.append({k: x[k] for k in ("exchange_id", "return_id", "new_sku", "warehouse_id", "qty", "est_delivery", "created_at")})
    result["exchanges"] = exchanges
    result["warranty_claims"] = [
        {k: c[k] for k in ("claim_id", "item_id", "partner_id", "issue", "shared_categories", "filed_at", "status")}
        for c in find(db, "warranty_claims")
        if c["item_id"] in item_ids
    ]
    return result


@read_tool
def search_products(db, query: str, ship_to_state: str | None = None) -> list[dict]:
    """Searches the catalog by SKU, model, name, brand, category or colour. Each product
    comes with its current price, return window, warranty, manufacturer, available stock
    per warehouse (with an estimated delivery date when a destination state is given) and
    the competitor price checks staff have logged for it.

    Args:
        query: Words to look for, e.g. "headlamp", "Trailcrest grey 9" or a SKU.
        ship_to_state: Optional two-letter US state to estimate delivery dates to, e.g. "CA".
    """
    words = [w for w in query.casefold().split() if w]
    if not words:
        raise ToolError("invalid_query", "Give at least one word to search for.")
    state = ship_to_state.strip().upper() if ship_to_state else None
    if state and not find(db, "transit_lanes", state=state):
        raise ToolError("unknown_state", f"No delivery lanes to {ship_to_state!r}.")
    dispatch = _dispatch_day()
    result = []
    for product in find(db, "products"):
        haystack = " ".join(
            str(product[k]) for k in ("sku", "model_id", "name", "brand", "category", "color", "size")
        ).casefold()
        if not all(w in haystack for w in words):
            continue
        stock = []
        for inv in find(db, "inventory", sku=product["sku"]):
            warehouse = one(db, "warehouses", warehouse_id=inv["warehouse_id"])
            available = max(inv["on_hand"] - inv["reserved"], 0)
            entry = {
                "sku": product["sku"],
                "warehouse_id": inv["warehouse_id"],
                "warehouse": f"{warehouse['city']}, {warehouse['state']}",
                "available": available,
                "stock_status": "in_stock" if available > 0 else "out_of_stock",
            }
            if state:
                lane = one(db, "transit_lanes", warehouse_id=inv["warehouse_id"], state=state)
                entry["est_delivery"] = _add_business_days(dispatch, lane["business_days"]).isoformat() if available > 0 else None
            stock.append(entry)
        checks = [
            {k: c[k] for k in ("check_id", "competitor", "competitor_price", "captured_at", "captured_by")}
            for c in sorted(find(db, "price_checks", sku=product["sku"]), key=lambda c: c["captured_at"])
        ]
        manufacturer = one(db, "partners", partner_id=product["manufacturer_id"])
        result.append(
            {
                "sku": product["sku"],
                "model_id": product["model_id"],
                "name": product["name"],
                "brand": product["brand"],
                "category": product["category"],
                "color": product["color"],
                "size": product["size"],
                "price": product["price"],
                "active": bool(product["active"]),
                "return_window_days": product["return_window_days"],
                "warranty_months": product["warranty_months"],
                "manufacturer": {"partner_id": manufacturer["partner_id"], "name": manufacturer["name"]},
                "stock": stock,
                "price_checks": checks,
            }
        )
        if len(result) == 25:
            break
    return result


@read_tool
def get_payment_status(db, auth_id: str) -> dict:
    """Asks the payment gateway for the live state of a payment authorisation: status,
    authorised, captured and already refunded amounts, and the balance that can still be
    refunded to the original payment method.

    Args:
        auth_id: A payment authorisation id such as "PA-9QK2M9".
    """
    return _gateway_view(db, one(db, "payment_authorizations", auth_id=auth_id))


@read_tool
def get_staff(db, query: str) -> list[dict]:
    """Looks up back-office staff by staff id or (part of) their name: role, refund limit
    and whether the account is active.

    Args:
        query: A staff id such as "ST-999" or a name.
    """
    wanted = query.strip().casefold()
    rows = [r for r in find(db, "staff") if r["staff_id"].casefold() == wanted or (wanted and wanted in r["full_name"].casefold())]
    if not rows:
        raise ToolError("not_found", f"No staff member matches {query!r}.")
    return [
        {"staff_id": r["staff_id"], "full_name": r["full_name"], "role": r["role"], "refund_limit": r["refund_limit"], "active": bool(r["active"])}
        for r in rows
    ]


def _active_staff(db, staff_id: str) -> dict:
    staff = one(db, "staff", staff_id=staff_id)
    if not staff["active"]:
        raise ToolError("staff_inactive", f"Staff account {staff_id} is deactivated.")
    return staff


def _next_id(db, table: str, column: str, prefix: str, width: int) -> str:
    numbers = [int(r[column][len(prefix):]) for r in find(db, table) if r[column].startswith(prefix)]
    return f"{prefix}{(max(numbers, default=0) + 1):0{width}d}"


@write_tool
def issue_refund(
    db,
    staff_id: str,
    order_id: str,
    amount: float,
    destination: Literal["original_payment", "store_credit"],
    reason: Literal["return", "price_match", "goodwill"],
    return_id: str | None = None,
    price_check_id: str | None = None,
    approval_id: str | None = None,
) -> dict:
    """Issues a refund on an order, to the original payment method (through the payment
    gateway) or as store credit. Refunds above the issuing staff member's refund limit
    need an approval.

    Args:
        staff_id: The staff member issuing the refund.
        order_id: The order being refunded.
        amount: The amount in USD.
        destination: "original_payment" or "store_credit".
        reason: "return" (a received return; give return_id), "price_match" (give price_check_id) or "goodwill".
        return_id: The return being refunded, for reason "return".
        price_check_id: The competitor price check used, for reason "price_match".
        approval_id: A refund_over_limit approval, when the amount exceeds the staff member's limit.
    """
    staff = _active_staff(db, staff_id)
    one(db, "orders", order_id=order_id)
    amount = _money(amount)
    if amount <= 0:
        raise ToolError("invalid_amount", "The refund amount must be positive.")
    if destination == "original_payment":
        auths = find(db, "payment_authorizations", order_id=order_id)
        if not auths:
            raise ToolError("no_payment", f"Order {order_id} has no payment authorisation to refund to.")
        balance = _gateway_view(db, auths[0])["refundable_balance"]
        if amount > balance + 1e-9:
            raise ToolError("exceeds_refundable_balance", f"Only {balance:.2f} can still be refunded to the original payment method.")
    items = {i["item_id"]: i for i in find(db, "order_items", order_id=order_id)}
    ret = None
    if reason == "return":
        if not return_id:
            raise ToolError("missing_return", "A return refund needs return_id.")
        ret = one(db, "returns", return_id=return_id)
        if ret["order_id"] != order_id:
            raise ToolError("wrong_order", f"Return {return_id} belongs to order {ret['order_id']}.")
        if ret["status"] != "received":
            raise ToolError("return_not_received", f"Return {return_id} is {ret['status']}; only received returns can be refunded.")
        item = items[ret["item_id"]]
        paid = _money(item["unit_price"] * ret["qty"])
        if ret["condition"] == "damaged":
            raise ToolError("not_refundable", f"Return {return_id} was inspected as damaged; route it to a warranty claim.")
        refundable = _money(paid - _restocking_fee(paid, ret["condition"]))
        if amount > refundable + 1e-9:
            raise ToolError("exceeds_return_value", f"Return {return_id} is worth at most {refundable:.2f} after restocking fees.")
    elif reason == "price_match":
        if not price_check_id:
            raise ToolError("missing_price_check", "A price match needs price_check_id.")
        check = one(db, "price_checks", check_id=price_check_id)
        matched = [i for i in items.values() if i["sku"] == check["sku"]]
        if not matched:
            raise ToolError("sku_not_on_order", f"Order {order_id} has no item with SKU {check['sku']}.")
        item = matched[0]
        if find(db, "refunds", order_id=order_id, reason="price_match"):
            raise ToolError("duplicate", f"Order {order_id} already had a price-match refund.")
        difference = _money((item["unit_price"] - check["competitor_price"]) * item["qty"])
        if difference <= 0:
            raise ToolError("not_lower", f"{check['competitor']} at {check['competitor_price']:.2f} is not below the price paid.")
        if amount > difference + 1e-9:
            raise ToolError("exceeds_difference", f"The price difference is {difference:.2f}.")
    if amount > staff["refund_limit"] + 1e-9:
        if not approval_id:
            raise ToolError("approval_required", f"{amount:.2f} exceeds the refund limit of {staff_id} ({staff['refund_limit']:.2f}).")
        approval = one(db, "approvals", approval_id=approval_id)
        if approval["kind"] != "refund_over_limit" or approval["order_id"] != order_id or approval["return_id"] != return_id:
            raise ToolError("approval_mismatch", f"Approval {approval_id} does not cover this refund.")
        if approval["status"] != "active":
            raise ToolError("approval_not_active", f"Approval {approval_id} is {approval['status']}.")
        if datetime.fromisoformat(approval["expires_at"]) < NOW:
            raise ToolError("approval_expired", f"Approval {approval_id} expired at {approval['expires_at']}.")
        if amount > approval["max_amount"] + 1e-9:
            raise ToolError("approval_insufficient", f"Approval {approval_id} covers at most {approval['max_amount']:.2f}.")
        db["approvals"].update(approval_id, {"status": "used"})
    refund_id = _next_id(db, "refunds", "refund_id", "RF-", 5)
    db["refunds"].insert(
        {
            "refund_id": refund_id,
            "order_id": order_id,
            "return_id": return_id if reason == "return" else None,
            "reason": reason,
            "amount": amount,
            "destination": destination,
            "price_check_id": price_check_id if reason == "price_match" else None,
            "approval_id": approval_id if amount > staff["refund_limit"] + 1e-9 else None,
            "issued_at": NOW.isoformat(),
            "issued_by": staff_id,
        }
    )
    if ret is not None:
        db["returns"].update(ret["return_id"], {"status": "refunded"})
    return {"refund_id": refund_id, "order_id": order_id, "amount": amount, "destination": destination, "status": "issued"}


@write_tool
def create_exchange(db, staff_id: str, return_id: str, new_sku: str, warehouse_id: str) -> dict:
    """Ships a replacement in another size or colour of the same model for an in-transit
    or received return, from the chosen warehouse, and closes the return as exchanged.
    Exchanges are even: the replacement's current price may not exceed the price paid.

    Args:
        staff_id: The staff member setting up the exchange.
        return_id: The return being exchanged.
        new_sku: The SKU of the replacement.
        warehouse_id: The warehouse the replacement ships from, e.g. "WH-QQQ".
    """
    _active_staff(db, staff_id)
    ret = one(db, "returns", return_id=return_id)
    if ret["status"] not in ("in_transit", "received"):
        raise ToolError("return_not_exchangeable", f"Return {return_id} is {ret['status']}.")
    item = one(db, "order_items", item_id=ret["item_id"])
    old = one(db, "products", sku=item["sku"])
    new = one(db, "products", sku=new_sku)
    if new["model_id"] != old["model_id"] or new_sku == old["sku"]:
        raise ToolError("not_same_model", f"{new_sku} is not another size or colour of {old['name']}.")
    if not new["active"]:
        raise ToolError("inactive_product", f"{new_sku} is no longer sold.")
    if new["price"] > item["unit_price"] + 1e-9:
        raise ToolError("uneven_exchange", f"{new_sku} costs {new['price']:.2f}, more than the {item['unit_price']:.2f} paid.")
    inv = find(db, "inventory", sku=new_sku, warehouse_id=warehouse_id)
    if not inv or inv[0]["on_hand"] - inv[0]["reserved"] < ret["qty"]:
        raise ToolError("out_of_stock", f"{new_sku} is not available at {warehouse_id}.")
    order = one(db, "orders", order_id=ret["order_id"])
    lane = one(db, "transit_lanes", warehouse_id=warehouse_id, state=order["ship_state"])
    est = _add_business_days(_dispatch_day(), lane["business_days"]).isoformat()
    db["inventory"].update(inv[0]["inventory_id"], {"reserved": inv[0]["reserved"] + ret["qty"]})
    exchange_id = _next_id(db, "exchanges", "exchange_id", "EX-", 4)
    db["exchanges"].insert(
        {
            "exchange_id": exchange_id,
            "return_id": return_id,
            "new_sku": new_sku,
            "warehouse_id": warehouse_id,
            "qty": ret["qty"],
            "est_delivery": est,
            "created_at": NOW.isoformat(),
            "created_by": staff_id,
        }
    )
    db["returns"].update(return_id, {"status": "exchanged"})
    return {"exchange_id": exchange_id, "new_sku": new_sku, "warehouse_id": warehouse_id, "est_delivery": est}


@write_tool
def file_warranty_claim(
    db,
    staff_id: str,
    item_id: str,
    issue: str,
    share_with_manufacturer: list[Literal["name", "email", "phone", "postal_address"]],
) -> dict:
    """Files a warranty claim for a delivered order item with the product's manufacturer,
    sending the listed categories of the customer's personal data along with it (the
    disclosure is logged). Order and product details are always included.

    Args:
        staff_id: The staff member filing the claim.
        item_id: The order item that failed, e.g. "OI-48210".
        issue: A short description of the defect.
        share_with_manufacturer: Personal-data categories to send: any of "name", "email", "phone", "postal_address".
    """
    _active_staff(db, staff_id)
    item = one(db, "order_items", item_id=item_id)
    order = one(db, "orders", order_id=item["order_id"])
    product = one(db, "products", sku=item["sku"])
    if not order["delivered_at"]:
        raise ToolError("not_delivered", f"Item {item_id} has not been delivered.")
    delivered = datetime.fromisoformat(order["delivered_at"])
    months = product["warranty_months"]
    year, month = divmod(delivered.month - 1 + months, 12)
    warranty_end = delivered.replace(year=delivered.year + year, month=month + 1, day=min(delivered.day, 28))
    if warranty_end < NOW:
        raise ToolError("warranty_expired", f"The {months}-month warranty on {item_id} ended {warranty_end.date().isoformat()}.")
    if any(c["status"] == "open" for c in find(db, "warranty_claims", item_id=item_id)):
        raise ToolError("duplicate", f"Item {item_id} already has an open warranty claim.")
    if not issue.strip():
        raise ToolError("missing_issue", "Describe the defect.")
    categories = ",".join(sorted(set(share_with_manufacturer)))
    claim_id = _next_id(db, "warranty_claims", "claim_id", "WC-", 5)
    db["warranty_claims"].insert(
        {
            "claim_id": claim_id,
            "item_id": item_id,
            "partner_id": product["manufacturer_id"],
            "issue": issue.strip(),
            "shared_categories": categories,
            "filed_at": NOW.isoformat(),
            "filed_by": staff_id,
            "status": "open",
        }
    )
    if categories:
        db["disclosures"].insert(
            {
                "disclosure_id": _next_id(db, "disclosures", "disclosure_id", "DSC-", 4),
                "customer_id": order["customer_id"],
                "partner_id": product["manufacturer_id"],
                "categories": categories,
                "purpose": f"warranty claim {claim_id}",
                "disclosed_at": NOW.isoformat(),
                "disclosed_by": staff_id,
            }
        )
    manufacturer = one(db, "partners", partner_id=product["manufacturer_id"])
    return {"claim_id": claim_id, "manufacturer": manufacturer["name"], "shared_categories": categories, "status": "open"}
