"""A POST /v1/plans takes each form once: the body is parsed once, the profile applied once,
every stored rank entry placed once, and preflight runs over the candidate already built (no
plan dict is assembled for it).  Counts, not timings."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from typing import Any

import pytest

from helpers.profiles import synthetic_profile
from helpers.requests import small_request
from planner_service.exporters.preflight import preflight_warnings
from planner_service.planner import placement
from planner_service.service.plans import PlanService
from planner_service.storage.repository import Repository

MIXED_VERSIONS = {
    "name": "two-versions",
    "node_groups": [{"name": "g0", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB", "hostnames": ["node-0", "node-1"]}],
    "nodes": [
        {"hostname": "node-0", "group": "g0", "nccl_version": "2.18.3"},
        {"hostname": "node-1", "group": "g0", "nccl_version": "2.21.5"},
    ],
}


def _count_everywhere(monkeypatch, counts: Counter, module: Any, name: str) -> None:
    """Count calls of ``module.name`` wherever it was imported (``from … import name``)."""
    original = getattr(module, name)

    def counted(*args: Any, **kw: Any) -> Any:
        counts[name] += 1
        return original(*args, **kw)

    holders = [m for m in list(sys.modules.values()) if m is not None and getattr(m, name, None) is original]
    assert holders, name
    for m in holders:
        monkeypatch.setattr(m, name, counted)


def _count_method(monkeypatch, counts: Counter, cls: type, name: str) -> None:
    original = getattr(cls, name)

    def counted(self: Any, *args: Any, **kw: Any) -> Any:
        counts[name] += 1
        return original(self, *args, **kw)

    monkeypatch.setattr(cls, name, counted)


@pytest.fixture
def counts(monkeypatch) -> Counter:
    c: Counter = Counter()
    _count_method(monkeypatch, c, PlanService, "parse")
    _count_method(monkeypatch, c, Repository, "get_profile")
    _count_everywhere(monkeypatch, c, placement, "place_ranks")
    _count_everywhere(monkeypatch, c, importlib.import_module("planner_service.exporters.plan_view"), "plan_view")
    return c


def _stored_entries_with_ranks(plan: dict[str, Any]) -> int:
    return sum(1 for c in [plan["best"], *plan["alternatives"]] if c.get("ranks"))


def test_a_plan_request_is_parsed_once_and_placed_once(client, counts):
    r = client.post("/v1/plans", json=small_request())
    assert r.status_code == 201, r.text
    plan = r.json()
    assert counts["parse"] == 1
    assert counts["place_ranks"] == _stored_entries_with_ranks(plan) == 1 + len(plan["alternatives"])
    assert counts["plan_view"] == 0
    counts.clear()
    assert client.post("/v1/plans", json=small_request()).status_code == 200  # de-duplicated: parsed, not planned
    assert counts == Counter(parse=1)


def test_the_profile_is_applied_once(client, counts):
    pid = client.post("/v1/profiles", json=synthetic_profile(collectives=False)).json()["id"]
    counts.clear()
    r = client.post("/v1/plans", json=small_request(profile_id=pid))
    assert r.status_code == 201, r.text
    assert counts["parse"] == 1 and counts["get_profile"] == 1


def test_preflight_runs_over_the_stored_best_in_the_service(client, counts):
    r = client.post("/v1/plans", json=small_request(cluster=MIXED_VERSIONS, constraints={"dp": 16}))
    assert r.status_code == 201, r.text
    plan = r.json()
    assert counts["plan_view"] == 0 and counts["place_ranks"] == _stored_entries_with_ranks(plan)
    nccl = [w for w in plan["warnings"] if "NCCL versions" in w]
    assert len(nccl) == 1 and "data-parallel" in nccl[0] and "2.18.3 on node-0" in nccl[0]
    # the launch route's check of the stored plan agrees
    assert set(preflight_warnings(plan)) <= set(plan["warnings"])


def test_a_job_parses_its_stored_request_once(make_client, counts):
    client = make_client(start_worker=False)
    r = client.post("/v1/plans", json=small_request(**{"async": True}))
    assert r.status_code == 202, r.text
    assert counts["parse"] == 1
    service = client.app.state.service
    job = service.repo.get_job(r.json()["id"])
    counts.clear()
    new = service.compute_for_job(job, None, None)
    assert counts["parse"] == 1
    assert new.request_hash == job.request_hash and new.request == job.request
