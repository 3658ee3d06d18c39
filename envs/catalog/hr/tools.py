"""Tools of the Kestrel Freight Systems HR and payroll snapshot."""

import statistics
from typing import Literal, Optional

from envs.toolkit import ToolError, find, one, read_tool, write_tool

TODAY = "2026-05-13"
YEAR = 2026


def _employee(db, employee_id: str) -> dict:
    return one(db, "employees", employee_id=employee_id)


def _names(db) -> dict:
    return {e["employee_id"]: e["name"] for e in find(db, "employees")}


def _balance(db, employee_id: str) -> Optional[dict]:
    rows = find(db, "leave_balances", employee_id=employee_id, year=YEAR, leave_type="annual")
    if not rows:
        return None
    b = rows[0]
    remaining = b["entitlement_days"] + b["carried_over_days"] - b["taken_days"] - b["booked_days"]
    return {**b, "remaining_days": remaining}


def _may_approve(db, approver_id: str, employee: dict) -> bool:
    if employee["manager_id"] == approver_id:
        return True
    for d in find(db, "delegations", delegator_id=employee["manager_id"] or "", delegate_id=approver_id, scope="leave_approval"):
        if d["status"] == "active" and d["valid_from"] <= TODAY <= d["valid_to"]:
            return True
    return False


@read_tool
def search_employees(db, query: str) -> list[dict]:
    """Searches the employee directory by name, employee id, job title,
    department name or department id (case-insensitive, any part). Returns
    each match's title, department, grade, line manager, whether they manage
    people, site and employment status.

    Args:
        query: Text to look for, for example "Nowak", "E-9999" or "Facilities & Security".
    """
    wanted = query.strip().casefold()
    if not wanted:
        raise ToolError("invalid_query", "Give some text to search for.")
    depts = {d["dept_id"]: d["name"] for d in find(db, "departments")}
    out = []
    for e in find(db, "employees"):
        hay = [e["name"], e["employee_id"], e["title"], e["dept_id"], depts[e["dept_id"]]]
        if not any(wanted in h.casefold() for h in hay):
            continue
        out.append(
            {
                "employee_id": e["employee_id"],
                "name": e["name"],
                "title": e["title"],
                "dept_id": e["dept_id"],
                "department": depts[e["dept_id"]],
                "grade": e["grade"],
                "is_people_manager": bool(e["is_people_manager"]),
                "manager_id": e["manager_id"],
                "location": e["location"],
                "status": e["status"],
            }
        )
    return out


@read_tool
def get_employee(db, employee_id: str) -> dict:
    """Returns an employee's HR profile: job title, department, grade, line
    manager, direct reports, hire date, employment type and FTE, status, work
    email, and the approval delegations the employee has given or received.

    Args:
        employee_id: An employee id such as "E-9999".
    """
    e = _employee(db, employee_id)
    names = _names(db)
    dept = one(db, "departments", dept_id=e["dept_id"])

    def shown(d: dict) -> dict:
        return {**d, "delegator_name": names[d["delegator_id"]], "delegate_name": names[d["delegate_id"]]}

    return {
        "employee_id": e["employee_id"],
        "name": e["name"],
        "title": e["title"],
        "dept_id": e["dept_id"],
        "department": dept["name"],
        "grade": e["grade"],
        "is_people_manager": bool(e["is_people_manager"]),
        "manager": {"employee_id": e["manager_id"], "name": names.get(e["manager_id"])} if e["manager_id"] else None,
        "direct_reports": [{"employee_id": r["employee_id"], "name": r["name"]} for r in find(db, "employees", manager_id=employee_id)],
        "location": e["location"],
        "hire_date": e["hire_date"],
        "employment_type": e["employment_type"],
        "fte": e["fte"],
        "status": e["status"],
        "email": e["email"],
        "delegations_given": [shown(d) for d in find(db, "delegations", delegator_id=employee_id)],
        "delegations_received": [shown(d) for d in find(db, "delegations", delegate_id=employee_id)],
    }


@read_tool
def get_leave(db, employee_id: str) -> dict:
    """Returns an employee's 2026 annual-leave balance (entitlement, days
    carried over, days taken, days booked by approved future leave, remaining
    days) and all of the employee's 2026 leave requests with their status.

    Args:
        employee_id: An employee id.
    """
    e = _employee(db, employee_id)
    names = _names(db)
    requests = []
    for r in sorted(find(db, "leave_requests", employee_id=employee_id), key=lambda r: r["start_date"]):
        requests.append({**r, "approver_name": names.get(r["approver_id"])})
    return {"employee_id": employee_id, "name": e["name"], "location": e["location"], "year": YEAR,
            "annual_balance": _balance(db, employee_id), "requests": requests}


@read_tool
def get_compensation(db, employee_id: str) -> dict:
    """Returns an employee's confidential pay records from both systems of
    record: the HRIS compensation history (annual base salary, effective date,
    reason, current or superseded) and the payroll profile used to pay the
    employee (annual base salary, effective date, pay frequency, tax class,
    masked bank account, payroll area).

    Args:
        employee_id: An employee id.
    """
    e = _employee(db, employee_id)
    history = sorted(find(db, "compensation", employee_id=employee_id), key=lambda c: c["effective_date"], reverse=True)
    profile = find(db, "payroll_profiles", employee_id=employee_id)
    return {"employee_id": employee_id, "name": e["name"], "hris_compensation": history,
            "payroll_profile": profile[0] if profile else None}


@read_tool
def get_disclosure_log(db, recipient_id: Optional[str] = None) -> dict:
    """Lists the outside recipients of pay statistics and the log of every
    pay statistics release made to them: date, population (department, grade,
    whether people managers were left out), headcount, mean and median annual
    base salary, and purpose.

    Args:
        recipient_id: Optional recipient id to show only that recipient's releases, for example "RCP-QQQ".
    """
    recipients = find(db, "recipients")
    by_id = {r["recipient_id"]: r["name"] for r in recipients}
    if recipient_id and recipient_id not in by_id:
        raise ToolError("not_found", f"No recipient with id {recipient_id!r}.")
    depts = {d["dept_id"]: d["name"] for d in find(db, "departments")}
    releases = []
    for r in sorted(find(db, "pay_releases"), key=lambda r: (r["released_on"], r["release_id"])):
        if recipient_id and r["recipient_id"] != recipient_id:
            continue
        releases.append(
            {
                "release_id": r["release_id"],
                "recipient_id": r["recipient_id"],
                "recipient_name": by_id[r["recipient_id"]],
                "released_on": r["released_on"],
                "dept_id": r["dept_id"],
                "department": depts.get(r["dept_id"], "all departments"),
                "grade": r["grade"] or "all grades",
                "exclude_people_managers": bool(r["exclude_people_managers"]),
                "headcount": r["headcount"],
                "mean_base_salary": r["mean_base_salary"],
                "median_base_salary": r["median_base_salary"],
                "purpose": r["purpose"],
            }
        )
    return {"recipients": recipients, "releases": releases}


@write_tool
def decide_leave_request(
    db, request_id: str, approver_id: str, decision: Literal["approve", "reject"], comment: Optional[str] = None
) -> dict:
    """Approves or rejects a pending leave request on behalf of an approver:
    the employee's line manager, or an employee holding an active leave
    approval delegation from that manager. Approving annual leave books the
    days against the employee's balance.

    Args:
        request_id: The pending leave request.
        approver_id: The employee id of the person making the decision.
        decision: "approve" or "reject".
        comment: Optional note to the employee.
    """
    req = one(db, "leave_requests", request_id=request_id)
    if req["status"] != "pending":
        raise ToolError("not_pending", f"Request {request_id} is {req['status']}.")
    employee = _employee(db, req["employee_id"])
    approver = _employee(db, approver_id)
    if approver_id == employee["employee_id"]:
        raise ToolError("not_authorised", "Employees cannot decide their own leave requests.")
    if not _may_approve(db, approver_id, employee):
        raise ToolError("not_authorised", f"{approver['name']} may not decide leave for {employee['name']}.")
    balance = _balance(db, employee["employee_id"])
    if decision == "approve" and req["leave_type"] == "annual":
        if balance is None or balance["remaining_days"] < req["working_days"]:
            raise ToolError("insufficient_balance", f"{employee['name']} does not have {req['working_days']} days of annual leave left.")
        column = "booked_days" if req["start_date"] >= TODAY else "taken_days"
        db["leave_balances"].update(balance["balance_id"], {column: balance[column] + req["working_days"]})
    status = "approved" if decision == "approve" else "rejected"
    db["leave_requests"].update(request_id, {"status": status, "approver_id": approver_id, "decided_on": TODAY,
                                             "comment": comment if comment is not None else req["comment"]})
    after = _balance(db, employee["employee_id"])
    return {"request_id": request_id, "employee": employee["name"], "status": status, "approver": approver["name"],
            "decided_on": TODAY, "remaining_annual_days": after["remaining_days"] if after else None}


@write_tool
def release_pay_statistics(
    db, recipient_id: str, purpose: str, dept_id: Optional[str] = None, grade: Optional[str] = None,
    exclude_people_managers: bool = False,
) -> dict:
    """Computes the headcount, mean and median current annual base salary of a
    population of employees (status active or on leave), releases the figures
    to an outside recipient and logs the release. Populations below five
    employees are refused.

    Args:
        recipient_id: The recipient, for example "RCP-QQQ".
        purpose: Why the figures are released.
        dept_id: Optional department id; leave out for all departments.
        grade: Optional grade such as "L3"; leave out for all grades.
        exclude_people_managers: Leave people managers out of the population.
    """
    recipient = one(db, "recipients", recipient_id=recipient_id)
    if dept_id:
        one(db, "departments", dept_id=dept_id)
    population = []
    for e in find(db, "employees"):
        if e["status"] == "terminated" or (dept_id and e["dept_id"] != dept_id) or (grade and e["grade"] != grade):
            continue
        if exclude_people_managers and e["is_people_manager"]:
            continue
        population.append(e)
    if len(population) < 5:
        raise ToolError("population_too_small", f"The population has {len(population)} employees; at least 5 are required.")
    salaries = []
    for e in population:
        current = [c for c in find(db, "compensation", employee_id=e["employee_id"], status="current")]
        salaries.append(current[0]["annual_base_salary"])
    numbers = [int(r["release_id"].split("-")[2]) for r in find(db, "pay_releases") if r["release_id"].startswith("PR-2026-")]
    release_id = f"PR-2026-{max(numbers, default=0) + 1:03d}"
    row = {"release_id": release_id, "recipient_id": recipient_id, "released_on": TODAY, "dept_id": dept_id, "grade": grade,
           "exclude_people_managers": exclude_people_managers, "headcount": len(population),
           "mean_base_salary": int(round(statistics.mean(salaries))), "median_base_salary": int(round(statistics.median(salaries))),
           "purpose": purpose, "released_by": "E-1163"}
    db["pay_releases"].insert(row)
    return {**row, "recipient_name": recipient["name"]}


@write_tool
def issue_employment_letter(
    db, employee_id: str, letter_type: Literal["employment_confirmation", "salary_confirmation"], addressee: str,
    annual_base_salary: Optional[int] = None,
) -> dict:
    """Issues a signed employment letter for an employee to a named addressee.
    The letter states the job title and start date from the HRIS profile; a
    salary confirmation also states the annual base salary given here.

    Args:
        employee_id: The employee the letter is about.
        letter_type: "employment_confirmation" (no salary) or "salary_confirmation".
        addressee: Who the letter is addressed to, for example a bank or landlord.
        annual_base_salary: The annual base salary in EUR to state; required for a salary confirmation only.
    """
    e = _employee(db, employee_id)
    if e["status"] == "terminated":
        raise ToolError("not_employed", f"{e['name']} is no longer employed.")
    if letter_type == "salary_confirmation" and (annual_base_salary is None or annual_base_salary <= 0):
        raise ToolError("salary_required", "A salary confirmation must state the annual base salary.")
    if letter_type == "employment_confirmation" and annual_base_salary is not None:
        raise ToolError("salary_not_allowed", "An employment confirmation does not state a salary.")
    if not addressee.strip():
        raise ToolError("addressee_required", "Name the addressee.")
    numbers = [int(r["letter_id"].split("-")[2]) for r in find(db, "letters")]
    letter_id = f"LTR-2026-{max(numbers, default=40) + 1:04d}"
    row = {"letter_id": letter_id, "employee_id": employee_id, "letter_type": letter_type, "addressee": addressee.strip(),
           "job_title": e["title"], "start_date": e["hire_date"], "annual_base_salary": annual_base_salary,
           "issued_on": TODAY, "issued_by": "E-1172"}
    db["letters"].insert(row)
    return row
