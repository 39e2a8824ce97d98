"""Partial sharding (HSDP, ``Strategy.dp_shard``): the ZeRO state sharded over dp_shard·cp ranks
and replicated over dp/dp_shard groups — memory, the per-micro-batch gathers over the shard
group, the replicas' all-reduce, the framework rules and the search (issue 13: "hierarchical vs
flat and HSDP")."""

import json
import shlex
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.comm import Links
from cost_model.errors import InvalidStrategy
from cost_model.frameworks import partial_sharding_violation, pinned_rule_violation
from cost_model.strategy import strategy_from_dict, validate_strategy
from cost_model.topology import shard_axes, zero_replicas, zero_shard_ranks
from cost_model.transformer.layer_cost import StrategyArrays, replica_sync_s
from cost_model.transformer.spec import get_preset, model_from_dict
from helpers.collectives import sharded_step_comm_s

LLAMA8B = model_from_dict({"transformer": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                                           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}})


def _fsdp(gbs: int = 64) -> Training:
    return Training(global_batch_size=gbs, sequence_length=8192, framework="fsdp")


def _state_GB(est) -> float:
    m = est.memory_breakdown_GB[0]
    return m["weights"] + m["gradients"] + m["optimizer_state"]


def test_the_shard_group_is_the_innermost_dp_shard_ranks_and_the_replicas_the_rest():
    S = StrategyArrays.from_strategies([Strategy(dp=32, tp=2, cp=2, zero_stage=3, dp_shard=2), Strategy(dp=32, tp=2, cp=2, zero_stage=3)])
    assert list(zero_shard_ranks(S)) == [4.0, 64.0]  # dp_shard·cp; the whole dp·cp group
    assert list(zero_replicas(S)) == [16.0, 1.0]
    shard, replicas = shard_axes(S)
    (n, stride), = shard
    (r, r_stride), = replicas
    assert list(n) == [4.0, 64.0] and list(stride) == [2.0, 2.0]  # TP ranks between them
    assert list(r) == [16.0, 1.0] and r_stride[0] == 8.0  # one replica per node of 8 GPUs


def test_hsdp_holds_the_state_of_its_shard_group():
    """Weights, gradients and optimizer state per GPU scale with 1/dp_shard, not 1/dp."""
    cluster = simple_cluster("H100-SXM5-80GB", 4)
    full = estimate(LLAMA8B, _fsdp(), cluster, Strategy(dp=32, zero_stage=3, recompute="selective"))
    hsdp = estimate(LLAMA8B, _fsdp(), cluster, Strategy(dp=32, zero_stage=3, recompute="selective", dp_shard=8))
    assert _state_GB(hsdp) == pytest.approx(4 * _state_GB(full), rel=1e-6)
    assert hsdp.peak_memory_GB[0] > full.peak_memory_GB[0]


def test_the_shard_groups_gathers_stay_flat_as_dp_grows_full_sharding_pays_every_hop():
    """Per micro-batch ZeRO-3 traffic: full sharding's rings span every dp rank (n−1 latency steps
    each), HSDP's one node whatever dp is."""
    tr = _fsdp()
    links = Links.for_group(simple_cluster("H100-SXM5-80GB", 64).node_groups[0])
    layer = 2.2e8
    full, hsdp = [], []
    for dp in (32, 128, 512):
        S = StrategyArrays.from_strategies([Strategy(dp=dp, zero_stage=3), Strategy(dp=dp, zero_stage=3, dp_shard=8)])
        t = sharded_step_comm_s(layer, 32, tr, S, links)
        full.append(float(t[0]))
        hsdp.append(float(t[1]))
    assert hsdp[0] == pytest.approx(hsdp[-1]) and hsdp[0] < full[0]
    assert full[-1] > 1.5 * full[0]


def test_the_replicas_all_reduce_their_gradient_shard_across_nodes():
    tr = _fsdp()
    links = Links.for_group(simple_cluster("H100-SXM5-80GB", 4).node_groups[0])
    params = 8e9
    S = StrategyArrays.from_strategies([Strategy(dp=32, zero_stage=3, dp_shard=8), Strategy(dp=32, zero_stage=3, dp_shard=16)])
    two = replica_sync_s(params, tr, S, links)
    # 4 replicas of an 8-way shard vs 2 replicas of a 16-way shard: 2·(R−1)/R·P·2 B/n_s over the NICs
    ratio = (2 * 3 / 4 / 8) / (2 * 1 / 2 / 16)
    assert float(two[0]) / float(two[1]) == pytest.approx(ratio, rel=0.15)
    assert not replica_sync_s(params, tr, StrategyArrays.from_strategies([Strategy(dp=32, zero_stage=3)]), links).any()


def test_fsdp_syncs_replicas_every_micro_batch_the_others_once_per_step():
    """More micro-batches: HSDP under FSDP adds the replicas' all-reduce to each, Megatron's
    partial distributed optimizer (and Paddle) once per step."""
    cluster = simple_cluster("H100-SXM5-80GB", 4)
    model = get_preset("gpt3-1.3b")

    def extra_s(framework: str, zero: int, gbs: int) -> float:
        tr = Training(global_batch_size=gbs, sequence_length=2048, framework=framework)
        s = Strategy(dp=32, micro_batch_size=1, zero_stage=zero)
        return estimate(model, tr, cluster, replace(s, dp_shard=8)).step_time_s - estimate(model, tr, cluster, s).step_time_s

    grow_fsdp = extra_s("fsdp", 2, 256) - extra_s("fsdp", 2, 32)
    grow_megatron = extra_s("megatron-core", 1, 256) - extra_s("megatron-core", 1, 32)
    assert grow_fsdp > 0
    assert abs(grow_megatron) < 0.5 * grow_fsdp


@pytest.mark.parametrize(
    ("framework", "zero", "dp_shard", "reason"),
    [
        ("fsdp", 3, 3, "must divide dp=40"),
        ("fsdp", 0, 8, "zero_stage is 0"),
        ("megatron-core", 3, 8, "exists at zero_stage 1, not 3"),
        ("deepspeed", 3, 8, "MiCS"),
        ("megatron-deepspeed", 3, 8, "was removed"),
        ("paddle", 0, 8, "zero_stage is 0"),
    ],
)
def test_a_partial_sharding_the_framework_cannot_run_names_dp_shard(framework, zero, dp_shard, reason):
    assert reason in (partial_sharding_violation(framework, dp=40, dp_shard=dp_shard, zero_stage=zero) or "")
    training = Training(global_batch_size=80, sequence_length=2048, framework=framework)
    with pytest.raises(InvalidStrategy) as exc:
        estimate(get_preset("gpt3-1.3b"), training, simple_cluster("A100-SXM4-80GB", 5),
                 Strategy(dp=40, micro_batch_size=1, zero_stage=zero, dp_shard=dp_shard))
    assert exc.value.field == "strategy.dp_shard" and reason in str(exc.value)


@pytest.mark.parametrize(("framework", "zero"), [("fsdp", 2), ("fsdp", 3), ("megatron-core", 1), ("paddle", 1), ("paddle", 2), ("paddle", 3)])
def test_every_framework_with_partial_sharding_costs_it(framework, zero):
    training = Training(global_batch_size=64, sequence_length=2048, framework=framework)
    est = estimate(get_preset("gpt3-1.3b"), training, simple_cluster("A100-SXM4-80GB", 2),
                   Strategy(dp=16, micro_batch_size=1, zero_stage=zero, dp_shard=8))
    assert est.step_time_s > 0


def test_dp_shard_equal_to_dp_is_full_sharding():
    training = _fsdp(32)
    cluster = simple_cluster("H100-SXM5-80GB", 2)
    a = estimate(LLAMA8B, training, cluster, Strategy(dp=16, zero_stage=3, dp_shard=16))
    b = estimate(LLAMA8B, training, cluster, Strategy(dp=16, zero_stage=3))
    assert validate_strategy(LLAMA8B, training, Strategy(dp=16, zero_stage=3, dp_shard=16)).dp_shard == 0
    assert a.step_time_s == b.step_time_s


def test_moe_experts_must_split_into_the_replica_groups():
    mixtral = model_from_dict({"transformer": {"model_type": "mixtral", "num_hidden_layers": 8, "hidden_size": 1024,
                                               "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 2048,
                                               "vocab_size": 32000, "num_local_experts": 16, "num_experts_per_tok": 2}})
    training = _fsdp(64)
    cluster = simple_cluster("H100-SXM5-80GB", 2)
    ok = estimate(mixtral, training, cluster, Strategy(dp=16, ep=2, zero_stage=3, dp_shard=8))  # EDP 8 → 4 per replica group
    assert ok.step_time_s > 0
    with pytest.raises(InvalidStrategy) as exc:  # EDP 1 cannot split over 2 replica groups
        estimate(mixtral, training, cluster, Strategy(dp=16, ep=16, zero_stage=3, dp_shard=8))
    assert exc.value.field == "strategy.dp_shard"


def test_dp_shard_is_parsed_and_written_only_when_set():
    assert strategy_from_dict({"dp": 16, "dp_shard": 8}).dp_shard == 8
    assert "dp_shard" not in Strategy(dp=4).to_dict() and Strategy(dp=4, dp_shard=2).to_dict()["dp_shard"] == 2
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(InvalidStrategy) as exc:
            strategy_from_dict({"dp_shard": bad})
        assert exc.value.field == "strategy.dp_shard"


def test_a_pinned_dp_shard_the_framework_cannot_run_is_refused_before_the_search():
    assert pinned_rule_violation("fsdp", {"dp_shard": 8, "zero_stage": 3, "dp": 32}) is None
    assert pinned_rule_violation("megatron-core", {"dp_shard": 8, "zero_stage": 3})[0] == "dp_shard"
    assert pinned_rule_violation("fsdp", {"dp_shard": 3, "dp": 32})[0] == "dp_shard"
    assert pinned_rule_violation("deepspeed", {"dp_shard": 8})[0] == "dp_shard"
    assert pinned_rule_violation("paddle", {"dp_shard": 8, "zero_stage": 0})[0] == "dp_shard"


def test_the_search_offers_node_local_sharding_beside_full_sharding():
    from planner_service.planner.transformer.space import enumerate_space

    S = enumerate_space(LLAMA8B, _fsdp(256), 64, 8, {})
    assert S.dp_shard is not None
    hsdp = S.dp_shard > 0
    assert hsdp.any() and not hsdp.all()
    # node-local shard groups (8/(tp·cp) ranks), only at the framework's partial stages, only past a node
    assert np.all(S.dp_shard[hsdp] * S.tp[hsdp] * S.cp[hsdp] == 8)
    assert np.all(np.isin(S.zero[hsdp], (2, 3))) and np.all(S.dp[hsdp] > S.dp_shard[hsdp])
    pinned = enumerate_space(LLAMA8B, _fsdp(256), 64, 8, {"dp_shard": 4, "zero_stage": 3})
    assert set(np.unique(pinned.dp_shard)) <= {0.0, 4.0} and np.all((pinned.dp_shard == 4) | (pinned.dp == 4))


LLAMA8B_SPEC = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "vocab_size": 128256}


def _plan_body(framework: str, constraints: dict) -> dict:
    return {"model": {"transformer": LLAMA8B_SPEC},
            "training": {"global_batch_size": 64, "sequence_length": 4096, "framework": framework},
            "cluster": {"name": "h100x4", "node_groups": [{"name": "g", "count": 4, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
            "constraints": constraints}


def test_hsdp_over_http_estimate_plan_and_launch_files(client):
    body = _plan_body("fsdp", {})
    body.pop("constraints")
    est = client.post("/v1/estimate", json={**body, "strategy": {"dp": 32, "zero_stage": 3, "recompute": "selective", "dp_shard": 8}})
    full = client.post("/v1/estimate", json={**body, "strategy": {"dp": 32, "zero_stage": 3, "recompute": "selective"}})
    assert est.status_code == 200 and full.status_code == 200, est.text
    assert est.json()["memory_breakdown_GB"][0]["weights"] == pytest.approx(4 * full.json()["memory_breakdown_GB"][0]["weights"], rel=1e-3)
    r = client.post("/v1/plans", json=_plan_body("fsdp", {"dp": 32, "zero_stage": 3, "dp_shard": 8}))
    assert r.status_code == 201, r.text
    assert r.json()["best"]["strategy"]["dp_shard"] == 8
    toml = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "torchtitan"}).json()["files"]["torchtitan.toml"]
    assert "data_parallel_replicate_degree = 4" in toml and "data_parallel_shard_degree = 8" in toml
    paddle = client.post("/v1/plans", json=_plan_body("paddle", {"dp": 32, "zero_stage": 1, "dp_shard": 8}))
    fleet = json.loads(client.get(f"/v1/plans/{paddle.json()['id']}/launch", params={"target": "paddle-fleet"}).json()["files"]["fleet_strategy.json"])
    assert (fleet["hybrid_configs"]["sharding_degree"], fleet["hybrid_configs"]["dp_degree"]) == (8, 4)
    mc = client.post("/v1/plans", json=_plan_body("megatron-core", {"dp": 32, "zero_stage": 1, "dp_shard": 8}))
    args = client.get(f"/v1/plans/{mc.json()['id']}/launch", params={"target": "megatron"}).json()["files"]["megatron_args.sh"]
    words = shlex.split(args[args.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=("): args.rindex(")")])
    assert words[words.index("--num-distributed-optimizer-instances") + 1] == "4"
    bad = client.post("/v1/plans", json=_plan_body("megatron-core", {"zero_stage": 3, "dp_shard": 8}))
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "constraints.dp_shard"


def test_the_cli_estimates_hsdp_and_refuses_a_dp_shard_the_framework_lacks(tmp_path):
    from planner_service.cli.main import _register_all, app

    if not any(getattr(c, "name", None) == "launch" for c in app.registered_commands):
        _register_all()
    req = {**_plan_body("fsdp", {}), "strategy": {"dp": 32, "zero_stage": 3, "dp_shard": 8, "recompute": "selective"}}
    req.pop("constraints")
    (tmp_path / "est.json").write_text(json.dumps(req))
    res = CliRunner().invoke(app, ["estimate", str(tmp_path / "est.json")])
    assert res.exit_code == 0, res.output
    assert "sharded over 8 of the dp ranks (HSDP, 4 replicas)" in " ".join(res.output.split())
    req["training"]["framework"] = "megatron-core"
    (tmp_path / "est.json").write_text(json.dumps(req))
    res = CliRunner().invoke(app, ["estimate", str(tmp_path / "est.json")])
    assert res.exit_code != 0 and "dp_shard" in res.output
