"""A stored plan not proved optimal is replaced by a search with a larger budget (or by
``force``); the newer plan links to it and GET on the older one names the newer."""

import json
from pathlib import Path

EXAMPLE = json.loads((Path(__file__).resolve().parents[2] / "examples" / "plan_llama3_70b_mixed.json").read_text())


def test_a_larger_budget_supersedes_a_plan_not_proved_optimal(make_client):
    small = make_client(start_worker=False, solver_time_limit_s=0.05, sync_max_candidates=10**9)
    first = small.post("/v1/plans", json=EXAMPLE)
    assert first.status_code == 201, first.text
    first = first.json()
    assert first["status"] == "feasible" and first["search"]["budget_s"] == 0.05 and first["supersedes"] is None
    # The same budget: the stored plan (de-duplicated).
    again = small.post("/v1/plans", json=EXAMPLE)
    assert again.status_code == 200 and again.json()["id"] == first["id"]

    large = make_client(start_worker=False, solver_time_limit_s=5.0, sync_max_candidates=10**9)
    better = large.post("/v1/plans", json=EXAMPLE)
    assert better.status_code == 201, better.text
    better = better.json()
    assert better["status"] == "optimal" and better["supersedes"] == first["id"] and better["revision"] == 1
    assert better["summary"]["step_time_s"] <= first["summary"]["step_time_s"]
    assert large.get(f"/v1/plans/{first['id']}").json()["superseded_by"] == better["id"]
    assert large.get(f"/v1/plans/{better['id']}").json()["superseded_by"] is None
    # Proved optimal: a plain POST keeps it, whatever the budget.
    assert large.post("/v1/plans", json=EXAMPLE).json()["id"] == better["id"]
    # force always plans again, linked to the plan it replaces.
    forced = large.post("/v1/plans", json={**EXAMPLE, "force": True}).json()
    assert forced["supersedes"] == better["id"] and forced["revision"] == 2
