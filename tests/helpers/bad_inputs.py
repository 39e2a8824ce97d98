"""The bad-input table: every input here gets the status given, and an error body naming the
field given, with nothing logged at error level and no traceback.

Run by ``tests/api/test_bad_input.py`` and by ``bench/service_check.py`` (which writes it into
``docs/BAD_INPUT.md``), against an app built with :data:`APP_SETTINGS`.  ``{plan}`` in a URL is
the id of a stored plan on two nodes (``node-0``, ``node-1``), made first.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helpers.requests import SMALL_CLUSTER, SMALL_REQUEST, TWO_NODE_CLUSTER, small_request

#: Settings of the app the table runs against (a 256 KiB body limit; the rest as deployed).
APP_SETTINGS: dict[str, Any] = {"max_body_bytes": 256 * 1024}

ZERO = "00000000-0000-0000-0000-000000000000"
NUL_NAME = {**SMALL_CLUSTER, "name": "a\u0000b"}
ESTIMATE = {**copy.deepcopy(SMALL_REQUEST), "strategy": {"dp": 8, "micro_batch_size": 2}}
PLAN = small_request()


def _with(base: dict, path: str, value: Any) -> dict:
    """A copy of ``base`` with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    out = copy.deepcopy(base)
    node: Any = out
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


def _hosts(*names: str) -> dict:
    return small_request(cluster={**SMALL_CLUSTER, "node_groups": [{**SMALL_CLUSTER["node_groups"][0], "count": len(names), "hostnames": list(names)}]})


@dataclass(frozen=True)
class BadInput:
    """One row: a request (JSON body, raw bytes, or multipart ``files``/``data``; extra
    ``headers``) and the status and error field it must get."""

    id: str
    method: str
    url: str
    body: Any
    status: int
    field: str
    headers: Mapping[str, str] | None = None
    files: Mapping[str, Any] | None = None
    data: Mapping[str, str] | None = None


ONNX_OK = b"\x08\x07"  # a ModelProto with only ir_version: parses, has no graph

# (id, method, url, body: dict/list → JSON, bytes → raw JSON, None → no body, status, field)
_ROWS: list[tuple[str, str, str, Any, int, str]] = [
    ("body-not-json", "POST", "/v1/plans", b"{not json", 422, "body"),
    ("body-array", "POST", "/v1/plans", [1, 2], 422, "body"),
    ("body-empty", "POST", "/v1/plans", None, 422, "body"),
    ("model-missing", "POST", "/v1/plans", _with(PLAN, "model", ...), 422, "model"),
    ("training-missing", "POST", "/v1/plans", _with(PLAN, "training", ...), 422, "training"),
    ("cluster-missing", "POST", "/v1/plans", _with(PLAN, "cluster", ...), 422, "cluster"),
    ("unknown-top-level-field", "POST", "/v1/plans", {**PLAN, "colour": "red"}, 422, "colour"),
    ("plan-with-strategy", "POST", "/v1/plans", {**PLAN, "strategy": {"tp": 2}}, 422, "strategy"),
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
    ("training-field-unknown", "POST", "/v1/plans", _with(PLAN, "training.learning_rate", 3e-4), 422, "training.learning_rate"),
    ("training-offload-optimizer-deepspeed-spelling", "POST", "/v1/plans", _with(PLAN, "training.offload_optimizer", "cpu"), 422,
     "training.offload_optimizer"),
    ("recompute-modules-string", "POST", "/v1/plans", {**PLAN, "constraints": {"recompute_modules": "moe_act"}}, 422, "constraints.recompute_modules"),
    ("recompute-modules-unknown", "POST", "/v1/plans", {**PLAN, "constraints": {"recompute_modules": ["attention"]}}, 422, "constraints.recompute_modules"),
    ("node-groups-empty", "POST", "/v1/plans", _with(PLAN, "cluster.node_groups", []), 422, "cluster.node_groups"),
    ("node-group-field-unknown", "POST", "/v1/plans", _with(PLAN, "cluster.node_groups.0.nvlink_GBps", 900), 422, "cluster.node_groups[0].nvlink_GBps"),
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
    ("estimate-block-recompute-without-full", "POST", "/v1/estimate", _with(ESTIMATE, "strategy.recompute_num_layers", 2), 422,
     "strategy.recompute_num_layers"),
    ("estimate-block-recompute-negative", "POST", "/v1/estimate", _with(ESTIMATE, "strategy.recompute_num_layers", -1), 422,
     "strategy.recompute_num_layers"),
    ("constraint-block-recompute-deepspeed", "POST", "/v1/plans",
     {**_with(PLAN, "training.framework", "deepspeed"), "constraints": {"recompute_num_layers": 2}}, 422, "constraints.recompute_num_layers"),
    ("training-tp-comm-overlap-deepspeed", "POST", "/v1/plans", _with(_with(PLAN, "training.framework", "deepspeed"), "training.tp_comm_overlap", True),
     422, "training.tp_comm_overlap"),
    ("training-exp-avg-dtype-without-precision-aware", "POST", "/v1/plans", _with(PLAN, "training.exp_avg_dtype", "bf16"), 422,
     "training.exp_avg_dtype"),
    ("training-pure-bf16-megatron", "POST", "/v1/plans", _with(PLAN, "training.master_weights", False), 422, "training.master_weights"),
    ("training-optimizer-offload-fsdp", "POST", "/v1/plans",
     _with(_with(PLAN, "training.framework", "fsdp"), "training.optimizer_offload_fraction", 1), 422, "training.optimizer_offload_fraction"),
    ("training-cpu-offload-megatron", "POST", "/v1/plans", _with(PLAN, "training.cpu_offload", True), 422, "training.cpu_offload"),
    ("estimate-cpu-offload-zero2-fsdp", "POST", "/v1/estimate",
     _with(_with(_with(ESTIMATE, "training.framework", "fsdp"), "training.cpu_offload", True), "strategy",
           {"dp": 8, "micro_batch_size": 2, "zero_stage": 2}), 422, "strategy.zero_stage"),
    ("training-adamw-8bit-megatron", "POST", "/v1/plans", _with(PLAN, "training.optimizer", "adamw_8bit"), 422, "training.optimizer"),
    ("training-optimizer-in-backward-megatron", "POST", "/v1/plans", _with(PLAN, "training.optimizer_in_backward", True), 422,
     "training.optimizer_in_backward"),
    ("training-reference-model-with-lora", "POST", "/v1/plans",
     _with(_with(_with(PLAN, "training.framework", "fsdp"), "training.lora_rank", 16), "training.reference_model", True), 422,
     "training.reference_model"),
    ("training-muon-fsdp", "POST", "/v1/plans", _with(_with(PLAN, "training.framework", "fsdp"), "training.optimizer", "muon"), 422,
     "training.optimizer"),
    ("constraint-muon-zero3", "POST", "/v1/plans", {**_with(PLAN, "training.optimizer", "muon"), "constraints": {"zero_stage": 3}}, 422,
     "constraints.zero_stage"),
    ("training-activation-offloading-megatron-without-modules", "POST", "/v1/plans", _with(PLAN, "training.activation_offloading", True),
     422, "training.offload_modules"),
    ("training-activation-offloading-megatron-deepspeed", "POST", "/v1/plans",
     _with(_with(PLAN, "training.framework", "megatron-deepspeed"), "training.activation_offloading", True), 422,
     "training.activation_offloading"),
    ("training-offload-modules-unknown", "POST", "/v1/plans",
     _with(_with(PLAN, "training.activation_offloading", True), "training.offload_modules", ["mlp"]), 422, "training.offload_modules"),
    ("training-lora-megatron-deepspeed", "POST", "/v1/plans",
     _with(_with(PLAN, "training.framework", "megatron-deepspeed"), "training.lora_rank", 16), 422, "training.lora_rank"),
    ("training-lora-rank-string", "POST", "/v1/plans", _with(PLAN, "training.lora_rank", "16"), 422, "training.lora_rank"),
    ("training-lora-modules-hf-names", "POST", "/v1/plans",
     _with(_with(PLAN, "training.lora_rank", 16), "training.lora_target_modules", ["q_proj", "v_proj"]), 422, "training.lora_target_modules"),
    ("training-lora-dropout-without-rank", "POST", "/v1/plans", _with(PLAN, "training.lora_dropout", 0.05), 422, "training.lora_dropout"),
    ("training-qlora-megatron", "POST", "/v1/plans", _with(_with(PLAN, "training.lora_rank", 16), "training.lora_base_dtype", "nf4"), 422,
     "training.lora_base_dtype"),
    ("training-loss-kernel-megatron", "POST", "/v1/plans", _with(PLAN, "training.loss_kernel", "liger"), 422, "training.loss_kernel"),
    ("training-submodule-checkpointing-megatron", "POST", "/v1/plans", _with(PLAN, "training.submodule_checkpointing", True), 422,
     "training.submodule_checkpointing"),
    ("training-pipeline-schedules-megatron", "POST", "/v1/plans", _with(PLAN, "training.pipeline_schedules_per_step", 2), 422,
     "training.pipeline_schedules_per_step"),
    ("training-pipeline-schedules-zero", "POST", "/v1/plans", _with(PLAN, "training.pipeline_schedules_per_step", 0), 422,
     "training.pipeline_schedules_per_step"),
    ("constraint-recompute-method-deepspeed", "POST", "/v1/plans",
     {**_with(PLAN, "training.framework", "deepspeed"), "constraints": {"recompute_method": "uniform", "recompute_num_layers": 2}}, 422,
     "constraints.recompute_method"),
    ("constraint-pins-beyond-cluster", "POST", "/v1/plans", {**PLAN, "constraints": {"tp": 4, "dp": 4}}, 422, "constraints.tp"),
    ("constraint-dp-not-dividing-batch", "POST", "/v1/plans", {**PLAN, "constraints": {"dp": 3}}, 422, "constraints.dp"),
    ("constraint-recompute-group-beyond-stage", "POST", "/v1/plans",
     {**PLAN, "constraints": {"pp": 4, "recompute_method": "uniform", "recompute_num_layers": 4}}, 422, "constraints.recompute_num_layers"),
    ("training-cp-a2a-size-without-hierarchical-cp", "POST", "/v1/plans",
     _with(_with(PLAN, "training.cp_comm_type", "a2a"), "training.cp_a2a_size", 4), 422, "training.cp_a2a_size"),
    ("training-fp8-param-gather-deepspeed", "POST", "/v1/estimate",
     _with(_with(ESTIMATE, "training.framework", "deepspeed"), "training.fp8_param_gather", True), 422,
     "training.fp8_param_gather"),
    ("estimate-lora-fp8", "POST", "/v1/estimate", _with(_with(ESTIMATE, "training.lora_rank", 16), "training.dtype", "fp8"), 422,
     "training.dtype"),
    ("training-activation-offloading-not-bool", "POST", "/v1/estimate",
     _with(_with(ESTIMATE, "training.framework", "fsdp"), "training.activation_offloading", "yes"), 422, "training.activation_offloading"),
    ("estimate-activation-offloading-paddle-selective", "POST", "/v1/estimate",
     _with(_with(_with(ESTIMATE, "training.framework", "paddle"), "training.activation_offloading", True), "strategy",
           {"dp": 8, "micro_batch_size": 2, "recompute": "selective"}), 422, "strategy.recompute"),
    ("constraint-activation-offloading-pipeline", "POST", "/v1/plans",
     {**_with(_with(PLAN, "training.framework", "fsdp"), "training.activation_offloading", True), "constraints": {"pp": 2}}, 422,
     "constraints.pp"),
    ("training-optimizer-offload-out-of-range", "POST", "/v1/estimate", _with(ESTIMATE, "training.optimizer_offload_fraction", 2), 422,
     "training.optimizer_offload_fraction"),
    ("estimate-partial-offload-zero2-deepspeed", "POST", "/v1/estimate",
     _with(_with(_with(ESTIMATE, "training.framework", "deepspeed"), "training.optimizer_offload_fraction", 0.5), "strategy",
           {"dp": 8, "micro_batch_size": 2, "zero_stage": 2}), 422, "strategy.zero_stage"),
    ("constraint-precision-aware-optimizer-zero3", "POST", "/v1/plans",
     {**_with(PLAN, "training.precision_aware_optimizer", True), "constraints": {"zero_stage": 3}}, 422, "constraints.zero_stage"),
    ("training-microbatch-group-paddle", "POST", "/v1/plans",
     _with(_with(PLAN, "training.framework", "paddle"), "training.microbatch_group_size_per_vp_stage", 6), 422,
     "training.microbatch_group_size_per_vp_stage"),
    ("constraint-microbatch-group-short-last-group", "POST", "/v1/plans",
     {**_with(PLAN, "training.microbatch_group_size_per_vp_stage", 5), "constraints": {"pp": 4, "vpp": 3, "dp": 2, "micro_batch_size": 4}}, 422,
     "training.microbatch_group_size_per_vp_stage"),
    ("constraint-zero3-native-deepspeed-moe", "POST", "/v1/plans",
     {**_with(_with(PLAN, "training.framework", "megatron-deepspeed"), "model", {"preset": "mixtral-8x7b"}), "constraints": {"zero_stage": 3}},
     422, "constraints.zero_stage"),
    ("estimate-dp-shard-not-dividing", "POST", "/v1/estimate", _with(ESTIMATE, "strategy", {"dp": 8, "micro_batch_size": 2, "zero_stage": 1, "dp_shard": 3}),
     422, "strategy.dp_shard"),
    ("estimate-dp-shard-without-zero", "POST", "/v1/estimate", _with(ESTIMATE, "strategy", {"dp": 8, "micro_batch_size": 2, "zero_stage": 0, "dp_shard": 4}),
     422, "strategy.dp_shard"),
    ("constraint-dp-shard-megatron-zero3", "POST", "/v1/plans", {**PLAN, "constraints": {"zero_stage": 3, "dp_shard": 4}}, 422,
     "constraints.dp_shard"),
    ("estimate-etp-not-dividing-experts", "POST", "/v1/estimate",
     {**_with(ESTIMATE, "model", {"preset": "mixtral-8x7b"}), "strategy": {"dp": 8, "ep": 8, "etp": 3, "micro_batch_size": 2}},
     422, "strategy.etp"),
    ("estimate-etp-negative", "POST", "/v1/estimate", _with(ESTIMATE, "strategy.etp", -1), 422, "strategy.etp"),
    ("constraint-tight-memory-unknown", "POST", "/v1/plans", {**PLAN, "constraints": {"tight_memory": "sometimes"}}, 422,
     "constraints.tight_memory"),
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
    ("body-too-large", "POST", "/v1/plans", {**PLAN, "pad": "x" * 300_000}, 413, "body"),
    ("plan-id-nul", "GET", "/v1/plans/%00", None, 404, "path"),
    ("plan-id-not-uuid", "GET", "/v1/plans/abc", None, 404, "id"),
    ("job-id-nul", "GET", "/v1/jobs/x%00y", None, 404, "path"),
    ("job-id-not-uuid", "DELETE", "/v1/jobs/abc", None, 404, "id"),
    ("model-id-not-uuid", "GET", "/v1/models/abc'--", None, 404, "model_id"),
    ("profile-id-not-uuid", "GET", "/v1/profiles/abc%27", None, 404, "profile_id"),
    ("cluster-name-bad", "GET", "/v1/clusters/a%20b", None, 404, "name"),
    ("cluster-delete-bad", "DELETE", "/v1/clusters/%C3%A9", None, 404, "name"),
    ("launch-unknown-plan", "GET", f"/v1/plans/{ZERO}/launch?target=torchrun", None, 404, "id"),
    ("filter-model-nul", "GET", "/v1/plans?model=%00", None, 422, "model"),
    ("filter-cluster-nul", "GET", "/v1/plans?cluster=a%00", None, 422, "cluster"),
    ("filter-device-nul", "GET", "/v1/plans?device=%00", None, 422, "device"),
    ("filter-hash-nul", "GET", "/v1/plans?request_hash=%00", None, 422, "request_hash"),
    ("filter-hash-format", "GET", "/v1/plans?request_hash=abc", None, 422, "request_hash"),
    ("filter-parent-nul", "GET", "/v1/plans?parent_id=%00", None, 422, "parent_id"),
    ("filter-parent-format", "GET", "/v1/plans?parent_id=abc", None, 422, "parent_id"),
    ("filter-model-long", "GET", "/v1/plans?model=" + "m" * 300, None, 422, "model"),
    ("query-not-utf8", "GET", "/v1/plans?model=%ff", None, 422, "query"),
    ("query-too-long", "GET", "/v1/plans?model=" + "m" * 5000, None, 422, "model"),
    ("cursor-garbage", "GET", "/v1/plans?cursor=%00", None, 422, "cursor"),
    ("profiles-device-nul", "GET", "/v1/profiles?device=%00", None, 422, "device"),
    ("body-not-utf8", "POST", "/v1/plans", b'{"model": "\xff"}', 422, "body"),
    ("body-huge-int", "POST", "/v1/plans", b'{"top_k": 1' + b"0" * 5000 + b"}", 422, "body"),
    ("body-huge-float", "POST", "/v1/plans", b'{"top_k": 1e999}', 422, "body"),
    ("body-nan", "POST", "/v1/plans", b'{"top_k": NaN}', 422, "body"),
    ("body-deep-1001", "POST", "/v1/plans", b"[" * 1001 + b"]" * 1001, 422, "body"),
    ("body-deep-100k", "POST", "/v1/estimate", b"[" * 100_000, 422, "body"),
    ("body-deep-65", "POST", "/v1/plans", b'{"a":' * 65 + b"1" + b"}" * 65, 422, "body"),
    ("cluster-name-nul", "POST", "/v1/plans", small_request(cluster=NUL_NAME), 422, "cluster.name"),
    ("cluster-name-surrogate", "POST", "/v1/plans", b'{"model": {"preset": "gpt3-125m"}, "training": {"global_batch_size": 64, "sequence_length": 2048}, "cluster": {"name": "\\ud800", "node_groups": []}}', 422, "cluster.name"),
    ("model-name-nul", "POST", "/v1/plans", small_request(model={"preset": "gpt3-125m", "name": "x\u0000"}), 422, "model.name"),
    ("hostname-nul", "POST", "/v1/plans", small_request(cluster={**SMALL_CLUSTER, "node_groups": [{**SMALL_CLUSTER["node_groups"][0], "hostnames": ["n\u0000"]}]}), 422, "cluster.node_groups[0].hostnames[0]"),
    ("key-nul", "POST", "/v1/plans", {"a\u0000": 1}, 422, "body"),
    ("string-too-long", "POST", "/v1/estimate", {"model": {"preset": "x" * 100_001}}, 422, "model.preset"),
    ("estimate-surrogate", "POST", "/v1/estimate", b'{"model": {"preset": "\\udc00"}}', 422, "model.preset"),
    ("save-cluster-nul", "PUT", "/v1/clusters/ok", NUL_NAME, 422, "name"),
    ("save-cluster-name-nul", "POST", "/v1/clusters", {"name": "a\u0000", "cluster": SMALL_CLUSTER}, 422, "name"),
    ("profile-device-nul", "POST", "/v1/profiles", {"schema": "planner-profile", "schema_version": 1, "device": {"name": "x\u0000"}, "measurements": []}, 422, "device.name"),
    ("profile-text-plain-surrogate", "POST", "/v1/profiles", b'{"device": {"name": "\\ud800"}}', 422, "device.name"),
    ("import-text-nul", "POST", "/v1/clusters/import?format=nvidia-smi&filename=n0", b"index, name\n0, A\x00100\n", 422, "body"),
    ("import-name-nul", "POST", "/v1/clusters/import?format=nvidia-smi&name=%00", b"x", 422, "name"),
    ("callback-off", "POST", "/v1/plans", small_request(**{"async": True, "callback_url": "https://hooks.example.org/x"}), 422, "callback_url"),
    ("callback-metadata", "POST", "/v1/plans", small_request(**{"async": True, "callback_url": "http://169.254.169.254/latest"}), 422, "callback_url"),
    ("hostname-shell-metachar", "POST", "/v1/plans", _hosts("n0;reboot"), 422, "cluster.node_groups[0].hostnames[0]"),
    ("hostname-space", "POST", "/v1/plans", _hosts("node 0"), 422, "cluster.node_groups[0].hostnames[0]"),
    ("hostname-dollar", "POST", "/v1/plans", _hosts("ok-0", "$(id)"), 422, "cluster.node_groups[0].hostnames[1]"),
    ("model-unknown-id-get", "GET", f"/v1/models/{ZERO}", None, 404, "model_id"),
    ("profile-unknown-id-get", "GET", f"/v1/profiles/{ZERO}", None, 404, "profile_id"),
    ("job-unknown-uuid", "GET", f"/v1/jobs/{ZERO}", None, 404, "id"),
    ("launch-unknown-target", "GET", "/v1/plans/{plan}/launch?target=punchcards", None, 422, "target"),
    ("import-format-unknown", "POST", "/v1/clusters/import?format=abacus", b"x", 422, "format"),
]

BAD_INPUTS: list[BadInput] = [BadInput(*row) for row in _ROWS] + [
    BadInput("host-header-not-allowed", "GET", "/v1/plans", None, 400, "Host", headers={"Host": "evil.example"}),
    BadInput("upload-not-onnx", "POST", "/v1/models/onnx", None, 422, "model.onnx", files={"file": ("x.onnx", b"not an onnx file at all", "application/octet-stream")}),
    BadInput("upload-empty", "POST", "/v1/models/onnx", None, 422, "model.onnx", files={"file": ("x.onnx", b"", "application/octet-stream")}),
    BadInput("upload-no-graph", "POST", "/v1/models/onnx", None, 422, "model.onnx", files={"file": ("x.onnx", ONNX_OK, "application/octet-stream")}),
    BadInput("upload-truncated", "POST", "/v1/models/onnx", None, 422, "model.onnx", files={"file": ("x.onnx", b"\x3a\xff\xff\xff\x0f", "application/octet-stream")}),
    BadInput("upload-no-file", "POST", "/v1/models/onnx", None, 422, "file", data={"name": "m"}),
    BadInput("upload-dims-not-json", "POST", "/v1/models/onnx", None, 422, "dims", files={"file": ("x.onnx", b"x", "application/octet-stream")}, data={"dims": "{nope"}),
    BadInput("upload-name-nul", "POST", "/v1/models/onnx", None, 422, "name", files={"file": ("x.onnx", b"x", "application/octet-stream")}, data={"name": "a\u0000"}),
]


def parent_plan(client: Any) -> str:
    """The stored plan the ``{plan}`` rows replan."""
    r = client.post("/v1/plans", json=small_request(cluster=TWO_NODE_CLUSTER))
    assert r.status_code in (200, 201), r.text
    return str(r.json()["id"])


def send(client: Any, case: BadInput, plan_id: str) -> Any:
    url = case.url.replace("{plan}", plan_id)
    kw: dict[str, Any] = {"headers": dict(case.headers or {})}
    if case.files is not None or case.data is not None:
        kw.update(files=case.files, data=case.data)
    elif isinstance(case.body, bytes):
        kw["content"] = case.body
        kw["headers"].setdefault("Content-Type", "application/json")
    elif case.body is not None:
        kw["json"] = case.body
    return client.request(case.method, url, **kw)


def check(client: Any, case: BadInput, plan_id: str, records: list[logging.LogRecord] | None = None) -> tuple[int, str | None, str | None]:
    """(status, field, problem or None) of one row."""
    r = send(client, case, plan_id)
    try:
        err = r.json()["error"]
        field = err.get("field")
        ok = bool(err.get("message")) and bool(err.get("code"))
    except (ValueError, KeyError, TypeError):
        return r.status_code, None, f"no error body: {r.text[:200]}"
    if r.status_code != case.status or field != case.field or not ok:
        return r.status_code, field, f"got {r.status_code} {field!r} ({err.get('message', '')[:120]}), want {case.status} {case.field!r}"
    if "Traceback" in r.text:
        return r.status_code, field, "a traceback in the body"
    return r.status_code, field, None


__all__ = ["APP_SETTINGS", "BAD_INPUTS", "BadInput", "ESTIMATE", "PLAN", "check", "parent_plan", "send"]
