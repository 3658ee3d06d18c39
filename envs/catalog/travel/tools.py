"""Tools of the Halden Biosciences corporate travel desk."""

import math
from datetime import date, datetime, timedelta

from envs.toolkit import ToolError, find, one, read_tool, write_tool

NOW = datetime.fromisoformat("2026-04-13T09:00:00-04:00")
BOOKING_TEAM = "Travel & Events"


def _unavailable(field: str) -> dict:
    return {"error": "required_field_unavailable", "field": field, "scope": "current_snapshot", "recoverable": False}


def _day(value: str, field: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ToolError("invalid_date", f"{field} must be a date like 2026-04-20 (got {value!r}).") from None


def _km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    h = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return round(2 * 6371.0 * math.asin(math.sqrt(h)), 2)


def _airports(db, place: str) -> list[str]:
    wanted = place.strip().casefold()
    codes = [
        a["iata"]
        for a in find(db, "airports")
        if wanted in (a["iata"].casefold(), a["metro_code"].casefold(), a["city"].casefold())
    ]
    if not codes:
        raise ToolError("unknown_place", f"No airport or city matches {place!r}; use an IATA airport or city code or a city name.")
    return codes


def _name(db, traveller_id: str) -> str:
    return one(db, "travellers", traveller_id=traveller_id)["full_name"]


def _delegation_view(db, d: dict, other: str) -> dict:
    other_id = d[other]
    return {
        "delegation_id": d["delegation_id"],
        f"{other.removesuffix('_id')}_id": other_id,
        f"{other.removesuffix('_id')}_name": _name(db, other_id),
        "scope": d["scope"],
        "status": d["status"],
        "granted_at": d["granted_at"],
        "revoked_at": d["revoked_at"],
    }


@read_tool
def find_traveller(db, query: str) -> list[dict]:
    """Finds employees in the travel profile directory by traveller id, employee id, email
    or (part of) their name. Each match comes with department, title, job level, office,
    home airport, cost centre, passport on file, frequent-flyer numbers, booking
    delegations (who may book for them, and for whom they may book) and their trips.

    Args:
        query: A traveller id such as "TRV-9999", an employee id, an email address, or a name.
    """
    wanted = query.strip().casefold()
    rows = [
        r
        for r in find(db, "travellers")
        if wanted in (r["traveller_id"].casefold(), r["employee_id"].casefold(), r["email"].casefold())
        or (wanted and wanted in r["full_name"].casefold())
    ]
    if not rows:
        raise ToolError("not_found", f"No traveller matches {query!r}.")
    result = []
    for r in rows[:10]:
        office = one(db, "sites", site_id=r["office_site_id"])
        profile = {k: r[k] for k in ("traveller_id", "employee_id", "full_name", "email", "department", "title", "job_level")}
        profile["office"] = office["name"]
        profile.update({k: r[k] for k in ("home_airport", "cost_center", "status")})
        profile["passport_country"] = r["passport_country"]
        if r["passport_country"] is None:
            profile["passport_expiry"] = None
        else:
            profile["passport_expiry"] = r["passport_expiry"] if r["passport_expiry"] is not None else _unavailable("passport_expiry")
        profile["frequent_flyer"] = [p.strip() for p in r["frequent_flyer"].split(";")] if r["frequent_flyer"] else []
        profile["booking_delegates"] = [_delegation_view(db, d, "delegate_id") for d in find(db, "delegations", principal_id=r["traveller_id"])]
        profile["delegate_for"] = [_delegation_view(db, d, "principal_id") for d in find(db, "delegations", delegate_id=r["traveller_id"])]
        profile["trips"] = [
            {k: t[k] for k in ("trip_id", "purpose", "destination_city", "depart_date", "return_date", "status")}
            for t in sorted(find(db, "trips", traveller_id=r["traveller_id"]), key=lambda t: t["trip_id"])
        ]
        result.append(profile)
    return result


@read_tool
def get_trip(db, trip_id: str) -> dict:
    """Returns a trip: traveller, purpose, destination and site, dates, the approval (status,
    approver, approved budget), the company events-calendar entry and the organiser's
    registration confirmation when the trip is for an event, and the bookings made so far.

    Args:
        trip_id: A trip id such as "TR-9999-118".
    """
    trip = one(db, "trips", trip_id=trip_id)
    out = {k: trip[k] for k in ("trip_id", "traveller_id")}
    out["traveller_name"] = _name(db, trip["traveller_id"])
    out.update({k: trip[k] for k in ("purpose", "destination_city", "depart_date", "return_date")})
    out["international"] = bool(trip["international"])
    out["status"] = trip["status"]
    if trip["site_id"]:
        site = one(db, "sites", site_id=trip["site_id"])
        out["site"] = {k: site[k] for k in ("site_id", "name", "kind", "address", "city")}
    else:
        out["site"] = None
    out["approval"] = {
        "status": trip["approval_status"],
        "approver_id": trip["approver_id"],
        "approver_name": _name(db, trip["approver_id"]) if trip["approver_id"] else None,
        "approved_budget": trip["approved_budget"],
        "decided_at": trip["approved_at"],
    }
    out["event"] = None
    out["registration"] = None
    if trip["event_id"]:
        event = one(db, "events", event_id=trip["event_id"])
        venue = one(db, "sites", site_id=event["venue_site_id"])
        hotel = one(db, "hotels", hotel_id=event["official_hotel_id"]) if event["official_hotel_id"] else None
        out["event"] = {
            "event_id": event["event_id"],
            "name": event["name"],
            "organizer": event["organizer"],
            "source": f"Halden events calendar ({event['source']})",
            "calendar_verified_at": event["verified_at"],
            "start_date": event["start_date"],
            "end_date": event["end_date"],
            "venue": {"site_id": venue["site_id"], "name": venue["name"], "address": venue["address"]},
            "official_hotel": {"hotel_id": hotel["hotel_id"], "name": hotel["name"]} if hotel else None,
        }
        regs = find(db, "registrations", event_id=trip["event_id"], traveller_id=trip["traveller_id"])
        if regs:
            reg = regs[0]
            out["registration"] = {
                "registration_id": reg["registration_id"],
                "source": f"{event['organizer']} confirmation",
                "confirmation_no": reg["confirmation_no"],
                "status": reg["status"],
                "event_start": reg["event_start"],
                "event_end": reg["event_end"],
                "confirmed_at": reg["confirmed_at"],
            }
    bookings = []
    for b in find(db, "bookings", trip_id=trip_id):
        item = {k: b[k] for k in ("booking_id", "kind", "status", "amount", "booked_at")}
        item["requested_by"] = b["requested_by"]
        if b["kind"] == "flight":
            fare = one(db, "fares", fare_id=b["fare_id"])
            flight = one(db, "flights", flight_id=fare["flight_id"])
            item.update(
                {
                    "fare_id": fare["fare_id"],
                    "flight": f"{flight['carrier']} {flight['flight_no']}",
                    "route": f"{flight['origin']}-{flight['destination']}",
                    "depart_local": flight["depart_local"],
                    "cabin": fare["cabin"],
                }
            )
        else:
            hotel = one(db, "hotels", hotel_id=b["hotel_id"])
            item.update({"hotel_id": hotel["hotel_id"], "hotel": hotel["name"], "check_in": b["check_in"], "check_out": b["check_out"]})
        bookings.append(item)
    out["bookings"] = bookings
    return out


@read_tool
def search_flights(db, origin: str, destination: str, date: str) -> list[dict]:
    """Lists scheduled flights departing on a date (local time) between two places, each
    with its fares: cabin, fare basis, price in USD, refundability and seats left.

    Args:
        origin: An IATA airport code ("QQX"), a city code ("QQL") or a city name.
        destination: An IATA airport code, a city code or a city name.
        date: The local departure date, YYYY-MM-DD.
    """
    day = _day(date, "date").isoformat()
    origins, destinations = set(_airports(db, origin)), set(_airports(db, destination))
    flights = [
        f
        for f in find(db, "flights")
        if f["origin"] in origins and f["destination"] in destinations and f["depart_local"][:10] == day
    ]
    result = []
    for f in sorted(flights, key=lambda f: f["depart_local"]):
        fares = [
            {
                "fare_id": x["fare_id"],
                "cabin": x["cabin"],
                "fare_basis": x["fare_basis"],
                "price": x["price"],
                "refundable": bool(x["refundable"]),
                "seats_left": x["seats_left"],
            }
            for x in sorted(find(db, "fares", flight_id=f["flight_id"]), key=lambda x: x["price"])
        ]
        result.append(
            {
                "flight_id": f["flight_id"],
                "flight": f"{f['carrier']} {f['flight_no']}",
                "origin": f["origin"],
                "destination": f["destination"],
                "depart_local": f["depart_local"],
                "arrive_local": f["arrive_local"],
                "duration_min": f["duration_min"],
                "stops": f["stops"],
                "aircraft": f["aircraft"],
                "fares": fares,
            }
        )
    return result


def _stay(db, hotel: dict, check_in: date, check_out: date) -> dict | None:
    nights = []
    rates = find(db, "hotel_rates", hotel_id=hotel["hotel_id"])
    day = check_in
    while day < check_out:
        rate = next((r for r in rates if r["valid_from"] <= day.isoformat() < r["valid_to"]), None)
        if rate is None or rate["rooms_left"] <= 0:
            return None
        nights.append(rate)
        day += timedelta(days=1)
    return {
        "nightly_rates": [r["nightly_rate"] for r in nights],
        "total_price": round(sum(r["nightly_rate"] for r in nights), 2),
        "refundable": all(r["refundable"] for r in nights),
        "breakfast_included": all(r["breakfast"] for r in nights),
        "rooms_left": min(r["rooms_left"] for r in nights),
        "rate_ids": sorted({r["rate_id"] for r in nights}),
    }


@read_tool
def search_hotels(db, city: str, check_in: str, check_out: str, near_site_id: str | None = None) -> list[dict]:
    """Lists hotels in a city with a room for every night of a stay: nightly rates, the
    total in USD, refundability, breakfast and rooms left. Give a site id (an office,
    client site or event venue from a trip) to get each hotel's straight-line distance
    to it, nearest first.

    Args:
        city: A city name such as "Springfield".
        check_in: Arrival date, YYYY-MM-DD.
        check_out: Departure date, YYYY-MM-DD (after check_in).
        near_site_id: Optional site id to measure distances to, e.g. "S-QQX-QQQ".
    """
    start, end = _day(check_in, "check_in"), _day(check_out, "check_out")
    if end <= start:
        raise ToolError("invalid_stay", "check_out must be after check_in.")
    site = one(db, "sites", site_id=near_site_id) if near_site_id else None
    hotels = [h for h in find(db, "hotels") if h["city"].casefold() == city.strip().casefold()]
    if not hotels:
        raise ToolError("unknown_city", f"No hotels listed in {city!r}.")
    result = []
    for h in hotels:
        stay = _stay(db, h, start, end)
        if stay is None:
            continue
        entry = {k: h[k] for k in ("hotel_id", "name", "chain", "address", "stars")}
        if site:
            entry["distance_km"] = _km(site["lat"], site["lon"], h["lat"], h["lon"])
        entry.update({"check_in": start.isoformat(), "check_out": end.isoformat(), "nights": (end - start).days})
        entry.update(stay)
        result.append(entry)
    result.sort(key=lambda e: (e.get("distance_km", 0.0), e["total_price"]))
    return result


def _authorised(db, trip: dict, requested_by: str) -> None:
    requester = one(db, "travellers", traveller_id=requested_by)
    if requester["status"] != "active":
        raise ToolError("requester_inactive", f"{requested_by} is not an active employee.")
    if requested_by == trip["traveller_id"] or requester["department"] == BOOKING_TEAM:
        return
    delegations = find(db, "delegations", principal_id=trip["traveller_id"], delegate_id=requested_by, scope="travel_booking")
    if not any(d["status"] == "active" for d in delegations):
        raise ToolError(
            "not_authorised",
            f"{requester['full_name']} has no active booking delegation from {_name(db, trip['traveller_id'])}.",
        )


def _bookable_trip(db, trip_id: str) -> dict:
    trip = one(db, "trips", trip_id=trip_id)
    if trip["approval_status"] != "approved" or trip["status"] in ("cancelled", "completed"):
        raise ToolError("trip_not_approved", f"Trip {trip_id} is {trip['status']} with approval {trip['approval_status']}.")
    return trip


def _next_booking_id(db) -> str:
    numbers = [int(b["booking_id"].split("-")[1]) for b in find(db, "bookings")]
    return f"BK-{max(numbers, default=0) + 1:05d}"


@write_tool
def book_flight(db, trip_id: str, fare_id: str, requested_by: str) -> dict:
    """Tickets one flight fare on a trip and adds it to the trip's bookings.

    Args:
        trip_id: The trip the flight belongs to.
        fare_id: The fare to ticket, from search_flights.
        requested_by: Traveller id of the employee asking for the booking (the traveller, a booking delegate, or Travel & Events).
    """
    trip = _bookable_trip(db, trip_id)
    _authorised(db, trip, requested_by)
    fare = one(db, "fares", fare_id=fare_id)
    flight = one(db, "flights", flight_id=fare["flight_id"])
    if fare["seats_left"] <= 0:
        raise ToolError("sold_out", f"Fare {fare_id} has no seats left.")
    day = flight["depart_local"][:10]
    if trip["depart_date"] and trip["return_date"]:
        earliest = (date.fromisoformat(trip["depart_date"]) - timedelta(days=1)).isoformat()
        if not earliest <= day <= trip["return_date"]:
            raise ToolError("outside_trip", f"{flight['carrier']} {flight['flight_no']} on {day} is outside trip {trip_id}.")
    if find(db, "bookings", trip_id=trip_id, fare_id=fare_id, status="confirmed"):
        raise ToolError("duplicate", f"Fare {fare_id} is already booked on trip {trip_id}.")
    booking_id = _next_booking_id(db)
    db["bookings"].insert(
        {
            "booking_id": booking_id,
            "trip_id": trip_id,
            "kind": "flight",
            "fare_id": fare_id,
            "hotel_id": None,
            "check_in": None,
            "check_out": None,
            "amount": fare["price"],
            "status": "confirmed",
            "booked_at": NOW.isoformat(),
            "requested_by": requested_by,
        }
    )
    db["fares"].update(fare_id, {"seats_left": fare["seats_left"] - 1})
    return {
        "booking_id": booking_id,
        "flight": f"{flight['carrier']} {flight['flight_no']}",
        "depart_local": flight["depart_local"],
        "cabin": fare["cabin"],
        "amount": fare["price"],
        "status": "confirmed",
    }


@write_tool
def book_hotel(db, trip_id: str, hotel_id: str, check_in: str, check_out: str, requested_by: str) -> dict:
    """Books a hotel room for a stay on a trip and adds it to the trip's bookings.

    Args:
        trip_id: The trip the stay belongs to.
        hotel_id: The hotel, from search_hotels.
        check_in: Arrival date, YYYY-MM-DD.
        check_out: Departure date, YYYY-MM-DD.
        requested_by: Traveller id of the employee asking for the booking (the traveller, a booking delegate, or Travel & Events).
    """
    trip = _bookable_trip(db, trip_id)
    _authorised(db, trip, requested_by)
    hotel = one(db, "hotels", hotel_id=hotel_id)
    if hotel["city"].casefold() != trip["destination_city"].casefold():
        raise ToolError("wrong_city", f"{hotel['name']} is in {hotel['city']}, not {trip['destination_city']}.")
    start, end = _day(check_in, "check_in"), _day(check_out, "check_out")
    if end <= start:
        raise ToolError("invalid_stay", "check_out must be after check_in.")
    stay = _stay(db, hotel, start, end)
    if stay is None:
        raise ToolError("no_availability", f"{hotel['name']} has no room for every night from {check_in} to {check_out}.")
    booking_id = _next_booking_id(db)
    db["bookings"].insert(
        {
            "booking_id": booking_id,
            "trip_id": trip_id,
            "kind": "hotel",
            "fare_id": None,
            "hotel_id": hotel_id,
            "check_in": start.isoformat(),
            "check_out": end.isoformat(),
            "amount": stay["total_price"],
            "status": "confirmed",
            "booked_at": NOW.isoformat(),
            "requested_by": requested_by,
        }
    )
    for rate_id in stay["rate_ids"]:
        rate = one(db, "hotel_rates", rate_id=rate_id)
        db["hotel_rates"].update(rate_id, {"rooms_left": rate["rooms_left"] - 1})
    return {
        "booking_id": booking_id,
        "hotel": hotel["name"],
        "check_in": start.isoformat(),
        "check_out": end.isoformat(),
        "nights": (end - start).days,
        "amount": stay["total_price"],
        "status": "confirmed",
    }
