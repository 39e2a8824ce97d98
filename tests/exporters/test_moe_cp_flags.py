"""Megatron-LM flags carry the MoE and context-parallel choices the plan was costed with
(cost_model.transformer.moe / context_parallel): the token dispatcher, EP overlap, capacity
factor, expert tensor parallelism under EP folding, and the CP exchange type."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cost_model.errors import InvalidInput
from cost_model.training import training_from_dict
from helpers.plans import _ranks, cp_plan, homogeneous_plan
from planner_service.exporters import LaunchParams, render
from planner_service.exporters.frameworks import megatron_reference

CONFIGS = Path(__file__).resolve().parents[1] / "costmodel" / "transformer" / "hf_configs"
PARAMS = LaunchParams(image="img", command="pretrain_gpt.py", smoke_test=False)


def words(training: dict, **strategy: int) -> list[str]:
    """The MEGATRON_ARGS words of a Qwen3-30B-A3B plan with ``training`` and ``strategy`` over it."""
    plan = homogeneous_plan()
    plan["model"] = {"name": "m", "spec": {"transformer": json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())}}
    plan["training"].update(training)
    plan["best"]["strategy"].update(strategy)
    s = plan["best"]["strategy"]
    s["layers_per_stage"] = [48 // s["pp"]] * s["pp"]
    hosts = ["node7", "node66"]
    plan["best"]["ranks"] = _ranks(s["dp"], s["tp"], s["pp"], s["cp"],
                                   lambda p, d, c, t: (hosts[p], (d * s["cp"] + c) * s["tp"] + t, "h100", "H100-SXM5-80GB"))
    plan["best"].pop("stages")
    text = render(plan, "megatron", PARAMS).files["megatron_args.sh"]
    return shlex.split(text[text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=("): text.rindex(")")])


def flags(training: dict, **strategy: int) -> dict[str, str | None]:
    ws = words(training, **strategy)
    out: dict[str, str | None] = {}
    for i, w in enumerate(ws):
        if w.startswith("--"):
            nxt = ws[i + 1] if i + 1 < len(ws) else None
            out[w] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def test_default_dispatcher_is_written_because_megatron_defaults_to_allgather():
    f = flags({}, ep=2)
    assert f["--moe-token-dispatcher-type"] == "alltoall"
    assert "--expert-tensor-parallel-size" not in f and "--cp-comm-type" not in f


def test_deepep_overlap_capacity_and_folding():
    # the EP overlap with no pipeline (with one it needs vpp ≥ 2: cost_model.frameworks.moe_overlap_layout_violation)
    f = flags({"moe_token_dispatcher": "deepep", "moe_comm_overlap": True}, ep=8, pp=1)  # dp 2 · tp 4
    assert f["--moe-token-dispatcher-type"] == "flex" and "--moe-enable-deepep" in f
    assert "--overlap-moe-expert-parallel-comm" in f and "--moe-expert-capacity-factor" not in f
    assert f["--expert-tensor-parallel-size"] == "1"  # ep 8 does not divide dp·cp = 2: folded across TP
    known = megatron_reference()
    assert all(k in known for k in f)
    # a capacity factor with the alltoall dispatcher, padded as costed (DeepEP cannot pad: refused at the request)
    f = flags({"moe_capacity_factor": 1.25}, ep=2)
    assert f["--moe-expert-capacity-factor"] == "1.25" and "--moe-pad-expert-input-to-capacity" in f
    assert all(k in known for k in f)


def test_a_pinned_expert_tensor_parallelism_is_written_as_costed():
    """strategy.etp under tp 4: written when it differs from tp (Megatron's default), one of
    Megatron's own flags; a pinned etp equal to tp writes nothing."""
    f = flags({}, ep=2, etp=1)
    assert f["--expert-tensor-parallel-size"] == "1" and all(k in megatron_reference() for k in f)
    assert "--expert-tensor-parallel-size" not in flags({}, ep=2, etp=4)


def test_cp_comm_type_only_when_not_the_ring():
    assert flags({"cp_comm_type": "a2a"}, cp=2, dp=1)["--cp-comm-type"] == "a2a"
    # Transformer Engine's name for the K/V all-gather exchange ("allgather" fails at the first forward)
    assert flags({"cp_comm_type": "allgather"}, cp=2, dp=1)["--cp-comm-type"] == "all_gather"
    assert "--cp-comm-type" not in flags({}, cp=2, dp=1)


def test_hierarchical_cp_writes_both_levels_as_megatron_parses_them():
    # a2a+p2p: the all-to-all level (cp_a2a_size) and the ring's, as --hierarchical-context-parallel-sizes A P
    from helpers.megatron_args import parse_as_megatron

    args = parse_as_megatron(words({"cp_comm_type": "a2a+p2p", "cp_a2a_size": 2}, cp=4, dp=1))
    assert args.cp_comm_type == ["a2a+p2p"] and args.hierarchical_context_parallel_sizes == [2, 2]
    assert args.context_parallel_size == 4
    assert "--hierarchical-context-parallel-sizes" not in flags({"cp_comm_type": "a2a"}, cp=4, dp=1)


def test_deepspeed_context_parallelism_launches_as_ulysses():
    """Under DeepSpeed's engine cp is DeepSpeed-Ulysses: no Megatron-LM --context-parallel-size
    (Megatron-DeepSpeed has none), its degree named in the notes of both launch targets."""
    plan = cp_plan("megatron-deepspeed", pp=1)
    art = render(plan, "megatron", PARAMS)
    assert "--context-parallel-size" not in art.files["megatron_args.sh"] and "--cp-comm-type" not in art.files["megatron_args.sh"]
    assert any("--ds-sequence-parallel-size 4" in n for n in art.notes)
    art = render(plan, "deepspeed-config", PARAMS)
    assert any("DeepSpeed-Ulysses" in n for n in art.notes)
    assert json.loads(art.files["ds_config.json"])["train_micro_batch_size_per_gpu"] >= 1


def test_torchtitan_context_parallelism_is_its_all_gather():
    # torchtitan 0.3 has one exchange (no rotate-method option): what fsdp costs by default
    plan = cp_plan("fsdp")
    assert "rotate" not in render(plan, "torchtitan", PARAMS).files["torchtitan.toml"]
    assert training_from_dict({"global_batch_size": 8, "sequence_length": 4096, "framework": "fsdp"}).cp_exchange == "allgather"
    with pytest.raises(InvalidInput) as exc:
        training_from_dict({"global_batch_size": 8, "sequence_length": 4096, "framework": "fsdp", "cp_comm_type": "p2p"})
    assert exc.value.field == "training.cp_comm_type"


def test_fsdp_ulysses_is_costed_and_torchtitan_refuses_to_launch_it():
    """verl's FSDP trainers run Ulysses (the a2a exchange) beside FSDP: a plan priced so is not a
    torchtitan launch — torchtitan would all-gather K/V instead — so that target refuses it,
    naming the setting that runs it; torchrun (the trainer's own script) launches it."""
    assert training_from_dict({"global_batch_size": 8, "sequence_length": 4096, "framework": "fsdp",
                               "cp_comm_type": "a2a"}).cp_exchange == "a2a"
    plan = cp_plan("fsdp", pp=1, cp_comm_type="a2a")
    with pytest.raises(InvalidInput) as exc:
        render(plan, "torchtitan", PARAMS)
    assert exc.value.field == "target" and "ulysses_sequence_parallel_size=4" in str(exc.value)
    assert "launch_torchrun.sh" in render(plan, "torchrun", PARAMS).files


def test_deepspeed_ring_attention_is_the_all_gather_and_its_launch_says_so():
    """Trainers on DeepSpeed alone (OpenRLHF's --ring_attn_size, axolotl's sequence_parallel_degree)
    run ring-flash-attn's K/V all-gather; Megatron-DeepSpeed's sequence parallelism stays Ulysses."""
    plan = cp_plan("deepspeed", pp=1, cp_comm_type="allgather")
    art = render(plan, "deepspeed-config", PARAMS)
    assert any("ring_attn_size 4" in n for n in art.notes) and not any("Ulysses" in n for n in art.notes)
    assert any("DeepSpeed-Ulysses" in n for n in render(cp_plan("deepspeed", pp=1), "deepspeed-config", PARAMS).notes)
    # ring-flash-attn's zigzag ring (EasyContext, 360-LLaMA-Factory on ZeRO-3): the p2p exchange, said so
    ring = render(cp_plan("deepspeed", pp=1, cp_comm_type="p2p"), "deepspeed-config", PARAMS).notes
    assert any("zigzag_ring_flash_attn" in n for n in ring) and not any("Ulysses" in n for n in ring)
    with pytest.raises(InvalidInput) as exc:
        training_from_dict({"global_batch_size": 8, "sequence_length": 4096, "framework": "megatron-deepspeed", "cp_comm_type": "allgather"})
    assert exc.value.field == "training.cp_comm_type" and "a2a" in str(exc.value)


def test_fp4_training_launches_transformer_engine_nvfp4():
    """A plan costed with ``dtype: fp4`` launches Megatron-LM with Transformer Engine's NVFP4
    recipe (``--fp4-format e2m1 --fp4-recipe nvfp4``, BF16 elsewhere), options Megatron-LM has."""
    f = flags({"dtype": "fp4"})
    assert f["--fp4-format"] == "e2m1" and f["--fp4-recipe"] == "nvfp4"
    assert "--bf16" in f and "--fp8-format" not in f
    ref = megatron_reference()
    assert "--fp4-format" in ref and "nvfp4" in ref["--fp4-recipe"]["choices"]
