"""GET of a plan with a large rank table serves its body kept encoded after the first GET
(api.plan_cache): the same content as the plain path, and the keys that can change
(superseded_by, observed) still current."""

from __future__ import annotations

import planner_service.api.routes.plans as routes
from helpers.requests import TWO_NODE_CLUSTER, small_request


def test_kept_body_is_the_same_plan_json(client, monkeypatch):
    created = client.post("/v1/plans", json=small_request(cluster=TWO_NODE_CLUSTER))
    assert created.status_code == 201, created.text
    plan = created.json()
    plain = client.get(f"/v1/plans/{plan['id']}")
    assert plain.status_code == 200
    monkeypatch.setattr(routes, "CACHED_MIN_RANKS", 1)  # every plan counts as large
    first = client.get(f"/v1/plans/{plan['id']}")
    assert plan["id"] in client.app.state.plan_bodies
    kept = client.get(f"/v1/plans/{plan['id']}", headers={"Accept-Encoding": "gzip"})
    assert first.status_code == kept.status_code == 200
    assert first.headers["content-type"] == "application/json"
    assert plain.json() == first.json() == kept.json()
    assert len(kept.json()["best"]["ranks"]) == plan["summary"]["num_devices"]

    # a newer revision of the same request: the kept body names it
    newer = client.post("/v1/plans", json={**small_request(cluster=TWO_NODE_CLUSTER), "force": True}).json()
    assert client.get(f"/v1/plans/{plan['id']}").json()["superseded_by"] == newer["id"]

    # deleted: gone, not served from the kept bytes
    assert client.delete(f"/v1/plans/{newer['id']}").status_code == 204
    assert client.get(f"/v1/plans/{newer['id']}").status_code == 404
    assert client.get(f"/v1/plans/{plan['id']}").json()["superseded_by"] is None
