"""Tools of the Harrow & Vale Bank operations console snapshot."""

import typing
from typing import Literal, Optional

from envs.toolkit import ToolError, find, one, read_tool, write_tool

NOW = "2026-03-17T10:30:00Z"
TODAY = "2026-03-17"
Category = Literal["account_confirmation", "balance_band", "income", "employer", "address", "date_of_birth"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]


def _long_date(iso: str) -> str:
    return f"{int(iso[8:10])} {_MONTHS[int(iso[5:7]) - 1]} {iso[:4]}"


def _limit(db, account_id: str) -> dict:
    rows = find(db, "limits", account_id=account_id, limit_type="daily_outbound")
    if not rows:
        return {}
    row = rows[0]
    return {"limit_id": row["limit_id"], "amount": row["amount"], "currency": row["currency"],
            "used_today": row["used_today"], "remaining_today": round(row["amount"] - row["used_today"], 2)}


def _payee_view(row: dict) -> dict:
    view = {k: row[k] for k in ("payee_id", "name", "bank_name", "country", "currency")}
    for k in ("sort_code", "account_number", "iban", "bic"):
        if row[k] is not None:
            view[k] = row[k]
    view["confirmation_of_payee"] = row["cop_result"]
    view["added_on"] = row["added_on"]
    return view


@read_tool
def search_customers(db, query: str) -> list[dict]:
    """Finds customers by (part of) their name, or exactly by customer id,
    company number, postcode, account id or 8-digit account number. Returns
    at most 10 matches with their id, name, type, city and postcode.

    Args:
        query: A name or part of one ("Ashdown"), or an identifier.
    """
    wanted = query.strip().casefold()
    if not wanted:
        raise ToolError("invalid_query", "Give a name or an identifier to search for.")
    by_account = {a["account_id"].casefold(): a["customer_id"] for a in find(db, "accounts")}
    by_account.update({a["account_number"]: a["customer_id"] for a in find(db, "accounts")})
    hits = []
    for c in find(db, "customers"):
        keys = {c["customer_id"].casefold(), (c["company_number"] or "").casefold(), c["postcode"].casefold()}
        if wanted in c["name"].casefold() or wanted in keys or by_account.get(wanted) == c["customer_id"]:
            hits.append({k: c[k] for k in ("customer_id", "name", "customer_type", "city", "postcode")})
    return hits[:10]


@read_tool
def get_customer(db, customer_id: str) -> dict:
    """Returns a customer's profile (address, date of birth, employer, verified
    monthly income, company number, KYC status, relationship manager), their
    accounts with balances, and the KYC documents held on file (identity
    documents, board resolutions, powers of attorney, income evidence).

    Args:
        customer_id: A customer id such as "C-999999".
    """
    c = one(db, "customers", customer_id=customer_id)
    profile = dict(c)
    profile["accounts"] = [
        {k: a[k] for k in ("account_id", "product", "currency", "sort_code", "account_number", "status", "opened_on",
                           "available_balance")}
        for a in find(db, "accounts", customer_id=customer_id)
    ]
    profile["kyc_documents"] = [
        {k: d[k] for k in ("doc_id", "doc_type", "reference", "issued_on", "expires_on", "verified_on", "summary")}
        for d in find(db, "kyc_documents", customer_id=customer_id)
    ]
    return profile


@read_tool
def get_account(db, account_id: str) -> dict:
    """Returns an account's details: product, currency, sort code and number,
    status, ledger and available balance, whether it may pay third parties,
    its daily outbound limit (used and remaining today), its saved payees and
    its ten most recent transfers.

    Args:
        account_id: An account id such as "HV-99999999".
    """
    a = one(db, "accounts", account_id=account_id)
    view = dict(a)
    view["third_party_payments"] = bool(a["third_party_payments"])
    view["daily_outbound_limit"] = _limit(db, account_id)
    view["payees"] = [_payee_view(p) for p in find(db, "payees", account_id=account_id) if p["status"] == "active"]
    names = {p["payee_id"]: p["name"] for p in find(db, "payees", account_id=account_id)}
    recent = sorted(find(db, "transfers", from_account_id=account_id), key=lambda t: t["created_at"], reverse=True)[:10]
    view["recent_transfers"] = [
        {"transfer_id": t["transfer_id"], "created_at": t["created_at"], "payee_id": t["payee_id"],
         "payee_name": names.get(t["payee_id"]), "amount": t["amount"], "currency": t["currency"],
         "debit_amount": t["debit_amount"], "reference": t["reference"], "status": t["status"]}
        for t in recent
    ]
    return view


@read_tool
def get_mandate(db, account_id: str) -> dict:
    """Returns the signing mandate of an account: the signing rule, the amount
    up to which one signatory may authorise alone, the source document it was
    registered from, and every signatory with their role and current
    authority status.

    Args:
        account_id: An account id.
    """
    one(db, "accounts", account_id=account_id)
    rows = find(db, "mandates", account_id=account_id, status="active")
    if not rows:
        raise ToolError("not_found", f"No active mandate on account {account_id}.")
    m = rows[0]
    view = {k: m[k] for k in ("mandate_id", "account_id", "signing_rule", "sole_limit", "currency", "effective_from",
                              "source_doc_id")}
    view["signatories"] = [
        {k: s[k] for k in ("signatory_id", "name", "role", "authority_status", "valid_from", "revoked_on",
                           "registration_ref", "notes")}
        for s in find(db, "signatories", mandate_id=m["mandate_id"])
    ]
    return view


@read_tool
def get_fx_rate(db, sell_currency: str, buy_currency: str) -> dict:
    """FX rates service: the live dealing quote for converting one currency
    into another. The rate is the number of units of the buy currency per one
    unit of the sell currency. Quotes are valid until the time shown and are
    referenced by their quote id when executing a payment.

    Args:
        sell_currency: ISO code of the currency debited, e.g. "GBP".
        buy_currency: ISO code of the currency paid out, e.g. "EUR".
    """
    sell, buy = sell_currency.strip().upper(), buy_currency.strip().upper()
    live = [r for r in find(db, "fx_rates", sell_currency=sell, buy_currency=buy) if r["valid_until"] >= NOW]
    if not live:
        raise ToolError("not_quoted", f"No live quote for {sell}/{buy}.")
    q = max(live, key=lambda r: r["as_of"])
    return {"quote_id": q["quote_id"], "sell_currency": sell, "buy_currency": buy, "rate": q["rate"],
            "as_of": q["as_of"], "valid_until": q["valid_until"]}


@read_tool
def get_disclosure_record(db, customer_id: str) -> dict:
    """Returns the customer's signed consents to share information with third
    parties (recipient, recipient type, categories covered, purpose, dates,
    status) and the log of every disclosure already made (recipient,
    categories disclosed, date, consent used).

    Args:
        customer_id: A customer id.
    """
    one(db, "customers", customer_id=customer_id)
    recipients = {r["recipient_id"]: r for r in find(db, "recipients")}

    def who(rid: str) -> dict:
        r = recipients[rid]
        return {"recipient_id": rid, "recipient_name": r["name"], "recipient_type": r["recipient_type"]}

    consents = [
        {"consent_id": c["consent_id"], **who(c["recipient_id"]), "categories": c["categories"], "purpose": c["purpose"],
         "signed_on": c["signed_on"], "expires_on": c["expires_on"], "status": c["status"]}
        for c in find(db, "consents", customer_id=customer_id)
    ]
    disclosures = [
        {"disclosure_id": d["disclosure_id"], **who(d["recipient_id"]), "categories": d["categories"],
         "disclosed_on": d["disclosed_on"], "consent_id": d["consent_id"], "disclosed_by": d["disclosed_by"],
         "channel": d["channel"]}
        for d in sorted(find(db, "disclosures", customer_id=customer_id), key=lambda d: d["disclosed_on"])
    ]
    return {"customer_id": customer_id, "consents": consents, "disclosures": disclosures}


@write_tool
def create_transfer(
    db,
    from_account_id: str,
    payee_id: str,
    amount: float,
    authorised_by: list[str],
    reference: str,
    fx_quote_id: Optional[str] = None,
) -> dict:
    """Executes a payment from an account to one of its saved payees, in the
    payee's currency. Debits the account's available and ledger balance and
    counts against its daily outbound limit. Checks that every authoriser is
    a signatory named on the account's mandate and that payments above the
    mandate's sole-signatory amount carry two different authorisers; the
    operator remains responsible for checking each authoriser's current
    authority. A payment in another currency than the account's needs a live
    quote id from the FX rates service.

    Args:
        from_account_id: The account to debit.
        payee_id: A saved payee of that account.
        amount: The amount to pay, in the payee's currency.
        authorised_by: Signatory ids of the people who authorised the payment.
        reference: The payment reference shown to the payee.
        fx_quote_id: The FX quote id, required when the payee's currency differs from the account's.
    """
    acc = one(db, "accounts", account_id=from_account_id)
    payee = one(db, "payees", payee_id=payee_id)
    if payee["account_id"] != from_account_id or payee["status"] != "active":
        raise ToolError("unknown_payee", f"{payee_id} is not an active saved payee of account {from_account_id}.")
    if acc["status"] != "active":
        raise ToolError("account_not_active", f"Account {from_account_id} is {acc['status']}.")
    if not acc["third_party_payments"]:
        raise ToolError("third_party_payments_blocked", f"Account {from_account_id} cannot pay third parties.")
    if amount <= 0 or round(amount, 2) != amount:
        raise ToolError("invalid_amount", "The amount must be positive, in whole pennies/cents.")
    if not reference.strip() or len(reference) > 35:
        raise ToolError("invalid_reference", "The reference must be 1-35 characters.")
    debit, quote_id = amount, None
    if payee["currency"] != acc["currency"]:
        if not fx_quote_id:
            raise ToolError("fx_quote_required", f"Paying {payee['currency']} from a {acc['currency']} account needs an FX quote id.")
        quotes = find(db, "fx_rates", quote_id=fx_quote_id)
        if not quotes or quotes[0]["sell_currency"] != acc["currency"] or quotes[0]["buy_currency"] != payee["currency"]:
            raise ToolError("invalid_fx_quote", f"{fx_quote_id} is not a {acc['currency']}/{payee['currency']} quote.")
        if quotes[0]["valid_until"] < NOW:
            raise ToolError("fx_quote_expired", f"Quote {fx_quote_id} expired at {quotes[0]['valid_until']}.")
        debit, quote_id = round(amount / quotes[0]["rate"], 2), fx_quote_id
    if debit > acc["available_balance"]:
        raise ToolError("insufficient_funds", f"Debit {debit:.2f} {acc['currency']} exceeds the available balance.")
    limit = _limit(db, from_account_id)
    if limit and debit > limit["remaining_today"]:
        raise ToolError("daily_limit_exceeded", f"Debit {debit:.2f} {acc['currency']} exceeds the remaining daily limit.")
    mandate = find(db, "mandates", account_id=from_account_id, status="active")
    if not mandate:
        raise ToolError("no_mandate", f"Account {from_account_id} has no active mandate.")
    named = {s["signatory_id"] for s in find(db, "signatories", mandate_id=mandate[0]["mandate_id"])}
    authorisers = sorted(set(authorised_by))
    if not authorisers:
        raise ToolError("unauthorised", "At least one authoriser is needed.")
    strangers = [s for s in authorisers if s not in named]
    if strangers:
        raise ToolError("unauthorised", f"{', '.join(strangers)} not named on mandate {mandate[0]['mandate_id']}.")
    sole = mandate[0]["sole_limit"]
    if sole is not None and debit > sole and len(authorisers) < 2:
        raise ToolError("second_signatory_required", f"Payments above {sole:,.2f} need two authorisers under {mandate[0]['mandate_id']}.")
    seq = len([t for t in find(db, "transfers") if t["created_at"].startswith(TODAY)]) + 1
    transfer_id = f"TRF-{TODAY.replace('-', '')}-{seq:04d}"
    db["transfers"].insert({
        "transfer_id": transfer_id, "from_account_id": from_account_id, "payee_id": payee_id, "amount": amount,
        "currency": payee["currency"], "debit_amount": debit, "debit_currency": acc["currency"], "fx_quote_id": quote_id,
        "authorised_by": ",".join(authorisers), "reference": reference.strip(), "status": "completed", "created_at": NOW,
    })
    db["accounts"].update(from_account_id, {"ledger_balance": round(acc["ledger_balance"] - debit, 2),
                                            "available_balance": round(acc["available_balance"] - debit, 2)})
    if limit:
        db["limits"].update(limit["limit_id"], {"used_today": round(limit["used_today"] + debit, 2)})
    return {"transfer_id": transfer_id, "status": "completed", "amount": amount, "currency": payee["currency"],
            "debit_amount": debit, "debit_currency": acc["currency"], "fx_quote_id": quote_id,
            "available_balance_after": round(acc["available_balance"] - debit, 2)}


@write_tool
def send_disclosure(db, customer_id: str, consent_id: str, categories: list[Category]) -> dict:
    """Sends the customer's information in the given categories to the
    recipient named on a consent, and records the disclosure in the log.
    Checks that the consent belongs to the customer, is active and unexpired,
    and covers every category; the operator remains responsible for the
    cumulative disclosure rules. Returns the statements sent.

    Args:
        customer_id: The customer the information is about.
        consent_id: The signed consent that authorises the disclosure.
        categories: The information categories to disclose.
    """
    c = one(db, "customers", customer_id=customer_id)
    consent = one(db, "consents", consent_id=consent_id)
    if consent["customer_id"] != customer_id:
        raise ToolError("consent_mismatch", f"{consent_id} was not signed by {customer_id}.")
    if consent["status"] != "active" or consent["expires_on"] < TODAY:
        raise ToolError("consent_not_active", f"{consent_id} is {consent['status']} (expires {consent['expires_on']}).")
    covered = {x.strip() for x in consent["categories"].split(",")}
    wanted = [x for x in typing.get_args(Category) if x in categories]
    if not wanted:
        raise ToolError("nothing_to_disclose", "Name at least one category.")
    outside = [x for x in wanted if x not in covered]
    if outside:
        raise ToolError("not_covered", f"{consent_id} does not cover {', '.join(outside)}.")
    accounts = [a for a in find(db, "accounts", customer_id=customer_id) if a["status"] == "active"]
    main = min(accounts, key=lambda a: (a["third_party_payments"] == 0, a["opened_on"])) if accounts else None
    statements = {}
    for cat in wanted:
        if cat == "account_confirmation":
            if main is None:
                raise ToolError("no_account", f"{customer_id} holds no active account.")
            article = "an" if main["product"][0] in "AEIOU" else "a"
            statements[cat] = (f"{c['name']} has held {article} {main['product']} with Harrow & Vale Bank since "
                               f"{_long_date(main['opened_on'])}; the account is in good standing.")
        elif cat == "balance_band":
            total = sum(a["available_balance"] for a in accounts if a["currency"] == "GBP")
            bands = [(1000, "under GBP 1,000"), (5000, "GBP 1,000 to 4,999"), (10000, "GBP 5,000 to 9,999"),
                     (25000, "GBP 10,000 to 24,999")]
            statements[cat] = next((b for top, b in bands if total < top), "GBP 25,000 or more")
        elif cat == "income":
            if c["verified_monthly_income"] is None:
                raise ToolError("no_verified_income", f"No verified income on file for {customer_id}.")
            statements[cat] = f"Verified net monthly income: GBP {c['verified_monthly_income']:,.2f}."
        elif cat == "employer":
            statements[cat] = f"Employer: {c['employer']}."
        elif cat == "address":
            statements[cat] = f"Registered address: {c['address']}, {c['city']} {c['postcode']}."
        else:
            statements[cat] = f"Date of birth: {c['date_of_birth']}."
    existing = [int(d["disclosure_id"].split("-")[1]) for d in find(db, "disclosures")]
    disclosure_id = f"DSC-{max(existing, default=6100) + 1}"
    db["disclosures"].insert({
        "disclosure_id": disclosure_id, "customer_id": customer_id, "recipient_id": consent["recipient_id"],
        "consent_id": consent_id, "categories": ", ".join(wanted), "disclosed_on": TODAY, "disclosed_by": "ops.console",
        "channel": "secure email",
    })
    recipient = one(db, "recipients", recipient_id=consent["recipient_id"])
    return {"disclosure_id": disclosure_id, "recipient": recipient["name"], "statements": statements}
