"""Schemathesis figures for the README: cases run and responses >= 500 per database.

Runs ``tests/api/test_schemathesis.py`` (in-process ASGI, auth on, fixed seed) with
``PLANNER_SCHEMATHESIS_CASES`` cases per operation (default 55) on SQLite and, when
``PLANNER_TEST_DATABASE_URL`` is set, on PostgreSQL, and prints the table and the status counts.

    PLANNER_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/planner_check \\
        python bench/service_check.py
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cases.jsonl"
        env = {**os.environ, "PLANNER_SCHEMATHESIS_REPORT": str(report), "PYTHONPATH": str(ROOT)}
        env.setdefault("PLANNER_SCHEMATHESIS_CASES", "55")
        rc = subprocess.call([sys.executable, "-m", "pytest", "tests/api/test_schemathesis.py", "-p", "no:warnings", "-q"], cwd=ROOT, env=env)
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    cases: collections.Counter = collections.Counter(r["db"] for r in rows)
    errors: collections.Counter = collections.Counter(r["db"] for r in rows if r["status"] >= 500)
    statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        statuses[r["db"]][r["status"]] += 1
    print("| database | schemathesis cases | responses >= 500 |\n|---|---:|---:|")
    for db in sorted(cases):
        print(f"| {db} | {cases[db]:,} | {errors[db]} |")
    for db, counts in sorted(statuses.items()):
        print(db, dict(sorted(counts.items())))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
