"""A replan after a node is lost keeps the parent's layout (tp/pp/cp/ep, micro-batch, recompute,
ZeRO) and re-chooses only dp and the layer split, instead of the full search; the full search
runs only when that layout cannot survive the change."""

from __future__ import annotations

from cost_model.errors import NoFeasiblePlan
from planner_service.service.plans import KEPT_LAYOUT_FIELDS

BODY = {
    "model": {"preset": "gpt3-1.3b"},
    "training": {"global_batch_size": 256, "sequence_length": 2048},
    "cluster": {"name": "spare", "node_groups": [{"name": "g0", "count": 5, "gpus_per_node": 8, "device": "A100-SXM4-80GB",
                                                  "hostnames": [f"node-{i}" for i in range(5)]}]},
}


def _places(plan):
    return {r["rank"]: (r["host"], r["gpu"]) for r in plan["best"]["ranks"]}


def _pins(strategy):
    return {k: strategy[k] for k in KEPT_LAYOUT_FIELDS if strategy.get(k) is not None}


def test_kept_layout_equals_the_search_restricted_to_that_layout(client):
    parent = client.post("/v1/plans", json={**BODY, "constraints": {"max_devices": 32}}).json()
    used = sorted({r["host"] for r in parent["best"]["ranks"]})
    victim = used[1]
    r = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": [victim]})
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["search"]["mode"] == "kept_layout"
    assert _pins(child["best"]["strategy"]) == _pins(parent["best"]["strategy"])
    assert child["diff"]["parent_id"] == parent["id"]
    # every rank of a surviving host stays where it was
    before, after = _places(parent), _places(child)
    assert all(after.get(k) == v for k, v in before.items() if v[0] != victim)
    assert victim not in {h for h, _ in after.values()}
    # the same answer as a fresh plan on the changed cluster restricted to the parent's layout
    restricted = {**BODY, "cluster": child["cluster"],
                  "constraints": {"max_devices": 32, **_pins(parent["best"]["strategy"])}}
    fresh = client.post("/v1/plans", json=restricted)
    assert fresh.status_code == 201, fresh.text
    fresh = fresh.json()
    assert fresh["best"]["strategy"] == child["best"]["strategy"]
    assert fresh["best"]["prediction"]["step_time_s"] == child["best"]["prediction"]["step_time_s"]
    assert _places(fresh) == after


def test_dp_shrinks_when_no_spare_is_left(client):
    parent = client.post("/v1/plans", json={**BODY, "cluster": {**BODY["cluster"], "node_groups": [
        {**BODY["cluster"]["node_groups"][0], "count": 4, "hostnames": [f"node-{i}" for i in range(4)]}]}}).json()
    child = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": ["node-3"]}).json()
    assert child["search"]["mode"] == "kept_layout"
    assert _pins(child["best"]["strategy"]) == _pins(parent["best"]["strategy"])
    assert len(child["best"]["ranks"]) <= 24
    before, after = _places(parent), _places(child)
    assert all(before[k] == v for k, v in after.items() if k in before and before[k][0] != "node-3")


def test_falls_back_to_the_full_search_when_the_layout_cannot_survive(make_client):
    from planner_service.planner import plan

    calls = []

    def planner(req, settings, progress=None, should_cancel=None):
        kept = "tp" in req.constraints.pinned
        calls.append(kept)
        if kept:
            raise NoFeasiblePlan("no plan fits under the constraints")
        return plan(req, settings, progress=progress, should_cancel=should_cancel)

    client = make_client(plan_fn=planner)
    parent = client.post("/v1/plans", json=BODY).json()
    r = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": ["node-0"]})
    assert r.status_code == 201, r.text
    child = r.json()
    assert calls == [False, True, False]
    assert child["search"]["mode"] == "full_search"
    assert "kept_layout_failed" in child["search"]


def test_the_same_request_posted_after_a_kept_layout_replan_gets_a_full_search(client):
    """The replan's plan is stored under the changed request's hash; posting that request is a
    full search (a new revision superseding the kept-layout plan), not the restricted answer."""
    parent = client.post("/v1/plans", json={**BODY, "constraints": {"max_devices": 32}}).json()
    victim = sorted({r["host"] for r in parent["best"]["ranks"]})[1]
    child = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": [victim]}).json()
    assert child["search"]["mode"] == "kept_layout"
    again = client.post("/v1/plans", json={**BODY, "cluster": child["cluster"], "constraints": {"max_devices": 32}})
    assert again.status_code == 201, again.text
    again = again.json()
    assert again["supersedes"] == child["id"] and again["search"].get("mode") != "kept_layout"
    assert again["best"]["prediction"]["step_time_s"] <= child["best"]["prediction"]["step_time_s"] * (1 + 1e-9)
    # and posting it once more returns that full-search plan
    assert client.post("/v1/plans", json={**BODY, "cluster": child["cluster"], "constraints": {"max_devices": 32}}).json()["id"] == again["id"]


def test_a_lost_node_moves_only_the_ranks_of_its_domain(client):
    """On a topology cluster whose job needs whole racks, losing a node leaves its rack out: the
    spare rack takes its place in the order (not every later rack shifting up), so
    the ranks on the other racks stay where they were."""
    body = {**BODY, "cluster": {**BODY["cluster"], "node_groups": [
        {**BODY["cluster"]["node_groups"][0], "count": 6, "hostnames": [f"node-{i}" for i in range(6)]}],
        "topology": [{"name": "rack", "group_size_nodes": 2, "oversubscription": 2.0}]}, "constraints": {"max_devices": 32}}
    parent = client.post("/v1/plans", json=body).json()
    before = _places(parent)
    racks = {h: int(h.split("-")[1]) // 2 for h in {h for h, _ in before.values()}}
    assert len(set(racks.values())) == 2  # the job holds two of the three racks
    victim = min(racks)  # node-0: the first rack
    child = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": [victim]}).json()
    assert child["search"]["mode"] == "kept_layout" and child["best"]["strategy"] == parent["best"]["strategy"]
    after = _places(child)
    kept = {k: v for k, v in before.items() if racks[v[0]] != racks[victim]}
    assert kept and all(after[k] == v for k, v in kept.items())
    assert victim not in {h for h, _ in after.values()}
    assert child["diff"]["ranks_moved"] == len(before) - len(kept)
