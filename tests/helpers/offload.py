"""Shared steps of the offload tests: a plan request that no layout fits until an offload is on."""

from __future__ import annotations

from typing import Any


def planned_once_offloaded(client: Any, req: dict[str, Any], setting: str, hint: str) -> dict[str, Any]:
    """POST ``req`` to /v1/plans: the 422 "no strategy fits" names the offload ``setting`` (its
    message holding ``hint``); with ``training[setting]`` on the plan comes back — returned."""
    refused = client.post("/v1/plans", json=req)
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "no_feasible_plan", refused.text
    assert hint in refused.json()["error"]["message"]
    req = {**req, "training": {**req["training"], setting: True}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan: dict[str, Any] = r.json()
    assert plan["training"][setting] is True
    return plan
