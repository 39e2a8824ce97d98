"""Request shapes for the HTTP edge (OpenAPI documentation and top-level type checks).

The schemas are deliberately permissive below the top level (model, training, cluster,
constraints and strategy are objects): the rules, with their field paths and reasons, live in
``planner_service.planner.request`` and ``cost_model``, which the routes call with the validated dict.
Top-level fields are strict (no coercion of "3" to 3) and unknown top-level fields are refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

EXAMPLE_CLUSTER = {
    "name": "dgx-a100",
    "node_groups": [
        {
            "name": "a100",
            "count": 2,
            "gpus_per_node": 8,
            "device": "A100-SXM4-80GB",
            "intra_node_bandwidth_GBps": 300,
            "inter_node_bandwidth_GBps": 200,
            "hostnames": ["node-0", "node-1"],
        }
    ],
}
EXAMPLE_MIXED_CLUSTER = {
    "name": "mixed",
    "node_groups": [
        {"name": "h100", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB"},
        {"name": "a100", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB"},
    ],
    "nodes": [{"hostname": "a100-1", "group": "a100", "available": False}],
}
EXAMPLE_TRAINING = {"global_batch_size": 64, "sequence_length": 2048, "dtype": "bf16", "optimizer": "adam"}

PLAN_EXAMPLES = {
    "preset": {
        "summary": "A preset model on one node of 8 A100s",
        "value": {
            "model": {"preset": "gpt3-125m"},
            "training": EXAMPLE_TRAINING,
            "cluster": {"name": "one-node", "node_groups": [{"name": "g0", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]},
        },
    },
    "hf_config_async": {
        "summary": "A Hugging Face config on a mixed cluster, as a job with a callback",
        "value": {
            "model": {"name": "my-llama", "transformer": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}},
            "training": {"global_batch_size": 512, "sequence_length": 4096, "dtype": "bf16"},
            "cluster": EXAMPLE_MIXED_CLUSTER,
            "constraints": {"max_tp": 8, "memory_headroom_fraction": 0.1},
            "objective": "throughput",
            "top_k": 3,
            "async": True,
            "callback_url": "http://127.0.0.1:9000/planner-callback",
        },
    },
    "saved_cluster_forced": {
        "summary": "A saved cluster by name; force a fresh plan",
        "value": {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 256, "sequence_length": 8192}, "cluster": "dgx-a100", "force": True},
    },
}

REPLAN_EXAMPLES = {
    "node_down": {"summary": "A node died", "value": {"unavailable_nodes": ["node-1"]}},
    "nodes_added": {"summary": "Nodes were added to a group", "value": {"added_nodes": [{"hostname": "node-2", "group": "a100"}]}},
    "new_cluster": {"summary": "A different cluster altogether", "value": {"cluster": EXAMPLE_CLUSTER}},
}

ESTIMATE_EXAMPLES = {
    "megatron_style": {
        "summary": "One strategy on 2 DGX A100 nodes",
        "value": {
            "model": {"preset": "gpt3-1.3b"},
            "training": {"global_batch_size": 512, "sequence_length": 2048, "dtype": "bf16"},
            "cluster": EXAMPLE_CLUSTER,
            "strategy": {"dp": 8, "tp": 2, "pp": 1, "micro_batch_size": 4, "sequence_parallel": True, "recompute": "selective", "zero_stage": 1},
        },
    }
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class PlanCreate(_Strict):
    """POST /v1/plans."""

    model: dict[str, Any] = Field(
        description="Exactly one of {preset}, {transformer: <config.json keys>}, {graph: <operator graph>} or {model_id} (an uploaded model); optional name.",
        json_schema_extra={"examples": [{"preset": "llama3-70b"}]},
    )
    training: dict[str, Any] = Field(
        description="global_batch_size (sequences), sequence_length, dtype (bf16|fp16|fp32|fp8), optimizer (adam|sgd), attention, total_tokens.",
        json_schema_extra={"examples": [EXAMPLE_TRAINING]},
    )
    cluster: dict[str, Any] | str = Field(
        description="A cluster object {name, node_groups[], nodes?} or the name of a saved cluster.",
        json_schema_extra={"examples": [EXAMPLE_CLUSTER]},
    )
    constraints: dict[str, Any] | None = Field(
        default=None,
        description="Pinned strategy fields (tp, pp, ...), max_tp, max_pp, memory_headroom_fraction, allowed_device_types, max_devices.",
    )
    objective: str = Field(default="throughput", description="throughput | cost | time_to_train")
    top_k: int = Field(default=3, description="How many alternative plans to keep (0-50).")
    async_: bool = Field(default=False, alias="async", description="Run as a job: 202 with the job; poll GET /v1/jobs/{id}.")
    force: bool = Field(default=False, description="Plan again even if an identical request has a stored plan (new revision).")
    callback_url: str | None = Field(default=None, description="http(s) URL that gets a POST with the job when it ends (jobs only).")
    profile_id: str | None = Field(default=None, description="An uploaded operator profile to calibrate the cost model.")


class NodeRef(_Strict):
    hostname: str
    group: str


class ReplanRequest(_Strict):
    """POST /v1/plans/{id}/replan: what changed in the parent plan's cluster."""

    unavailable_nodes: list[str] | None = Field(default=None, description="Hostnames that are down.")
    added_nodes: list[NodeRef] | None = Field(default=None, description="New nodes, each added to an existing node group.")
    cluster: dict[str, Any] | str | None = Field(default=None, description="A replacement cluster (object or saved name); the edits above apply to it.")
    async_: bool = Field(default=False, alias="async", description="Run as a job (202).")
    callback_url: str | None = None


class EstimateCreate(_Strict):
    """POST /v1/estimate."""

    model: dict[str, Any] = Field(json_schema_extra={"examples": [{"preset": "gpt3-1.3b"}]})
    training: dict[str, Any] = Field(json_schema_extra={"examples": [EXAMPLE_TRAINING]})
    cluster: dict[str, Any] | str = Field(json_schema_extra={"examples": [EXAMPLE_CLUSTER]})
    strategy: dict[str, Any] = Field(
        description="dp, tp, pp, cp, ep, vpp, micro_batch_size, sequence_parallel, recompute (none|selective|full), zero_stage (0-3), layers_per_stage.",
        json_schema_extra={"examples": [{"dp": 8, "tp": 2, "micro_batch_size": 4}]},
    )
    profile_id: str | None = None


__all__ = [
    "ESTIMATE_EXAMPLES",
    "EstimateCreate",
    "NodeRef",
    "PLAN_EXAMPLES",
    "PlanCreate",
    "REPLAN_EXAMPLES",
    "ReplanRequest",
]
