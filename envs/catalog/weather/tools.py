"""Tools of the California field-operations weather snapshot."""

import math
from typing import Literal

from envs.toolkit import ToolError, find, one, read_tool, write_tool


def _unavailable(field: str) -> dict:
    return {"error": "required_field_unavailable", "field": field, "scope": "current_snapshot", "recoverable": False}


@read_tool
def resolve_weather_point(db, location: str, county: str | None = None) -> dict:
    """Resolves a place name such as "Millbrook, NV" to its weather point: coordinates,
    county id, forecast resource id and time zone. When several weather points
    share the place name, the call is refused with the candidates listed; pass
    the county to choose one.

    Args:
        location: City and state, for example "Millbrook, NV".
        county: Optional county name or id, for example "Fresno County" or "CAC999", to tell apart places with the same name.
    """
    wanted = location.strip().casefold()
    counties = {r["county_id"]: r for r in find(db, "counties")}
    hits = [
        row for row in find(db, "weather_points")
        if row["location"].casefold() == wanted or row["location"].split(",")[0].casefold() == wanted
    ]
    if county:
        c = county.strip().casefold()
        hits = [
            row for row in hits
            if c in (row["county_id"].casefold(), counties[row["county_id"]]["name"].casefold(),
                     counties[row["county_id"]]["name"].casefold().removesuffix(" county"))
        ]
    if not hits:
        raise ToolError("not_found", f"No weather point for {location!r}" + (f" in {county!r}." if county else "."))
    if len(hits) > 1:
        listed = "; ".join(f"{r['point_id']} ({r['location']}, {counties[r['county_id']]['name']})" for r in hits)
        raise ToolError("ambiguous_location", f"{location!r} matches {len(hits)} weather points: {listed}.")
    row = hits[0]
    return {k: row[k] for k in ("point_id", "location", "lat", "lon", "county_id", "forecast_id", "time_zone")}


@read_tool
def list_station_ids_by_county(db, county_id: str) -> list[str]:
    """Lists the ids of all weather stations registered in a county.

    Args:
        county_id: A county id such as "CAC888".
    """
    one(db, "counties", county_id=county_id)
    return [r["station_id"] for r in find(db, "stations", county_id=county_id)]


@read_tool
def get_station(db, station_id: str) -> dict:
    """Returns a station's name, coordinates, elevation, county and operating status.

    Args:
        station_id: A station id such as "KQQQ".
    """
    row = one(db, "stations", station_id=station_id)
    return {k: row[k] for k in ("station_id", "name", "county_id", "lat", "lon", "elevation_m", "status")}


@read_tool
def station_distance(db, station_id: str, point_id: str) -> dict:
    """Great-circle distance in kilometres between a station and a weather point.

    Args:
        station_id: A station id.
        point_id: A weather point id as returned by resolve_weather_point.
    """
    s = one(db, "stations", station_id=station_id)
    p = one(db, "weather_points", point_id=point_id)
    lat1, lat2 = math.radians(p["lat"]), math.radians(s["lat"])
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin(math.radians(s["lon"] - p["lon"]) / 2) ** 2
    return {"station_id": station_id, "point_id": point_id, "distance_km": round(2 * 6371.0 * math.asin(math.sqrt(h)), 1)}


@read_tool
def get_forecast_periods(db, forecast_id: str) -> dict:
    """Returns the official forecast for a forecast resource: the issuing office,
    when it was issued, and every forecast period (temperature, chance of
    precipitation, wind range, short text).

    Args:
        forecast_id: A forecast resource id such as "LOX/999,45".
    """
    forecast = one(db, "forecasts", forecast_id=forecast_id)
    periods = []
    for row in find(db, "forecast_periods", forecast_id=forecast_id):
        period = {k: row[k] for k in ("period_id", "name", "date", "short_forecast", "status")}
        period["is_daytime"] = bool(row["is_daytime"])
        for field in ("temperature_f", "precip_pct", "wind_min_mph", "wind_max_mph"):
            period[field] = row[field] if row[field] is not None else _unavailable(field)
        periods.append(period)
    return {"forecast_id": forecast_id, "office": forecast["office"], "issued_at": forecast["issued_at"], "periods": periods}


@read_tool
def list_field_decisions(db, point_id: str) -> list[dict]:
    """Lists the go/no-go decisions already logged for a weather point.

    Args:
        point_id: A weather point id.
    """
    one(db, "weather_points", point_id=point_id)
    return find(db, "field_decisions", point_id=point_id)


@write_tool
def record_field_decision(
    db, point_id: str, date: str, station_id: str, decision: Literal["proceed", "postpone"], triggers: list[str]
) -> dict:
    """Logs the field team's go/no-go decision for a work day at a weather point.

    Args:
        point_id: The weather point of the work site.
        date: The work day, YYYY-MM-DD.
        station_id: The monitoring reference station chosen for the site.
        decision: "proceed" or "postpone".
        triggers: The policy conditions that triggered a postponement ("temperature", "precipitation", "wind"); empty to proceed.
    """
    one(db, "weather_points", point_id=point_id)
    station = one(db, "stations", station_id=station_id)
    if station["status"] != "active":
        raise ToolError("station_inactive", f"Station {station_id} is {station['status']} and cannot be a monitoring reference.")
    if find(db, "field_decisions", point_id=point_id, date=date):
        raise ToolError("duplicate", f"A decision for {point_id} on {date} is already logged.")
    unknown = set(triggers) - {"temperature", "precipitation", "wind"}
    if unknown:
        raise ToolError("invalid_trigger", f"Unknown triggers {sorted(unknown)}.")
    if (decision == "postpone") != bool(triggers):
        raise ToolError("inconsistent", "A postponement needs at least one trigger; proceeding needs none.")
    decision_id = f"FD-{date[:4]}-{date[5:7]}{date[8:]}-{point_id[:3]}"
    db["field_decisions"].insert(
        {"decision_id": decision_id, "point_id": point_id, "date": date, "station_id": station_id,
         "decision": decision, "triggers": ",".join(sorted(triggers))}
    )
    return {"decision_id": decision_id, "logged": True}
