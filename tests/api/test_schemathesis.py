"""Schemathesis (pinned in the test extras) against the app in process, on SQLite and on
PostgreSQL (the ``db_url`` fixture), with auth on: a fixed seed (derandomized Hypothesis), a
bounded number of cases per operation (``PLANNER_SCHEMATHESIS_CASES``, default 55), and the test
fails on any response >= 500.  ``bench/service_check.py`` runs it with a larger budget and
reports the counts."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings

CASES = int(os.environ.get("PLANNER_SCHEMATHESIS_CASES", "55"))
REPORT = os.environ.get("PLANNER_SCHEMATHESIS_REPORT")
COUNTS: Counter = Counter()


@pytest.fixture
def st_app(make_client, db_url):
    client = make_client(auth="enabled", start_worker=False, solver_time_limit_s=0.3, sync_max_candidates=2000)
    key, _ = client.app.state.repository.create_api_key("fuzz", "member")
    client.app.state.fuzz_headers = {"Authorization": f"Bearer {key}"}
    client.app.state.db_kind = "postgresql" if db_url.startswith("postgresql") else "sqlite"
    return client.app


@pytest.fixture
def api_schema(st_app):
    return schemathesis.openapi.from_asgi("/openapi.json", st_app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=CASES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_input_gives_a_5xx(case, st_app):
    response = case.call(headers=st_app.state.fuzz_headers)
    kind = st_app.state.db_kind
    COUNTS[(kind, "cases")] += 1
    if response.status_code >= 500:
        COUNTS[(kind, "5xx")] += 1
    if REPORT:
        with open(REPORT, "a") as fh:
            fh.write(json.dumps({"db": kind, "op": f"{case.method} {case.path}", "status": response.status_code}) + "\n")
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
