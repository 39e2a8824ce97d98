"""Small real requests and the test database URL shared by the service, API and CLI tests."""

from __future__ import annotations

import os
from typing import Any

PG_URL = os.environ.get("PLANNER_TEST_DATABASE_URL")
TABLES = ("jobs", "plans", "clusters", "models", "profiles", "api_keys", "observations", "calibrations")

#: The small real request of the brief: GPT-3 125M on one node of 8 A100s.
SMALL_CLUSTER = {
    "name": "one-node",
    "node_groups": [{"name": "g0", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB", "hostnames": ["node-0"]}],
}
SMALL_REQUEST: dict[str, Any] = {
    "model": {"preset": "gpt3-125m"},
    "training": {"global_batch_size": 64, "sequence_length": 2048},
    "cluster": SMALL_CLUSTER,
}
TWO_NODE_CLUSTER = {
    "name": "two-node",
    "node_groups": [{"name": "g0", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB", "hostnames": ["node-0", "node-1"]}],
}


def small_request(**overrides: Any) -> dict[str, Any]:
    body = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SMALL_REQUEST.items()}
    body.update(overrides)
    return body
