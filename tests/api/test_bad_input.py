"""Bad input never yields a 500: every case gets a 4xx whose body names the field."""

from __future__ import annotations

import copy
import itertools
import json

import pytest

from helpers.requests import SMALL_REQUEST, TWO_NODE_CLUSTER, small_request

ESTIMATE = {**copy.deepcopy(SMALL_REQUEST), "strategy": {"dp": 8, "micro_batch_size": 2}}


def _with(base: dict, path: str, value) -> dict:
    """A copy of ``base`` with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    out = copy.deepcopy(base)
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if value is ...:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


PLAN = small_request()

# (case id, method, url, body (dict → JSON, bytes → raw), expected status, expected field)
CASES = [
    ("body-not-json", "POST", "/v1/plans", b"{not json", 422, "body"),
    ("body-array", "POST", "/v1/plans", [1, 2], 422, "body"),
    ("body-empty", "POST", "/v1/plans", None, 422, "body"),
    ("model-missing", "POST", "/v1/plans", _with(PLAN, "model", ...), 422, "model"),
    ("training-missing", "POST", "/v1/plans", _with(PLAN, "training", ...), 422, "training"),
    ("cluster-missing", "POST", "/v1/plans", _with(PLAN, "cluster", ...), 422, "cluster"),
    ("unknown-top-level-field", "POST", "/v1/plans", {**PLAN, "colour": "red"}, 422, "colour"),
    ("model-not-object", "POST", "/v1/plans", _with(PLAN, "model", "gpt3"), 422, "model"),
    ("model-two-kinds", "POST", "/v1/plans", _with(PLAN, "model", {"preset": "gpt3-125m", "transformer": {}}), 422, "model"),
    ("unknown-preset", "POST", "/v1/plans", _with(PLAN, "model", {"preset": "gpt-99"}), 422, "model.preset"),
    ("hf-missing-hidden", "POST", "/v1/plans", _with(PLAN, "model", {"transformer": {"num_hidden_layers": 2, "num_attention_heads": 2}}), 422, "model.transformer.hidden_size"),
    ("hf-heads-not-dividing", "POST", "/v1/plans", _with(PLAN, "model", {"transformer": {"num_hidden_layers": 2, "hidden_size": 100, "num_attention_heads": 3}}), 422, "model.transformer.num_attention_heads"),
    ("unknown-model-id", "POST", "/v1/plans", _with(PLAN, "model", {"model_id": "no-such-model"}), 422, "model.model_id"),
    ("batch-negative", "POST", "/v1/plans", _with(PLAN, "training.global_batch_size", -4), 422, "training.global_batch_size"),
    ("batch-string", "POST", "/v1/plans", _with(PLAN, "training.global_batch_size", "64"), 422, "training.global_batch_size"),
    ("sequence-missing", "POST", "/v1/plans", _with(PLAN, "training.sequence_length", ...), 422, "training.sequence_length"),
    ("dtype-unknown", "POST", "/v1/plans", _with(PLAN, "training.dtype", "int3"), 422, "training.dtype"),
    ("optimizer-unknown", "POST", "/v1/plans", _with(PLAN, "training.optimizer", "lion"), 422, "training.optimizer"),
    ("node-groups-empty", "POST", "/v1/plans", _with(PLAN, "cluster.node_groups", []), 422, "cluster.node_groups"),
    ("device-unknown", "POST", "/v1/plans", _with(PLAN, "cluster.node_groups.0.device", "Z9000"), 422, "cluster.node_groups[0].device"),
    ("count-zero", "POST", "/v1/plans", _with(PLAN, "cluster.node_groups.0.count", 0), 422, "cluster.node_groups[0].count"),
    ("hostnames-mismatch", "POST", "/v1/plans", _with(PLAN, "cluster.node_groups.0.hostnames", ["a", "b"]), 422, "cluster.node_groups[0].hostnames"),
    ("bandwidth-negative", "POST", "/v1/plans", _with(PLAN, "cluster.node_groups.0.intra_node_bandwidth_GBps", -1), 422, "cluster.node_groups[0].intra_node_bandwidth_GBps"),
    ("saved-cluster-unknown", "POST", "/v1/plans", _with(PLAN, "cluster", "no-such-cluster"), 422, "cluster"),
    ("all-nodes-down", "POST", "/v1/plans", _with(PLAN, "cluster.nodes", [{"hostname": "node-0", "available": False}]), 422, "cluster.nodes"),
    ("node-unknown-host", "POST", "/v1/plans", _with(PLAN, "cluster.nodes", [{"hostname": "ghost"}]), 422, "cluster.nodes[0].hostname"),
    ("constraint-unknown", "POST", "/v1/plans", {**PLAN, "constraints": {"max_speed": 1}}, 422, "constraints.max_speed"),
    ("constraint-max-tp-zero", "POST", "/v1/plans", {**PLAN, "constraints": {"max_tp": 0}}, 422, "constraints.max_tp"),
    ("constraint-headroom", "POST", "/v1/plans", {**PLAN, "constraints": {"memory_headroom_fraction": 2}}, 422, "constraints.memory_headroom_fraction"),
    ("constraint-device-absent", "POST", "/v1/plans", {**PLAN, "constraints": {"allowed_device_types": ["H100-SXM5-80GB"]}}, 422, "constraints.allowed_device_types"),
    ("constraint-pinned-recompute", "POST", "/v1/plans", {**PLAN, "constraints": {"recompute": "sometimes"}}, 422, "constraints.recompute"),
    ("objective-unknown", "POST", "/v1/plans", {**PLAN, "objective": "speed"}, 422, "objective"),
    ("objective-cost-without-price", "POST", "/v1/plans", {**PLAN, "objective": "cost"}, 422, "cluster.node_groups"),
    ("top-k-too-large", "POST", "/v1/plans", {**PLAN, "top_k": 100}, 422, "top_k"),
    ("top-k-string", "POST", "/v1/plans", {**PLAN, "top_k": "3"}, 422, "top_k"),
    ("async-not-bool", "POST", "/v1/plans", {**PLAN, "async": "yes"}, 422, "async"),
    ("force-not-bool", "POST", "/v1/plans", {**PLAN, "force": 1}, 422, "force"),
    ("callback-not-http", "POST", "/v1/plans", {**PLAN, "async": True, "callback_url": "ftp://example.org/x"}, 422, "callback_url"),
    ("profile-unknown", "POST", "/v1/plans", {**PLAN, "profile_id": "no-such-profile"}, 422, "profile_id"),
    ("estimate-strategy-missing", "POST", "/v1/estimate", _with(ESTIMATE, "strategy", ...), 422, "strategy"),
    ("estimate-tp-not-dividing-heads", "POST", "/v1/estimate", _with(ESTIMATE, "strategy", {"dp": 1, "tp": 5}), 422, "strategy.tp"),
    ("estimate-strategy-unknown-field", "POST", "/v1/estimate", _with(ESTIMATE, "strategy.speed", 3), 422, "strategy.speed"),
    ("estimate-too-many-devices", "POST", "/v1/estimate", _with(ESTIMATE, "strategy", {"dp": 64}), 422, "strategy.dp"),
    ("estimate-recompute-unknown", "POST", "/v1/estimate", _with(ESTIMATE, "strategy.recompute", "some"), 422, "strategy.recompute"),
    ("estimate-zero-stage", "POST", "/v1/estimate", _with(ESTIMATE, "strategy.zero_stage", 4), 422, "strategy.zero_stage"),
    ("estimate-batch-not-divisible", "POST", "/v1/estimate", _with(ESTIMATE, "strategy", {"dp": 8, "micro_batch_size": 3}), 422, "strategy.micro_batch_size"),
    ("estimate-profile-unknown", "POST", "/v1/estimate", {**ESTIMATE, "profile_id": "nope"}, 422, "profile_id"),
    ("list-limit-zero", "GET", "/v1/plans?limit=0", None, 422, "limit"),
    ("list-limit-too-large", "GET", "/v1/plans?limit=201", None, 422, "limit"),
    ("list-limit-not-int", "GET", "/v1/plans?limit=ten", None, 422, "limit"),
    ("list-bad-cursor", "GET", "/v1/plans?cursor=not-a-cursor", None, 422, "cursor"),
    ("list-bad-date", "GET", "/v1/plans?created_after=yesterday", None, 422, "created_after"),
    ("list-negative-throughput", "GET", "/v1/plans?min_tokens_per_s=-1", None, 422, "min_tokens_per_s"),
    ("list-bad-sort", "GET", "/v1/plans?sort=colour", None, 422, "sort"),
    ("list-bad-status", "GET", "/v1/plans?status=great", None, 422, "status"),
    ("plan-unknown-id", "GET", "/v1/plans/00000000-0000-0000-0000-000000000000", None, 404, "id"),
    ("delete-unknown-id", "DELETE", "/v1/plans/nope", None, 404, "id"),
    ("replan-unknown-id", "POST", "/v1/plans/nope/replan", {"unavailable_nodes": ["node-0"]}, 404, "id"),
    ("replan-empty", "POST", "/v1/plans/{plan}/replan", {}, 422, "body"),
    ("replan-unknown-host", "POST", "/v1/plans/{plan}/replan", {"unavailable_nodes": ["ghost"]}, 422, "unavailable_nodes[0]"),
    ("replan-unknown-group", "POST", "/v1/plans/{plan}/replan", {"added_nodes": [{"hostname": "n9", "group": "zz"}]}, 422, "added_nodes[0].group"),
    ("replan-duplicate-host", "POST", "/v1/plans/{plan}/replan", {"added_nodes": [{"hostname": "node-1", "group": "g0"}]}, 422, "added_nodes[0].hostname"),
    ("replan-node-missing-hostname", "POST", "/v1/plans/{plan}/replan", {"added_nodes": [{"group": "g0"}]}, 422, "added_nodes[0].hostname"),
    ("replan-all-down", "POST", "/v1/plans/{plan}/replan", {"unavailable_nodes": ["node-0", "node-1"]}, 422, "cluster.nodes"),
    ("job-unknown", "GET", "/v1/jobs/nope", None, 404, "id"),
    ("job-cancel-unknown", "DELETE", "/v1/jobs/nope", None, 404, "id"),
    ("body-too-large", "POST", "/v1/plans", {**PLAN, "pad": "x" * 70_000}, 413, "body"),
]


@pytest.fixture
def bad_input_client(make_client):
    return make_client(max_body_bytes=64 * 1024)


@pytest.fixture
def parent_plan(bad_input_client):
    r = bad_input_client.post("/v1/plans", json=small_request(cluster=TWO_NODE_CLUSTER))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _send(client, method, url, body):
    if isinstance(body, bytes):
        return client.request(method, url, content=body, headers={"content-type": "application/json"})
    if body is None:
        return client.request(method, url)
    return client.request(method, url, json=body)


def test_there_are_at_least_30_kinds_of_bad_input():
    assert len({c[0] for c in CASES}) == len(CASES) >= 30


def test_every_bad_input_gets_a_4xx_naming_the_field(bad_input_client, parent_plan):
    failures = []
    for name, method, url, body, status, field in CASES:
        r = _send(bad_input_client, method, url.replace("{plan}", parent_plan), body)
        try:
            err = r.json()["error"]
            ok = r.status_code == status and err["field"] == field and err["message"] and err["code"]
        except (ValueError, KeyError, TypeError):
            ok, err = False, r.text
        if not ok:
            failures.append(f"{name}: {r.status_code} {err}")
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
