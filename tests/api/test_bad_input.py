"""Bad input never yields a 500: every row of the bad-input table (``helpers.bad_inputs``, also
run by ``bench/service_check.py`` into docs/BAD_INPUT.md) gets its status and an error body naming
its field, with nothing logged at error level; and no mutation of a valid request gives a 5xx."""

from __future__ import annotations

import copy
import itertools
import json
import logging

import pytest

from helpers.bad_inputs import APP_SETTINGS, BAD_INPUTS, ESTIMATE, PLAN, _with, check, parent_plan


@pytest.fixture
def bad_input_client(make_client):
    return make_client(**APP_SETTINGS)


def test_the_table_has_at_least_80_distinct_inputs():
    assert len({c.id for c in BAD_INPUTS}) == len(BAD_INPUTS) >= 80


def test_every_bad_input_gets_its_status_naming_the_field(bad_input_client, caplog):
    plan_id = parent_plan(bad_input_client)
    failures = []
    with caplog.at_level(logging.INFO):
        for case in BAD_INPUTS:
            caplog.clear()
            _status, _field, problem = check(bad_input_client, case, plan_id)
            errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
            if problem or errors or "Traceback" in caplog.text:
                failures.append(f"{case.id}: {problem or errors or 'a traceback in the log'}")
    assert failures == []


MUTATIONS = [None, -1, 0, 0.5, "x", "", [], {}, [1], {"a": 1}, True, 1e308, 10**30]


def _leaf_paths(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaf_paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaf_paths(v, f"{prefix}.{i}")
    if prefix:
        yield prefix


def test_no_mutation_of_a_valid_estimate_request_gives_a_500(bad_input_client):
    """Every leaf and every object of a valid request replaced by each odd value: 2xx or 4xx,
    never 5xx, and 4xx bodies always name a field."""
    base = copy.deepcopy(ESTIMATE)
    base["cluster"]["node_groups"][0]["intra_node_bandwidth_GBps"] = 300
    base["training"]["dtype"] = "bf16"
    base["strategy"].update({"tp": 1, "pp": 1, "recompute": "none", "zero_stage": 0, "sequence_parallel": False})
    bad = []
    for path, value in itertools.product(sorted(set(_leaf_paths(base))), MUTATIONS):
        r = bad_input_client.post("/v1/estimate", json=_with(base, path, value))
        if r.status_code >= 500:
            bad.append(f"{path}={value!r}: {r.status_code} {r.text[:200]}")
        elif r.status_code >= 400 and not r.json()["error"].get("field"):
            bad.append(f"{path}={value!r}: no field in {r.text[:200]}")
    assert bad == []


def test_error_bodies_are_json_with_the_documented_shape(bad_input_client):
    r = bad_input_client.get("/v1/does-not-exist")
    assert r.status_code == 404 and set(r.json()["error"]) == {"code", "message", "field"}
    r = bad_input_client.put("/v1/plans")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = bad_input_client.post("/v1/plans", content=json.dumps(PLAN).encode(), headers={"content-type": "text/plain"})
    assert 400 <= r.status_code < 500
