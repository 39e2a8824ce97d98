"""Pure helpers of the plan service: canonical hashing, replan choice and diff, cluster edits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cost_model.errors import InvalidInput
from planner_service.service.identity import request_hash, to_json_safe
from planner_service.service.plans import plan_status
from planner_service.service.replan import (
    apply_cluster_changes,
    choose_stable,
    ranks_moved,
    sticky_host_order,
)


def ranks(hosts_gpus):
    return [{"rank": r, "host": h, "gpu": g} for r, (h, g) in enumerate(hosts_gpus)]


def cand(tps, places, strategy=None):
    return {"strategy": strategy or {"dp": len(places)}, "prediction": {"tokens_per_s": tps}, "ranks": ranks(places)}


A = [("n0", 0), ("n0", 1), ("n1", 0), ("n1", 1)]


def test_ranks_moved_counts_changed_and_missing_ranks():
    assert ranks_moved(ranks(A), ranks(A)) == 0
    assert ranks_moved(ranks(A), ranks([("n0", 0), ("n0", 1), ("n2", 0), ("n2", 1)])) == 2
    assert ranks_moved(ranks(A), ranks(A[:2])) == 2
    assert ranks_moved(ranks(A), ranks(list(reversed(A)))) == 4


def test_choose_stable_prefers_fewest_moves_within_two_percent():
    parent = cand(100.0, A)
    moved_all = cand(100.0, list(reversed(A)))          # the best, moves 4
    moved_one = cand(98.5, [("n0", 0), ("n0", 1), ("n1", 0), ("n2", 1)])  # within 2%, moves 1
    same = cand(97.0, A)                                # 3% worse: not eligible although it moves 0
    chosen, others, near = choose_stable({"best": moved_all, "alternatives": [same, moved_one]}, parent, "throughput")
    assert chosen is moved_one and near == 2
    assert others == [moved_all, same]


def test_choose_stable_keeps_the_best_when_it_moves_least():
    parent = cand(100.0, A)
    best = cand(100.0, A)
    alt = cand(99.9, list(reversed(A)))
    chosen, _, _ = choose_stable({"best": best, "alternatives": [alt]}, parent, "throughput")
    assert chosen is best


def test_choose_stable_cost_objective_uses_tokens_per_gpu_second():
    parent = cand(100.0, A)
    big = cand(100.0, list(reversed(A)))     # 25 tokens/s per GPU
    small = cand(60.0, A[:2])                # 30 tokens/s per GPU: the best by cost proxy
    chosen, _, _ = choose_stable({"best": small, "alternatives": [big]}, parent, "cost")
    assert chosen is small


def test_choose_stable_places_ranks_only_for_candidates_within_tolerance():
    parent = cand(100.0, A)
    places = {0: list(reversed(A)), 1: A, 2: A}
    best, near, far = (cand(t, places[i]) for i, t in enumerate((100.0, 99.0, 90.0)))
    for c in (best, near, far):
        del c["ranks"]
    asked = []

    def ranks_of(i):
        asked.append(i)
        return ranks(places[i])

    chosen, others, n_near = choose_stable({"best": best, "alternatives": [far, near]}, parent, "throughput", ranks_of)
    assert sorted(asked) == [0, 2] and n_near == 2
    assert chosen is near and chosen["ranks"] == ranks(A)
    assert others == [best, far] and "ranks" in best and "ranks" not in far


def test_request_hash_is_order_independent():
    assert request_hash({"a": 1, "b": {"c": 2, "d": 3}}) == request_hash({"b": {"d": 3, "c": 2}, "a": 1})
    assert request_hash({"a": 1}) != request_hash({"a": 2})


def test_to_json_safe():
    out = to_json_safe({"x": np.float64(1.5), "y": np.int64(3), "z": (1, 2), "n": math.nan, "i": math.inf, "a": np.arange(2)})
    assert out == {"x": 1.5, "y": 3, "z": [1, 2], "n": None, "i": None, "a": [0, 1]}
    assert type(out["y"]) is int


def test_plan_status():
    assert plan_status("OPTIMAL") == "optimal"
    assert plan_status("FEASIBLE") == "feasible"
    assert plan_status(None) == "feasible"


BASE = {"name": "c", "node_groups": [{"name": "g", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]}


def test_apply_cluster_changes():
    out = apply_cluster_changes(BASE, ["g-1"], [{"hostname": "x9", "group": "g"}])
    g = out["node_groups"][0]
    assert g["hostnames"] == ["g-0", "g-1", "x9"] and g["count"] == 3
    assert {n["hostname"]: n["available"] for n in out["nodes"]} == {"g-0": True, "g-1": False, "x9": True}
    assert BASE["node_groups"][0].get("hostnames") is None  # the input is not modified


@pytest.mark.parametrize(
    "down, added, field",
    [
        (["nope"], None, "unavailable_nodes[0]"),
        ([3], None, "unavailable_nodes[0]"),
        (None, [{"hostname": "g-0", "group": "g"}], "added_nodes[0].hostname"),
        (None, [{"hostname": "", "group": "g"}], "added_nodes[0].hostname"),
        (None, [{"hostname": "new", "group": "h"}], "added_nodes[0].group"),
        (None, ["new"], "added_nodes[0]"),
    ],
)
def test_apply_cluster_changes_errors_name_the_entry(down, added, field):
    with pytest.raises(InvalidInput) as exc:
        apply_cluster_changes(BASE, down, added)
    assert exc.value.field == field


def _cluster(hosts, down=()):
    return {"name": "c", "node_groups": [{"name": "g", "count": len(hosts), "device": "H100-SXM5-80GB", "hostnames": list(hosts)}],
            "nodes": [{"hostname": h, "available": False} for h in down]}


def test_sticky_order_fills_a_lost_host_with_a_spare_else_with_the_last_host():
    parent = ranks([(h, 0) for h in ("n3", "n0", "n1", "n2")])  # the parent's rank order, not hostname order
    spare = sticky_host_order(_cluster(["n0", "n1", "n2", "n3", "n4"], down=["n0"]), parent)
    assert spare["node_groups"][0]["hostnames"][:4] == ["n3", "n4", "n1", "n2"]  # only n0's ranks move
    # no spare: the last host fills the hole; hosts before and after it keep their slots
    full = sticky_host_order(_cluster(["n0", "n1", "n2", "n3"], down=["n3"]), parent)
    assert full["node_groups"][0]["hostnames"] == ["n2", "n0", "n1", "n3"]
    middle = sticky_host_order(_cluster(["n0", "n1", "n2", "n3"], down=["n0"]), parent)
    assert middle["node_groups"][0]["hostnames"][:3] == ["n3", "n2", "n1"]
    last = sticky_host_order(_cluster(["n0", "n1", "n2", "n3"], down=["n2"]), parent)
    assert last["node_groups"][0]["hostnames"][:3] == ["n3", "n0", "n1"]
