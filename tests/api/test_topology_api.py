"""The cluster's ``topology`` through the HTTP API: a bad level is a 422 naming the field; a plan
on a topology states what crosses each boundary and why."""

from helpers.requests import small_request

CLUSTER = {"name": "pods", "node_groups": [{"name": "g", "count": 4, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}],
           "topology": {"levels": [{"name": "pod", "group_size_nodes": 2, "oversubscription": 8.0}]}}


def test_bad_topology_is_a_422_naming_the_field(client):
    bad = {**CLUSTER, "topology": [{"name": "pod", "group_size_nodes": 2, "oversubscription": 0.5}]}
    r = client.post("/v1/plans", json=small_request(cluster=bad))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "cluster.topology[0].oversubscription"


def test_plan_on_a_topology_reports_the_boundaries(client):
    r = client.post("/v1/plans", json=small_request(cluster=CLUSTER))
    assert r.status_code == 201, r.text
    plan = r.json()
    topo = plan["best"]["topology"]
    assert topo["nesting"][0] == "tp"
    assert [b["boundary"] for b in topo["boundaries"]] == ["node", "pod"]
    assert plan["cluster"]["topology"]["levels"][0]["oversubscription"] == 8.0
    assert "placement" in plan["explanation"]
