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
