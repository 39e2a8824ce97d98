"""GB200/GB300 NVL72 in the device catalog: the rack is one 72-GPU NVLink domain."""

import pytest

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.cluster import cluster_from_dict
from cost_model.devices import get_device
from cost_model.errors import InvalidCluster
from cost_model.transformer.spec import get_preset


@pytest.mark.parametrize(("name", "memory_GB"), [("GB200-NVL72-186GB", 186), ("GB300-NVL72-288GB", 288)])
def test_nvl72_devices_are_blackwell_with_a_72_gpu_nvlink_domain(name, memory_GB):
    dev = get_device(name)
    assert dev.family == "blackwell"
    assert dev.gpus_per_node == 72
    assert dev.memory_GB == memory_GB
    assert dev.intra_node_bandwidth_GBps == 900  # NVLink 5: 1.8 TB/s bidirectional
    assert dev.fp8_tflops == 2 * dev.bf16_tflops
    assert get_device(name.split("-")[0].lower()) is dev  # alias "gb200" / "gb300"


def test_a_node_group_defaults_to_the_rack_and_may_not_exceed_it():
    c = cluster_from_dict({"name": "r", "node_groups": [{"name": "g", "count": 2, "device": "GB200-NVL72-186GB"}]})
    assert c.node_groups[0].gpus_per_node == 72
    assert c.node_groups[0].nic_per_gpu_GBps == pytest.approx(50.0)  # one 400 Gb/s ConnectX-7 per GPU
    with pytest.raises(InvalidCluster) as err:
        cluster_from_dict({"name": "r", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 73, "device": "GB200-NVL72-186GB"}]})
    assert err.value.field.endswith("gpus_per_node")


def test_tensor_parallel_16_inside_the_rack_runs_over_nvlink():
    """tp=16 on 8-GPU HGX B200 nodes crosses the NICs; on an NVL72 rack it stays on NVLink (GPT-3
    175B: 96 heads, each its own key/value head, so Megatron-Core splits them 16 ways).  A DGX
    B200 node's eight 400 Gb/s NICs carry 400 GB/s out of the node against NVLink 5's 900 GB/s per
    GPU inside the rack, so the rack's TP traffic takes well under the nodes' (at most 2/3: the
    collectives' latency terms do not shrink with the link rate)."""
    model = get_preset("gpt3-175b")
    t = Training(global_batch_size=64, sequence_length=8192)
    s = Strategy(tp=16, dp=4, micro_batch_size=1, sequence_parallel=True)
    rack = estimate(model, t, simple_cluster("GB200-NVL72-186GB", 1, gpus_per_node=64), s)
    hgx = estimate(model, t, simple_cluster("B200-SXM-192GB", 8), s)
    assert rack.breakdown_s["tp_comm"] < 2 / 3 * hgx.breakdown_s["tp_comm"]


@pytest.mark.parametrize(("gpus_per_node", "count", "warned"), [(4, 4, True), (8, 2, True), (4, 1, False), (64, 2, False), (72, 2, False)])
def test_nvl72_trays_described_as_nodes_are_warned(gpus_per_node, count, warned):
    """A node is an NVLink domain: NVL72 compute trays (4 GPUs) given as nodes price the rack's
    NVLink traffic over the NICs, which the estimate says (one node, or whole racks: nothing to say)."""
    c = cluster_from_dict({"name": "r", "node_groups": [{"name": "g", "count": count, "gpus_per_node": gpus_per_node,
                                                        "device": "GB200-NVL72-186GB"}]})
    est = estimate(get_preset("llama3-8b"), Training(global_batch_size=1152, sequence_length=4096), c,
                   Strategy(dp=gpus_per_node * count, zero_stage=1))
    notes = [w for w in est.warnings if "NVLink domain is its rack" in w]
    assert bool(notes) == warned
    if warned:
        assert f"{gpus_per_node} GPUs a node" in notes[0] and "gpus_per_node up to 72" in notes[0]
    hgx = estimate(get_preset("llama3-8b"), Training(global_batch_size=64, sequence_length=4096),
                   simple_cluster("H100-SXM5-80GB", 4, gpus_per_node=4), Strategy(dp=16, zero_stage=1))
    assert not any("NVLink domain is its rack" in w for w in hgx.warnings)
