"""Hand-built plan dicts in the shape the planner stores (docs: the brief's plan shape).

* ``homogeneous_plan``: 2 nodes × 8 H100, tp=4, pp=2, dp=2; stage 0 on ``node7``, stage 1 on
  ``node66`` (``node66`` sorts before ``node7`` as text), GPUs in reverse order on node66.
* ``mixed_plan``: H100 + A100 nodes, tp=2, pp=2, dp=4, uneven layers (the H100 stage gets more).
* ``interleaved_plan``: pipeline neighbours on one host, so hosts hold non-contiguous rank
  blocks (node7 holds ranks 0-3 and 8-11); vpp=2 with uneven chunks.
* ``cp_plan``: the homogeneous plan as context parallelism (tp=1, cp=4) under a framework.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

LLAMA_SPEC = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


def _ranks(dp: int, tp: int, pp: int, cp: int, place) -> list[dict[str, Any]]:
    out = []
    for pp_i in range(pp):
        for dp_i in range(dp):
            for cp_i in range(cp):
                for tp_i in range(tp):
                    r = len(out)  # the loops run in Megatron order: tp fastest, then cp, dp, pp
                    host, gpu, group, device = place(pp_i, dp_i, cp_i, tp_i)
                    out.append({"rank": r, "host": host, "gpu": gpu, "node_group": group, "device": device,
                                "stage": pp_i, "dp": dp_i, "pp": pp_i, "tp": tp_i, "cp": cp_i})
    return sorted(out, key=lambda e: e["rank"])


def homogeneous_plan() -> dict[str, Any]:
    dp, tp, pp, cp = 2, 4, 2, 1
    hosts = ["node7", "node66"]

    def place(pp_i, dp_i, cp_i, tp_i):
        local = dp_i * tp + tp_i
        gpu = local if pp_i == 0 else 7 - local
        return hosts[pp_i], gpu, "h100", "H100-SXM5-80GB"

    return {
        "id": "3f2a9c1e-homog",
        "status": "done",
        "model": {"name": "llama3-8b", "params": 8_030_261_248, "spec": dict(LLAMA_SPEC)},
        "training": {"global_batch_size": 64, "sequence_length": 8192, "dtype": "bf16", "optimizer": "adam"},
        "cluster": {
            "name": "two-h100",
            "node_groups": [{"name": "h100", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB",
                             "intra_node_bandwidth_GBps": 450, "inter_node_bandwidth_GBps": 400,
                             "hostnames": ["node66", "node7"], "nccl_socket_ifname": "=eth0", "nccl_ib_hca": "mlx5_0,mlx5_1"}],
            "nodes": [{"hostname": "node66", "group": "h100", "available": True, "driver_version": "550.54.15", "cuda_version": "12.4", "nccl_version": "2.21.5"},
                      {"hostname": "node7", "group": "h100", "available": True, "driver_version": "550.54.15", "cuda_version": "12.4", "nccl_version": "2.21.5"}],
        },
        "best": {
            "strategy": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": 1, "vpp": 1, "micro_batch_size": 1,
                         "sequence_parallel": True, "recompute": "selective", "zero_stage": 1, "layers_per_stage": [16, 16]},
            "prediction": {"step_time_s": 4.2},
            "stages": [
                {"index": 0, "first_layer": 0, "last_layer": 15, "num_layers": 16, "device": "H100-SXM5-80GB", "node_group": "h100", "hosts": ["node7"], "has_embedding": True, "has_head": False},
                {"index": 1, "first_layer": 16, "last_layer": 31, "num_layers": 16, "device": "H100-SXM5-80GB", "node_group": "h100", "hosts": ["node66"], "has_embedding": False, "has_head": True},
            ],
            "ranks": _ranks(dp, tp, pp, cp, place),
        },
        "alternatives": [],
        "warnings": [],
    }


def mixed_plan(a100_gpus: int = 8) -> dict[str, Any]:
    """H100 nodes node7, node8 (8 GPUs) + A100 nodes node66, node100 (``a100_gpus`` GPUs).

    tp=2, dp=4 (8 ranks per stage) with ``a100_gpus=8``: stage 0 (20 layers) on the H100s
    (node7 GPUs 0-3, node8 GPUs 7-4), stage 1 (12 layers) on the A100s.  As text the hosts sort
    node100 < node66 < node7 < node8, the reverse of the plan's node order on the A100 side.
    With ``a100_gpus=4`` the A100 nodes have fewer GPUs than the H100 nodes (one-template
    operators must refuse it).
    """
    dp, tp, pp, cp = 4, 2, 2, 1

    def place(pp_i, dp_i, cp_i, tp_i):
        local = (dp_i % 2) * tp + tp_i
        if pp_i == 0:
            host = "node7" if dp_i < 2 else "node8"
            gpu = local if host == "node7" else 7 - local
            return host, gpu, "h100", "H100-SXM5-80GB"
        host = "node66" if dp_i < 2 else "node100"
        return host, local, "a100", "A100-SXM4-80GB"

    plan = homogeneous_plan()
    plan.update({
        "id": "9b1c-mixed",
        "cluster": {
            "name": "mixed",
            "node_groups": [
                {"name": "h100", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB", "intra_node_bandwidth_GBps": 450,
                 "inter_node_bandwidth_GBps": 400, "hostnames": ["node7", "node8"], "nccl_socket_ifname": "ib", "nccl_ib_hca": "mlx5"},
                {"name": "a100", "count": 2, "gpus_per_node": a100_gpus, "device": "A100-SXM4-80GB", "intra_node_bandwidth_GBps": 300,
                 "inter_node_bandwidth_GBps": 100, "hostnames": ["node66", "node100"], "nccl_socket_ifname": "eth"},
            ],
            "nodes": [
                {"hostname": "node7", "group": "h100", "available": True, "driver_version": "550.54.15", "cuda_version": "12.4", "nccl_version": "2.21.5"},
                {"hostname": "node8", "group": "h100", "available": True, "driver_version": "550.54.15", "cuda_version": "12.4", "nccl_version": "2.21.5"},
                {"hostname": "node66", "group": "a100", "available": True, "driver_version": "535.104.05", "cuda_version": "12.2", "nccl_version": "2.18.3"},
                {"hostname": "node100", "group": "a100", "available": True, "driver_version": "535.104.05", "cuda_version": "12.2", "nccl_version": "2.18.3"},
            ],
        },
    })
    plan["training"] = {"global_batch_size": 128, "sequence_length": 4096, "dtype": "bf16", "optimizer": "adam"}
    plan["best"] = {
        "strategy": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": 1, "vpp": 1, "micro_batch_size": 2,
                     "sequence_parallel": True, "recompute": "full", "zero_stage": 1, "layers_per_stage": [20, 12]},
        "prediction": {"step_time_s": 9.1},
        "stages": [
            {"index": 0, "first_layer": 0, "last_layer": 19, "num_layers": 20, "device": "H100-SXM5-80GB", "node_group": "h100", "hosts": ["node7", "node8"]},
            {"index": 1, "first_layer": 20, "last_layer": 31, "num_layers": 12, "device": "A100-SXM4-80GB", "node_group": "a100", "hosts": ["node66", "node100"]},
        ],
        "ranks": _ranks(dp, tp, pp, cp, place),
    }
    return plan


def interleaved_plan() -> dict[str, Any]:
    """Homogeneous 2×8 GPUs, tp=4, pp=2, dp=2, pipeline neighbours on one host: node7 holds
    stage 0 dp0 (ranks 0-3) and stage 1 dp0 (ranks 8-11); node66 the dp1 halves.  No host's
    ranks form one contiguous block, so launchers need the rank wrapper."""
    plan = homogeneous_plan()
    dp, tp, pp, cp = 2, 4, 2, 1

    def place(pp_i, dp_i, cp_i, tp_i):
        host = "node7" if dp_i == 0 else "node66"
        return host, pp_i * tp + tp_i, "h100", "H100-SXM5-80GB"

    plan["id"] = "77aa-interleaved"
    plan["best"] = copy.deepcopy(plan["best"])
    plan["best"]["ranks"] = _ranks(dp, tp, pp, cp, place)
    plan["best"]["strategy"]["vpp"] = 2
    plan["best"]["strategy"]["layers_per_stage"] = [9, 8, 7, 8]
    plan["best"]["strategy"]["zero_stage"] = 3
    return plan


ALL_PLANS = {"homogeneous": homogeneous_plan, "mixed": mixed_plan, "interleaved": interleaved_plan}


def uneven_gpu_plan() -> dict[str, Any]:
    return mixed_plan(a100_gpus=4)


def cp_plan(framework: str, pp: int = 2, **training: Any) -> dict[str, Any]:
    """``homogeneous_plan`` with tp=1, cp=4 (dp 2, ``pp`` stages) under ``framework``, ranks in
    order on node7 then node66, 8 per host."""
    plan = homogeneous_plan()
    plan["training"].update({"framework": framework, **training})
    s = plan["best"]["strategy"]
    s.update({"tp": 1, "cp": 4, "pp": pp})
    if pp == 1:
        s["layers_per_stage"] = [sum(s["layers_per_stage"])]
    hosts = ["node7", "node66"]

    def place(p: int, d: int, c: int, t: int) -> tuple[str, int, str, str]:
        rank = (p * s["dp"] + d) * s["cp"] + c
        return hosts[rank // 8], rank % 8, "h100", "H100-SXM5-80GB"

    plan["best"]["ranks"] = _ranks(s["dp"], s["tp"], s["pp"], s["cp"], place)
    plan["best"].pop("stages")
    return plan


def hsdp_plan(framework: str, zero_stage: int, dp_shard: int = 8) -> dict[str, Any]:
    """``homogeneous_plan`` as HSDP: tp=pp=cp=1, dp=16 over both hosts, the ZeRO state sharded
    over the ``dp_shard`` ranks of each host and replicated across them, under ``framework``."""
    plan = homogeneous_plan()
    plan["training"]["framework"] = framework
    s = plan["best"]["strategy"]
    s.update({"tp": 1, "pp": 1, "cp": 1, "dp": 16, "sequence_parallel": False, "zero_stage": zero_stage, "dp_shard": dp_shard,
              "layers_per_stage": [sum(s["layers_per_stage"])]})
    hosts = ["node7", "node66"]

    def place(p: int, d: int, c: int, t: int) -> tuple[str, int, str, str]:
        return hosts[d // 8], d % 8, "h100", "H100-SXM5-80GB"

    plan["best"]["ranks"] = _ranks(s["dp"], s["tp"], s["pp"], s["cp"], place)
    plan["best"].pop("stages")
    return plan


def moe_plan(framework: str, *, dp: int = 8, ep: int = 4, tp: int = 1, zero_stage: int = 1, pp: int = 2) -> dict[str, Any]:
    """``homogeneous_plan`` as Qwen3-30B-A3B (128 experts) under ``framework``: ``pp`` stages (2,
    or 1 over both hosts) of ``dp``·``tp`` ranks, one per host, expert parallelism ``ep``."""
    plan = homogeneous_plan()
    config = Path(__file__).resolve().parents[1] / "costmodel" / "transformer" / "hf_configs" / "qwen3-30b-a3b.json"
    plan["model"] = {"name": "qwen3-30b-a3b", "spec": {"transformer": json.loads(config.read_text())}}
    plan["training"]["framework"] = framework
    s = plan["best"]["strategy"]
    s.update({"dp": dp, "tp": tp, "pp": pp, "cp": 1, "ep": ep, "sequence_parallel": tp > 1, "zero_stage": zero_stage,
              "layers_per_stage": [48 // pp] * pp})
    hosts = ["node7", "node66"]
    per_host = dp * tp * pp // 2
    plan["best"]["ranks"] = _ranks(dp, tp, pp, 1, lambda p, d, c, t: (hosts[((p * dp + d) * tp + t) // per_host],
                                                                       ((p * dp + d) * tp + t) % per_host, "h100", "H100-SXM5-80GB"))
    plan["best"].pop("stages")
    return plan
