"""Context-parallel exchange (cost_model/transformer/context_parallel.py): the ring hides behind
attention when compute dominates, CP = 1 costs nothing, windows shorten the ring, and long
sequences grow attention quadratically (causal: half the square)."""

from dataclasses import replace

import pytest

from cost_model import Strategy, Training
from cost_model.comm import Links, allgather_time_s, alltoall_time_s, p2p_time_s
from cost_model.devices import get_device
from cost_model.errors import InvalidTraining
from cost_model.training import training_from_dict
from cost_model.transformer import context_parallel as cpm
from cost_model.transformer.layer_cost import StrategyArrays, layer_costs
from cost_model.transformer.spec import get_preset

LINKS = Links(intra_GBps=350.0, inter_GBps=44.0, gpus_per_node=8, alpha_s=8e-6)
H100 = get_device("H100-SXM5-80GB")


def test_ring_is_hidden_when_each_block_of_attention_outlasts_its_transfer():
    kv = 64e6
    comm = float(p2p_time_s(kv, LINKS, False))
    fwd, bwd = cpm.ring_exchange_exposed_s(kv, 3.0, LINKS, False, attn_fwd_s=40 * comm, attn_bwd_s=100 * comm, overlap=1.0)
    assert float(fwd) == 0.0
    assert float(bwd) == pytest.approx(comm, rel=1e-12)  # only the finished dK,dV's hop home


def test_ring_exposes_the_transfer_minus_each_block_when_communication_dominates():
    kv, steps = 64e6, 7.0
    comm = float(p2p_time_s(kv, LINKS, True))
    attn = 0.5 * comm * (steps + 1)  # each block is half a transfer
    fwd, _ = cpm.ring_exchange_exposed_s(kv, steps, LINKS, True, attn_fwd_s=attn, attn_bwd_s=2.5 * attn, overlap=1.0)
    assert float(fwd) == pytest.approx(steps * 0.5 * comm, rel=1e-12)


def test_cp1_costs_nothing_for_every_exchange():
    for kind in ("p2p", "allgather", "a2a"):
        f, b = cpm.cp_layer_comm_s(kind, cp=1.0, tp=8.0, local_seq=8192.0, window=8192.0, kv_block_bytes=1e7, qkv_bytes=1e8,
                                   out_bytes=1e8, links=LINKS, attn_fwd_s=1e-3, attn_bwd_s=2.5e-3, overlap=1.0)
        assert float(f) == 0.0 and float(b) == 0.0


def test_allgather_and_a2a_are_their_collectives_and_exposed():
    f, b = cpm.cp_layer_comm_s("allgather", cp=4.0, tp=2.0, local_seq=4096.0, window=16384.0, kv_block_bytes=1e7, qkv_bytes=3e7,
                               out_bytes=1e7, links=LINKS, attn_fwd_s=1.0, attn_bwd_s=1.0, overlap=1.0)
    assert float(f) == pytest.approx(float(allgather_time_s(4.0, 4e7, LINKS, 4.0)), rel=1e-12) and float(b) == float(f)
    f, _ = cpm.cp_layer_comm_s("a2a", cp=4.0, tp=2.0, local_seq=4096.0, window=16384.0, kv_block_bytes=1e7, qkv_bytes=3e7,
                               out_bytes=1e7, links=LINKS, attn_fwd_s=1.0, attn_bwd_s=1.0, overlap=1.0)
    assert float(f) == pytest.approx(float(alltoall_time_s(4.0, 3e7, LINKS, 4.0) + alltoall_time_s(4.0, 1e7, LINKS, 4.0)), rel=1e-12)


def test_a_sliding_window_needs_only_the_blocks_it_reaches():
    assert float(cpm.ring_steps(8.0, 4096.0, 32768.0)) == 7.0
    assert float(cpm.ring_steps(8.0, 4096.0, 4096.0)) == 1.0
    assert float(cpm.ring_steps(8.0, 4096.0, 6000.0)) == 2.0
    assert float(cpm.ring_steps(1.0, 4096.0, 4096.0)) == 0.0


@pytest.mark.parametrize("seq", [16384, 32768, 65536, 131072])
def test_long_context_attention_grows_quadratically_and_the_ring_hides_at_cp8(seq):
    model = get_preset("llama3-70b")
    tr = Training(global_batch_size=8, sequence_length=seq)
    lc = layer_costs(model, tr, H100, LINKS, StrategyArrays.from_strategies([Strategy(tp=8, cp=8, dp=1, sequence_parallel=True)]))
    lc2 = layer_costs(model, replace(tr, sequence_length=2 * seq), H100, LINKS,
                      StrategyArrays.from_strategies([Strategy(tp=8, cp=8, dp=1, sequence_parallel=True)]))
    # attention FLOPs per GPU: 4·(s/c)·s·d per head → ×4 when s doubles
    a, a2 = float(lc.model_flops[0]), float(lc2.model_flops[0])
    assert a2 > 2.0 * a
    # at 64k+ tokens the blocks of attention outlast the K,V transfers (GQA: 8 KV heads)
    if seq >= 65536:
        ring_only = float(lc.cp_comm_s[0])
        kv_block = 2 * (seq / 8) * 128 * 2  # one KV head per TP rank, 16-bit
        assert ring_only == pytest.approx(float(p2p_time_s(kv_block, LINKS, True)), rel=1e-9)


def test_cp_comm_type_is_validated_with_the_field():
    assert training_from_dict({"global_batch_size": 8, "sequence_length": 128, "cp_comm_type": "a2a"}).cp_comm_type == "a2a"
    with pytest.raises(InvalidTraining) as e:
        training_from_dict({"global_batch_size": 8, "sequence_length": 128, "cp_comm_type": "ring"})
    assert e.value.field == "training.cp_comm_type"


def test_hierarchical_cp_is_the_all_to_all_inside_the_ring_over_the_rest():
    """a2a+p2p at cp 8 with an all-to-all level of 4: the all-to-all of Q, K, V and of the output
    over the 4 adjacent CP ranks (tp 2: one node), then the ring over the 2 groups — each rank
    holding 4·sc tokens of a quarter of the heads, a K,V block of the same bytes, one step."""
    common = dict(cp=8.0, tp=2.0, local_seq=4096.0, window=32768.0, kv_block_bytes=1e7, qkv_bytes=3e7, out_bytes=1e7, links=LINKS,
                  attn_fwd_s=1e-6, attn_bwd_s=2.5e-6, overlap=1.0)
    f, b = cpm.cp_layer_comm_s("a2a+p2p", a2a_size=4.0, **common)
    a2a = float(alltoall_time_s(4.0, 3e7, LINKS, 4.0) + alltoall_time_s(4.0, 1e7, LINKS, 4.0))
    ring_f, ring_b = cpm.ring_exchange_exposed_s(1e7, 1.0, LINKS, True, 1e-6, 2.5e-6, 1.0)
    assert float(f) == pytest.approx(a2a + float(ring_f), rel=1e-12) and float(b) == pytest.approx(a2a + float(ring_b), rel=1e-12)
    # an all-to-all level of the whole group is the plain all-to-all; of 1, the plain ring
    assert float(cpm.cp_layer_comm_s("a2a+p2p", a2a_size=8.0, **common)[0]) == pytest.approx(float(cpm.cp_layer_comm_s("a2a", **common)[0]))
    assert float(cpm.cp_layer_comm_s("a2a+p2p", a2a_size=1.0, **common)[0]) == pytest.approx(float(cpm.cp_layer_comm_s("p2p", **common)[0]))


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"cp_comm_type": "a2a+p2p"}, "training.cp_a2a_size", "is required with cp_comm_type a2a+p2p"),
    ({"cp_comm_type": "a2a", "cp_a2a_size": 2}, "training.cp_a2a_size", "leave it out"),
    ({"cp_comm_type": "a2a+p2p", "cp_a2a_size": 1}, "training.cp_a2a_size", "from 2 to 1024"),
    ({"framework": "fsdp", "cp_comm_type": "a2a+p2p", "cp_a2a_size": 2}, "training.cp_comm_type", "no 'a2a+p2p'"),
])
def test_hierarchical_cp_is_refused_by_field_where_half_stated(body, field, words):
    with pytest.raises(InvalidTraining) as e:
        training_from_dict({"global_batch_size": 8, "sequence_length": 8192, **body})
    assert e.value.field == field and words in e.value.message


def test_hierarchical_cp_levels_must_divide_cp_and_the_heads():
    from cost_model import estimate, simple_cluster
    from cost_model.errors import InvalidStrategy

    model, cluster = get_preset("llama3-8b"), simple_cluster("H100-SXM5-80GB", 2)
    tr = training_from_dict({"global_batch_size": 8, "sequence_length": 65536, "cp_comm_type": "a2a+p2p", "cp_a2a_size": 4})
    est = estimate(model, tr, cluster, Strategy(tp=2, cp=8, dp=1, sequence_parallel=True, recompute="full"))
    assert est.breakdown_s["cp_comm"] > 0.0
    wide = training_from_dict({**tr.to_dict(), "cp_a2a_size": 8})
    for training, strategy, says in ((tr, Strategy(tp=2, cp=2, dp=1, sequence_parallel=True), "4 does not divide 2"),
                                     (wide, Strategy(tp=8, cp=8, dp=1, sequence_parallel=True), "tp·cp_a2a_size = 64 does not divide the 32")):
        with pytest.raises(InvalidStrategy) as e:
            estimate(model, training, simple_cluster("H100-SXM5-80GB", 8), strategy)
        assert e.value.field == "strategy.cp" and says in e.value.message


def test_the_search_keeps_hierarchical_cp_to_multiples_of_its_all_to_all_level():
    from planner_service.planner import SolverSettings, plan
    from planner_service.planner.request import parse_plan_request

    body = {"model": {"preset": "llama3-8b"},
            "training": {"global_batch_size": 8, "sequence_length": 131072, "cp_comm_type": "a2a+p2p", "cp_a2a_size": 4},
            "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 4, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
            "top_k": 5}
    result = plan(parse_plan_request(body), SolverSettings())
    cps = [c.strategy.cp for c in (result.best, *result.alternatives)]
    assert max(cps) > 1 and all(cp == 1 or cp % 4 == 0 for cp in cps), cps
