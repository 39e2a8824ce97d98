"""A plan whose rank table is held as columns (storage.rank_table: from COMPACT_MIN_RANKS ranks,
lowered here so a small plan counts) answers POST, GET and replan with exactly the JSON of the
same plan stored row by row, and is stored compact.  At the real threshold a replan answers with
the rank tables GET of the stored child serves, and its diff counts the moved ranks."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

import planner_service.api.routes.plans as routes
import planner_service.service.plans as service_plans
import planner_service.storage.rank_table as rank_table
from planner_service.storage.models import PlanRow

BODY = {
    "model": {"preset": "gpt3-1.3b"},
    "training": {"global_batch_size": 256, "sequence_length": 2048},
    "cluster": {"name": "racks", "node_groups": [{"name": "g0", "count": 6, "gpus_per_node": 8, "device": "A100-SXM4-80GB",
                                                  "hostnames": [f"node-{i}" for i in range(6)]}],
                "topology": [{"name": "rack", "group_size_nodes": 2, "oversubscription": 2.0}]},
    "constraints": {"max_devices": 32},
}
VOLATILE = ("id", "created_at", "parent_id", "superseded_by", "supersedes")


def _same(body):
    out = {k: v for k, v in body.items() if k not in VOLATILE}
    if "diff" in out:
        out["diff"] = {k: v for k, v in out["diff"].items() if k != "parent_id"}
    out["search"] = {k: v for k, v in out["search"].items() if k != "wall_time_s"}
    return out


def _run(client):
    created = client.post("/v1/plans", json=BODY)
    assert created.status_code == 201, created.text
    parent = created.json()
    got = client.get(f"/v1/plans/{parent['id']}", headers={"Accept-Encoding": "gzip"}).json()
    victim = sorted({r["host"] for r in parent["best"]["ranks"]})[1]
    child = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": [victim]})
    assert child.status_code == 201, child.text
    child = child.json()
    child_got = client.get(f"/v1/plans/{child['id']}").json()
    launch = client.get(f"/v1/plans/{child['id']}/launch", params={"target": "torchrun"})
    return parent, got, child, child_got, launch


def _stored_results(client, *ids):
    with client.app.state.repository.engine.connect() as conn:
        return [conn.execute(select(PlanRow.result).where(PlanRow.id == i)).scalar_one() for i in ids]


def test_compact_tables_serve_the_same_json(client, monkeypatch):
    plain = _run(client)
    for plan in (plain[2], plain[0]):
        assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    for module in (rank_table, service_plans):
        monkeypatch.setattr(module, "COMPACT_MIN_RANKS", 1)
    monkeypatch.setattr(routes, "CACHED_MIN_RANKS", 1)
    compact = _run(client)
    parent, got, child, child_got, launch = compact
    assert child["search"]["mode"] == "kept_layout" and child["diff"]["ranks_moved"] == plain[2]["diff"]["ranks_moved"]
    assert [_same(b) for b in (parent, got, child, child_got)] == [_same(b) for b in plain[:4]]
    assert launch.status_code == plain[4].status_code == 200
    assert launch.text.replace(child["id"], "ID") == plain[4].text.replace(plain[2]["id"], "ID")
    for stored in _stored_results(client, parent["id"], child["id"]):
        assert stored["best"]["ranks"]["encoding"] == "rank_table/v1"


def test_the_replan_diff_counts_moved_ranks_over_compact_tables(client, monkeypatch):
    for module in (rank_table, service_plans):
        monkeypatch.setattr(module, "COMPACT_MIN_RANKS", 1)
    parent = client.post("/v1/plans", json=BODY).json()
    victim = sorted({r["host"] for r in parent["best"]["ranks"]})[0]
    child = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": [victim]}).json()
    before = {r["rank"]: (r["host"], r["gpu"]) for r in parent["best"]["ranks"]}
    after = {r["rank"]: (r["host"], r["gpu"]) for r in child["best"]["ranks"]}
    assert victim not in {h for h, _ in after.values()}
    moved = sum(1 for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert child["diff"]["ranks_moved"] == moved


def _large(topology):
    """The smallest plan whose rank table is held as columns at the real threshold
    (COMPACT_MIN_RANKS ranks), on a cluster with spare nodes so that a replan keeps that size."""
    cluster = {"name": "spares", "node_groups": [{"name": "g0", "count": rank_table.COMPACT_MIN_RANKS // 8 + 4, "gpus_per_node": 8,
                                                  "device": "A100-SXM4-80GB"}]}
    if topology:  # placed by nesting order: the table comes from placement's columns
        cluster["topology"] = [{"name": "pod", "group_size_nodes": 128, "oversubscription": 4.0}]
    return {"model": {"preset": "gpt3-1.3b"}, "training": {"global_batch_size": 4096, "sequence_length": 2048},
            "cluster": cluster, "constraints": {"max_devices": rank_table.COMPACT_MIN_RANKS}}


def _ordered(text):
    """A JSON body with every object as its (key, value) pairs in order."""
    return json.loads(text, object_pairs_hook=list)


def _field(pairs, key):
    return next(v for k, v in pairs if k == key)


@pytest.mark.parametrize("topology", [False, True])
def test_a_columnar_replan_answers_with_the_rank_table_get_serves_and_the_right_diff(client, topology):
    parent = client.post("/v1/plans", json=_large(topology)).json()
    assert len(parent["best"]["ranks"]) == rank_table.COMPACT_MIN_RANKS
    victim = parent["best"]["ranks"][1000]["host"]
    r = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": [victim]})
    assert r.status_code == 201, r.text
    child = r.json()
    got = client.get(f"/v1/plans/{child['id']}", headers={"Accept-Encoding": "gzip"})
    assert got.status_code == 200
    [stored] = _stored_results(client, child["id"])
    assert stored["best"]["ranks"]["encoding"] == "rank_table/v1"
    # the same rank tables, row by row and key by key, and the same plan JSON as GET serves
    for key in ("best", "alternatives"):
        assert _field(_ordered(r.text), key) == _field(_ordered(got.text), key)
    assert {k: v for k, v in child.items() if k != "observed"} == {k: v for k, v in got.json().items() if k != "observed"}
    assert len(child["best"]["ranks"]) == rank_table.COMPACT_MIN_RANKS
    # the diff, counted here from the two rank tables
    before = {x["rank"]: (x["host"], x["gpu"]) for x in parent["best"]["ranks"]}
    after = {x["rank"]: (x["host"], x["gpu"]) for x in child["best"]["ranks"]}
    assert victim not in {h for h, _ in after.values()}
    diff = child["diff"]
    assert diff["ranks_moved"] == sum(1 for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert (diff["ranks_before"], diff["ranks_after"]) == (len(before), len(after))
    old_s, new_s = parent["best"]["strategy"], child["best"]["strategy"]
    assert diff["strategy_changes"] == {k: {"from": old_s.get(k), "to": new_s.get(k)}
                                        for k in sorted(old_s.keys() | new_s.keys()) if old_s.get(k) != new_s.get(k)}
    assert diff["tokens_per_s_after"] == child["best"]["prediction"]["tokens_per_s"]
    if not topology:  # a spare takes the lost node's place: only its ranks move
        assert diff["ranks_moved"] == 8
