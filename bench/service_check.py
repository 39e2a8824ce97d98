"""Service checks for the README: schemathesis and the bad-input table, on SQLite and PostgreSQL.

* Schemathesis: ``tests/api/test_schemathesis.py`` (in-process ASGI, auth on, fixed seed, the
  cases per operation CI runs: ``PLANNER_SCHEMATHESIS_CASES``, default 62) — cases run, responses
  >= 500 and schema violations (undocumented status, body, content type or header) per database.
* The bad-input table (``tests/helpers/bad_inputs.py``): every row sent to an in-process app;
  its status and error field compared with the table's, and nothing may be logged at error level.
  The table with what each row got is written to docs/BAD_INPUT.md.

PostgreSQL runs when ``PLANNER_TEST_DATABASE_URL`` is set (a database this script may empty).
Results go under ``"check"`` in bench/results/service.json (the rest of that file is
bench/service_load.py's).

    PLANNER_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/planner_check \\
        python bench/service_check.py
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
RESULTS = ROOT / "bench" / "results" / "service.json"
DOC = ROOT / "docs" / "BAD_INPUT.md"


def run_schemathesis(cases_per_op: int) -> tuple[dict[str, Any], int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cases.jsonl"
        env = {**os.environ, "PLANNER_SCHEMATHESIS_REPORT": str(report), "PYTHONPATH": str(ROOT),
               "PLANNER_SCHEMATHESIS_CASES": str(cases_per_op)}
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", "pytest", "tests/api/test_schemathesis.py", "-p", "no:warnings", "-p", "no:cacheprovider", "-q"],
                             cwd=ROOT, env=env)
        wall_s = time.monotonic() - t0
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    out: dict[str, Any] = {}
    for db in sorted({r["db"] for r in rows}):
        mine = [r for r in rows if r["db"] == db]
        violations = [r for r in mine if r.get("violation")]
        out[db] = {
            "cases": len(mine),
            "responses_5xx": sum(1 for r in mine if r["status"] >= 500),
            "schema_violations": len(violations),
            "violation_examples": [f"{r['op']}: {r['status']}: {r['violation']}" for r in violations[:5]],
            "status_counts": {str(k): v for k, v in sorted(collections.Counter(r["status"] for r in mine).items())},
        }
    return out, rc, wall_s


class _ErrorRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def run_bad_inputs(db_url: str) -> list[dict[str, Any]]:
    from fastapi.testclient import TestClient

    from helpers.bad_inputs import APP_SETTINGS, BAD_INPUTS, check, parent_plan
    from planner_service.api import create_app
    from planner_service.settings import ServiceSettings

    settings = ServiceSettings(database_url=db_url, auth="disabled", allowed_hosts="testserver", rate_limit="", auto_migrate=True,
                               search_executor="thread", **APP_SETTINGS)
    handler = _ErrorRecords()
    logging.getLogger().addHandler(handler)
    rows = []
    try:
        with TestClient(create_app(settings, start_worker=False), raise_server_exceptions=False) as client:
            plan_id = parent_plan(client)
            for case in BAD_INPUTS:
                handler.records.clear()
                status, field, problem = check(client, case, plan_id)
                if handler.records and problem is None:
                    problem = "logged at error level: " + handler.records[0].getMessage()[:120]
                rows.append({"id": case.id, "method": case.method, "url": case.url, "status": status, "field": field,
                             "expected_status": case.status, "expected_field": case.field, "ok": problem is None, "problem": problem})
    finally:
        logging.getLogger().removeHandler(handler)
    return rows


def _empty_pg(url: str) -> None:
    from sqlalchemy import text

    from helpers.requests import TABLES
    from planner_service.storage.db import make_engine, upgrade

    engine = make_engine(url)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(TABLES)}"))
    engine.dispose()


def _md_cell(text: str) -> str:
    shown = text if len(text) <= 70 else text[:67] + "..."
    return "`" + shown.replace("|", "\\|").replace("`", "'") + "`"


def write_doc(rows: list[dict[str, Any]]) -> None:
    lines = [
        "# Bad input: status and field per input",
        "",
        "Every row is sent by `tests/api/test_bad_input.py` (CI, SQLite and PostgreSQL) and by",
        "`python bench/service_check.py`, which wrote this file; the table is",
        "`tests/helpers/bad_inputs.py`. Each gets the status shown and an error body",
        '`{"error": {"code", "message", "field"}}` naming the field shown, with nothing logged at',
        "error level. `{plan}` is a stored plan's id.",
        "",
        f"{sum(r['ok'] for r in rows)} of {len(rows)} inputs as expected.",
        "",
        "| # | input | request | status | field |",
        "|---:|---|---|---:|---|",
    ]
    for i, r in enumerate(rows, 1):
        mark = "" if r["ok"] else f" (expected {r['expected_status']} `{r['expected_field']}`)"
        lines.append(f"| {i} | {r['id']} | {_md_cell(r['method'] + ' ' + r['url'])} | {r['status']} | `{r['field']}`{mark} |")
    DOC.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases-per-operation", type=int, default=int(os.environ.get("PLANNER_SCHEMATHESIS_CASES", "62")))
    ap.add_argument("--skip-schemathesis", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("PLANNER_AUTH", "disabled")
    pg = os.environ.get("PLANNER_TEST_DATABASE_URL")
    bad: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        bad["sqlite"] = run_bad_inputs(f"sqlite:///{tmp}/bad.db")
    if pg:
        _empty_pg(pg)
        bad["postgresql"] = run_bad_inputs(pg)
    write_doc(bad["sqlite"])
    check: dict[str, Any] = {"bad_input": {db: {"inputs": len(rows), "as_expected": sum(r["ok"] for r in rows),
                                                "problems": [f"{r['id']}: {r['problem']}" for r in rows if not r["ok"]]}
                                           for db, rows in bad.items()}}
    rc = 0
    if not args.skip_schemathesis:
        st, rc, wall_s = run_schemathesis(args.cases_per_operation)
        check["schemathesis"] = {"cases_per_operation": args.cases_per_operation, "seed": "derandomized (fixed)", "wall_s": round(wall_s, 1),
                                 "databases": st}
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc["check"] = check
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print("| database | bad inputs as expected | schemathesis cases | responses >= 500 | schema violations |\n|---|---:|---:|---:|---:|")
    for db, b in check["bad_input"].items():
        s = check.get("schemathesis", {}).get("databases", {}).get(db, {})
        print(f"| {db} | {b['as_expected']} of {b['inputs']} | {s.get('cases', '–')} | {s.get('responses_5xx', '–')} | {s.get('schema_violations', '–')} |")
    for db, b in check["bad_input"].items():
        for p in b["problems"]:
            print(f"{db}: {p}")
    print(f"written {RESULTS} and {DOC}")
    ok = all(b["as_expected"] == b["inputs"] for b in check["bad_input"].values())
    return rc or (0 if ok else 1)


if __name__ == "__main__":
    raise SystemExit(main())
