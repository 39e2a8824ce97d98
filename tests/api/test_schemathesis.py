"""Schemathesis (pinned in the test extras) against the app in process, on SQLite and on
PostgreSQL (the ``db_url`` fixture), with auth on: a fixed seed (derandomized Hypothesis), a
bounded number of cases per operation (``PLANNER_SCHEMATHESIS_CASES``, default 62: about 2,100
cases per database), and the test fails on any response >= 500 and on any schema violation
(an undocumented status code, a body or content type other than the documented one, a
documented response header missing).  ``bench/service_check.py`` runs it and reports the
counts."""

from __future__ import annotations

import json
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CASES = int(os.environ.get("PLANNER_SCHEMATHESIS_CASES", "62"))
REPORT = os.environ.get("PLANNER_SCHEMATHESIS_REPORT")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance, response_headers_conformance]


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
def test_no_input_gives_a_5xx_or_breaks_the_schema(case, st_app):
    response = case.call(headers=st_app.state.fuzz_headers)
    violation = None
    try:
        case.validate_response(response, checks=CHECKS, headers=st_app.state.fuzz_headers)
    except AssertionError as exc:  # schemathesis' FailureGroup is an AssertionError
        violation = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    if REPORT:
        with open(REPORT, "a") as fh:
            fh.write(json.dumps({"db": st_app.state.db_kind, "op": f"{case.method} {case.path}", "status": response.status_code,
                                 "violation": violation}) + "\n")
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
    assert violation is None, f"{case.method} {case.formatted_path}: {response.status_code}: {violation}"
