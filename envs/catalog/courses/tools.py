"""Tools of the Northlake State University registrar's office."""

import re

from envs.toolkit import ToolError, find, one, read_tool, write_tool

TODAY = "2026-08-17"
CURRENT_TERM = "2026FA"
POINTS = {"A": 4.0, "A-": 3.7, "B+": 3.3, "B": 3.0, "B-": 2.7, "C+": 2.3, "C": 2.0, "C-": 1.7, "D+": 1.3, "D": 1.0, "F": 0.0}


def _unavailable(field: str) -> dict:
    return {"error": "required_field_unavailable", "field": field, "scope": "current_snapshot", "recoverable": False}


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def _overlap(a: dict, b: dict) -> bool:
    if not set(a["days"]) & set(b["days"]):
        return False
    return _minutes(a["start_time"]) < _minutes(b["end_time"]) and _minutes(b["start_time"]) < _minutes(a["end_time"])


def _counts(db, section_id: str) -> tuple[int, int]:
    rows = find(db, "enrolments", section_id=section_id)
    return sum(r["status"] == "enrolled" for r in rows), sum(r["status"] == "waitlisted" for r in rows)


def _section_view(db, s: dict) -> dict:
    room = one(db, "rooms", room_id=s["room_id"])
    instructor = one(db, "instructors", instructor_id=s["instructor_id"])
    if s["status"] == "completed":
        enrolled, waitlisted = len(find(db, "grade_rosters", section_id=s["section_id"])), 0
    else:
        enrolled, waitlisted = _counts(db, s["section_id"])
    return {
        "section_id": s["section_id"], "section_number": s["section_number"], "term": s["term"], "days": s["days"],
        "start_time": s["start_time"], "end_time": s["end_time"], "instructor": instructor["name"],
        "room": {"room_id": room["room_id"], "building": room["building"], "room_type": room["room_type"],
                 "seats": room["seats"] if room["seats"] is not None else _unavailable("seats")},
        "capacity": s["capacity"], "enrolled": enrolled, "waitlisted": waitlisted, "status": s["status"],
    }


@read_tool
def find_students(db, name: str | None = None, program: str | None = None) -> list[dict]:
    """Searches student records by name (case-insensitive, any part of the full
    name) and/or program of study; with no filters, lists every student.

    Args:
        name: Part of the student's name, for example "Whitaker".
        program: Program of study, for example "Biology".
    """
    out = []
    for s in find(db, "students"):
        if name and name.strip().casefold() not in s["full_name"].casefold():
            continue
        if program and program.strip().casefold() != s["program"].casefold():
            continue
        out.append({k: s[k] for k in ("student_id", "full_name", "program", "class_standing", "status")})
    return out


@read_tool
def get_student_record(db, student_id: str) -> dict:
    """Returns a student's registrar record: program, standing, advisor, holds,
    the current-term (Fall 2026) schedule with meeting times, the transcript
    (term, course, section, grade) and any grade-change requests.

    Args:
        student_id: A student id such as "N99999999".
    """
    s = one(db, "students", student_id=student_id)
    record = {k: s[k] for k in ("student_id", "full_name", "email", "program", "class_standing", "admit_term", "status")}
    record["ferpa_opt_out"] = bool(s["ferpa_opt_out"])
    advisor = one(db, "instructors", instructor_id=s["advisor_id"])
    record["advisor"] = {"instructor_id": advisor["instructor_id"], "name": advisor["name"]}
    record["holds"] = [
        {**{k: h[k] for k in ("hold_id", "hold_type", "reason", "placed_by", "placed_on", "status", "released_on")},
         "blocks_registration": bool(h["blocks_registration"])}
        for h in find(db, "holds", student_id=student_id)
    ]
    schedule = []
    for e in find(db, "enrolments", student_id=student_id):
        sec = one(db, "sections", section_id=e["section_id"])
        if sec["term"] != CURRENT_TERM:
            continue
        course = one(db, "courses", course_id=sec["course_id"])
        schedule.append({
            "enrolment_id": e["enrolment_id"], "student_id": student_id, "section_id": sec["section_id"], "course_id": sec["course_id"],
            "title": course["title"], "days": sec["days"], "start_time": sec["start_time"], "end_time": sec["end_time"],
            "room_id": sec["room_id"], "status": e["status"], "waitlist_position": e["waitlist_position"],
        })
    record["current_term"] = CURRENT_TERM
    record["schedule"] = schedule
    record["transcript"] = [
        {"term": t["term"], "course_id": t["course_id"], "title": one(db, "courses", course_id=t["course_id"])["title"],
         "section_id": t["section_id"], "grade": t["grade"], "credits": t["credits"]}
        for t in find(db, "transcript_entries", student_id=student_id)
    ]
    record["grade_changes"] = [
        {k: g[k] for k in ("change_id", "student_id", "section_id", "old_grade", "new_grade", "reason", "status", "submitted_on", "decided_on")}
        for g in find(db, "grade_changes", student_id=student_id)
    ]
    return record


@read_tool
def find_course_sections(db, query: str, term: str = "2026FA") -> list[dict]:
    """Finds courses by course id ("STAT 9999", "STAT-9999") or by words of the
    title ("statistics"), with their prerequisites and their sections in a term:
    meeting days and times, instructor, room and its seating, enrolment cap,
    enrolled and waitlisted counts.

    Args:
        query: A course id or words from the course title.
        term: Term code, the year then FA (fall) or SP (spring): "2026FA" (Fall 2026) is the default.
    """
    compact = re.sub(r"[\s_-]", "", query).casefold()
    words = [w.casefold() for w in query.split() if w.strip()]
    if not words:
        raise ToolError("invalid_query", "Give a course id or words from a course title.")
    out = []
    for c in find(db, "courses"):
        if c["course_id"].replace("-", "").casefold() != compact and not all(w in c["title"].casefold() for w in words):
            continue
        out.append({
            "course_id": c["course_id"], "title": c["title"], "department": c["department"], "credits": c["credits"],
            "prerequisites": [{"course_id": p["requires_course_id"], "min_grade": p["min_grade"]}
                              for p in find(db, "prerequisites", course_id=c["course_id"])],
            "sections": [_section_view(db, s) for s in find(db, "sections", course_id=c["course_id"], term=term)],
        })
    return out


@read_tool
def get_grade_roster(db, section_id: str) -> dict:
    """Returns the instructor's certified final grade roster of a completed
    section: every student with the grade the instructor certified and when.

    Args:
        section_id: A completed section such as "CSCI-9999-01-S26".
    """
    sec = one(db, "sections", section_id=section_id)
    if sec["status"] != "completed":
        raise ToolError("not_completed", f"{section_id} has not finished; no final grades exist yet.")
    course = one(db, "courses", course_id=sec["course_id"])
    entries = []
    for r in find(db, "grade_rosters", section_id=section_id):
        student = one(db, "students", student_id=r["student_id"])
        entries.append({"roster_entry_id": r["roster_entry_id"], "student_id": r["student_id"], "name": student["full_name"],
                        "grade": r["grade"], "certified_on": r["certified_on"]})
    return {"section_id": section_id, "course_id": sec["course_id"], "title": course["title"], "term": sec["term"],
            "instructor": one(db, "instructors", instructor_id=sec["instructor_id"])["name"],
            "letter_graded": sum(e["grade"] in POINTS for e in entries), "entries": entries}


@read_tool
def list_disclosures(db, section_id: str) -> dict:
    """Lists the disclosure log for a section: every earlier release of aggregate
    grade statistics about it (recipient, purpose, statistic, cohort size, value, date).

    Args:
        section_id: A section such as "PHYS-9999-02-S26".
    """
    one(db, "sections", section_id=section_id)
    releases = [{k: d[k] for k in ("disclosure_id", "recipient", "purpose", "statistic", "cohort_size", "value", "released_on", "released_by")}
                for d in find(db, "disclosures", section_id=section_id)]
    return {"section_id": section_id, "release_count": len(releases), "releases": releases}


def _best_grade(db, student_id: str, course_id: str) -> str | None:
    grades = [t["grade"] for t in find(db, "transcript_entries", student_id=student_id, course_id=course_id) if t["grade"] in POINTS]
    return max(grades, key=POINTS.get) if grades else None


@write_tool
def enroll_student(db, student_id: str, section_id: str) -> dict:
    """Enrolls a student in a Fall 2026 section. Refused when the student has an
    active hold that blocks registration, lacks a prerequisite grade on the
    transcript, is already in the course, has a time conflict, or the section is full.

    Args:
        student_id: The student, such as "N99999999".
        section_id: The section, such as "STAT-9999-03-F26".
    """
    student = one(db, "students", student_id=student_id)
    if student["status"] != "active":
        raise ToolError("student_inactive", f"{student_id} is {student['status']}.")
    sec = one(db, "sections", section_id=section_id)
    if sec["term"] != CURRENT_TERM or sec["status"] != "open":
        raise ToolError("section_closed", f"{section_id} is not open for Fall 2026 registration.")
    blocking = [h["hold_id"] for h in find(db, "holds", student_id=student_id, status="active") if h["blocks_registration"]]
    if blocking:
        raise ToolError("registration_hold", f"Active registration hold(s): {', '.join(blocking)}.")
    current = []
    for e in find(db, "enrolments", student_id=student_id):
        other = one(db, "sections", section_id=e["section_id"])
        if other["term"] != CURRENT_TERM or e["status"] == "dropped":
            continue
        if other["course_id"] == sec["course_id"]:
            raise ToolError("already_in_course", f"{student_id} already holds {e['section_id']} ({e['status']}).")
        if e["status"] == "enrolled":
            current.append(other)
    for p in find(db, "prerequisites", course_id=sec["course_id"]):
        grade = _best_grade(db, student_id, p["requires_course_id"])
        if grade is None or POINTS[grade] < POINTS[p["min_grade"]]:
            raise ToolError("prerequisite_not_met", f"{sec['course_id']} needs {p['requires_course_id']} with {p['min_grade']} or better.")
    clash = [o["section_id"] for o in current if _overlap(o, sec)]
    if clash:
        raise ToolError("time_conflict", f"{section_id} overlaps {', '.join(clash)}.")
    enrolled, _ = _counts(db, section_id)
    if enrolled >= sec["capacity"]:
        raise ToolError("section_full", f"{section_id} is full ({enrolled}/{sec['capacity']}).")
    numbers = [int(e["enrolment_id"].split("-")[1]) for e in find(db, "enrolments")]
    enrolment_id = f"EN-{max(numbers) + 1}"
    db["enrolments"].insert({"enrolment_id": enrolment_id, "student_id": student_id, "section_id": section_id,
                             "status": "enrolled", "waitlist_position": None, "updated_on": TODAY})
    return {"enrolment_id": enrolment_id, "student_id": student_id, "section_id": section_id, "status": "enrolled",
            "days": sec["days"], "start_time": sec["start_time"], "end_time": sec["end_time"]}


@write_tool
def set_section_capacity(db, section_id: str, capacity: int, reason: str) -> dict:
    """Sets the enrolment cap of a Fall 2026 section. Waitlisted students are
    offered freed seats, in waitlist order, by the nightly waitlist run.

    Args:
        section_id: The section, such as "HIST-9999-01-F26".
        capacity: The new enrolment cap.
        reason: Why the cap changes (required).
    """
    sec = one(db, "sections", section_id=section_id)
    if sec["term"] != CURRENT_TERM or sec["status"] != "open":
        raise ToolError("section_closed", f"{section_id} is not an open Fall 2026 section.")
    if not reason.strip():
        raise ToolError("missing_reason", "Give a reason for the change.")
    enrolled, waitlisted = _counts(db, section_id)
    if capacity < enrolled:
        raise ToolError("below_enrolment", f"{enrolled} students are already enrolled in {section_id}.")
    if capacity > 250:
        raise ToolError("invalid_capacity", "Caps above 250 are not allowed.")
    db["sections"].update(section_id, {"capacity": capacity})
    return {"section_id": section_id, "old_capacity": sec["capacity"], "capacity": capacity, "enrolled": enrolled,
            "waitlisted": waitlisted, "seats_open": capacity - enrolled}


@write_tool
def release_grade_statistics(db, section_id: str, recipient: str, purpose: str) -> dict:
    """Releases the mean final grade (4-point scale, letter grades only) of a
    completed section to a recipient, and records the release in the disclosure
    log. Refused when fewer than 10 students received letter grades.

    Args:
        section_id: A completed section such as "CHEM-9999-01-S26".
        recipient: Who receives the figure, for example "Department of Chemistry".
        purpose: What the figure will be used for.
    """
    sec = one(db, "sections", section_id=section_id)
    if sec["status"] != "completed":
        raise ToolError("not_completed", f"{section_id} has no final grades.")
    if not recipient.strip() or not purpose.strip():
        raise ToolError("missing_argument", "Give the recipient and the purpose of the release.")
    grades = [POINTS[r["grade"]] for r in find(db, "grade_rosters", section_id=section_id) if r["grade"] in POINTS]
    if len(grades) < 10:
        raise ToolError("cohort_too_small", f"Only {len(grades)} letter grades; at least 10 are needed.")
    value = round(sum(grades) / len(grades), 2)
    numbers = [int(d["disclosure_id"].rsplit("-", 1)[1]) for d in find(db, "disclosures")]
    disclosure_id = f"DL-2026-{max(numbers) + 1:04d}"
    db["disclosures"].insert({"disclosure_id": disclosure_id, "section_id": section_id, "recipient": recipient.strip(),
                              "purpose": purpose.strip(), "statistic": "mean_grade_points", "cohort_size": len(grades),
                              "value": value, "released_on": TODAY, "released_by": "Office of the Registrar - Records"})
    return {"disclosure_id": disclosure_id, "section_id": section_id, "statistic": "mean_grade_points",
            "cohort_size": len(grades), "value": value, "released_on": TODAY}
