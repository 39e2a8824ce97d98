"""Topology above the node: parsing, per-level shares, hierarchical collective surcharges, nesting
orders, and that a cluster without a topology (or with full-bisection levels) costs as before."""

import numpy as np
import pytest

from cost_model import Strategy, Training, estimate, get_preset
from cost_model.cluster import cluster_from_dict
from cost_model.comm import Links
from cost_model.errors import InvalidCluster, InvalidStrategy
from cost_model.strategy import rank_coords, rank_of, strategy_from_dict
from cost_model.topology import (
    NESTINGS,
    HierLinks,
    TopologyLevel,
    alltoall_extra_s,
    domains_spanned,
    hierarchical_collective_extra_s,
    level_shares_GBps,
    links_for_group,
    members_in,
    p2p_extra_s,
)
from cost_model.units import gbps_to_bytes_per_s


def _links(levels_gpus=(32,), shares=(25.0 / 4,), rail=False):
    return HierLinks(intra_GBps=400.0, inter_GBps=25.0, gpus_per_node=8, alpha_s=0.0,
                     level_names=tuple(f"l{i}" for i in range(len(levels_gpus))), level_gpus=levels_gpus, level_GBps=shares,
                     rail_optimized=rail)


def _axes(n, stride):
    return [(np.array([float(n)]), np.array([float(stride)]))]


def test_flat_links_have_no_surcharge():
    flat = Links(intra_GBps=400.0, inter_GBps=25.0, gpus_per_node=8, alpha_s=1e-5)
    ax = _axes(64, 8)
    assert hierarchical_collective_extra_s(flat, ax, 1e9, 2.0)[0] == 0.0
    assert p2p_extra_s(flat, ax, 1e9)[0] == 0.0
    assert alltoall_extra_s(flat, ax, 1e9)[0] == 0.0


def test_members_and_domains_of_a_strided_group():
    # 16 ranks one per node (stride 8 on 8-GPU nodes), pods of 4 nodes = 32 GPUs
    ax = _axes(16, 8)
    assert members_in(8, ax)[0] == 1 and domains_spanned(8, ax)[0] == 16
    assert members_in(32, ax)[0] == 4 and domains_spanned(32, ax)[0] == 4
    # two axes: 2 members at stride 8, then 4 at stride 64: a 32-GPU pod holds 2
    two = [(np.array([2.0]), np.array([8.0])), (np.array([4.0]), np.array([64.0]))]
    assert members_in(32, two)[0] == 2 and domains_spanned(32, two)[0] == 4
    assert members_in(128, two)[0] == 4


def test_hierarchical_allreduce_surcharge_by_hand():
    # k0 = 16 nodes, k1 = 4 pods, r = 1; the pod stage moves 2·(4−1)/16·S at β/4 instead of β
    links = _links()
    S = 1e9
    beta = gbps_to_bytes_per_s(25.0)
    want = 2.0 * (4 - 1) / 16 * S * (4.0 / beta - 1.0 / beta)
    assert hierarchical_collective_extra_s(links, _axes(16, 8), S, 2.0)[0] == pytest.approx(want)
    # reduce-scatter: half
    assert hierarchical_collective_extra_s(links, _axes(16, 8), S, 1.0)[0] == pytest.approx(want / 2)
    # inside one pod: nothing extra; full bisection: nothing extra
    assert hierarchical_collective_extra_s(links, _axes(4, 8), S, 2.0)[0] == 0.0
    assert hierarchical_collective_extra_s(_links(shares=(25.0,)), _axes(16, 8), S, 2.0)[0] == 0.0


def test_p2p_and_alltoall_cross_at_the_slowest_share():
    links = _links(levels_gpus=(32, 128), shares=(25.0 / 2, 25.0 / 14))
    beta = gbps_to_bytes_per_s(25.0)
    # pipeline of 8 stages at stride 32: crosses both levels → the pod share
    assert p2p_extra_s(links, _axes(8, 32), 1e8)[0] == pytest.approx(1e8 * (14.0 / beta - 1.0 / beta))
    # 2 stages at stride 8 stay in one 32-GPU leaf
    assert p2p_extra_s(links, _axes(2, 8), 1e8)[0] == 0.0
    # all-to-all of 16 ranks one per node: 12/16 of the bytes leave a 4-node leaf at β/2,
    # 0 leave the 16-node pod; flat: 15/16 at β
    got = alltoall_extra_s(links, _axes(16, 8), 1e8)[0]
    assert got == pytest.approx(max(12 / 16 * 1e8 * 2 / beta, 15 / 16 * 1e8 / beta) - 15 / 16 * 1e8 / beta)
    assert got > 0


def test_level_shares_divide_by_oversubscription_and_stay_monotone():
    levels = [TopologyLevel(name="leaf", group_size_nodes=16, oversubscription=2.0),
              TopologyLevel(name="pod", group_size_nodes=384, oversubscription=7.0),
              TopologyLevel(name="dc", group_size_nodes=768, bandwidth_GBps=800.0)]
    shares = level_shares_GBps(50.0, 8, levels, 0.9)
    assert shares[0] == pytest.approx(25.0) and shares[1] == pytest.approx(25.0 / 7)
    assert shares[2] == pytest.approx(25.0 / 7)  # 800/8·0.9 = 90 > the pod's share: capped


def _cluster(topology=None, nodes=32):
    body = {"name": "c", "node_groups": [{"name": "g", "count": nodes, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]}
    if topology is not None:
        body["topology"] = topology
    return cluster_from_dict(body)


def test_topology_round_trips_and_reaches_the_links():
    c = _cluster({"levels": [{"name": "leaf", "group_size_nodes": 4}, {"name": "pod", "group_size_nodes": 16, "oversubscription": 7}],
                  "rail_optimized": False})
    assert c.to_dict()["topology"] == {"levels": [{"name": "leaf", "group_size_nodes": 4, "oversubscription": 1.0},
                                                  {"name": "pod", "group_size_nodes": 16, "oversubscription": 7.0}],
                                       "rail_optimized": False}
    assert cluster_from_dict(c.to_dict()).topology == c.topology
    links = links_for_group(c.node_groups[0])
    assert isinstance(links, HierLinks) and links.level_gpus == (32, 128)
    assert links.level_GBps[1] == pytest.approx(links.inter_GBps / 7)
    assert "topology" not in _cluster().to_dict()
    assert type(links_for_group(_cluster().node_groups[0])) is Links


@pytest.mark.parametrize(("topology", "field"), [
    ([], "cluster.topology"),
    ([{"name": "pod", "group_size_nodes": 0}], "cluster.topology[0].group_size_nodes"),
    ([{"name": "pod", "group_size_nodes": 4, "oversubscription": 0.5}], "cluster.topology[0].oversubscription"),
    ([{"name": "leaf", "group_size_nodes": 4}, {"name": "pod", "group_size_nodes": 6}], "cluster.topology[1].group_size_nodes"),
    ([{"name": "pod", "group_size_nodes": 4, "speed": 1}], "cluster.topology[0].speed"),
    ({"levels": [{"name": "pod", "group_size_nodes": 4}], "rail_optimized": "yes"}, "cluster.topology.rail_optimized"),
])
def test_bad_topology_names_the_field(topology, field):
    with pytest.raises(InvalidCluster) as e:
        _cluster(topology)
    assert e.value.field == field


def test_node_domains_are_validated():
    topo = [{"name": "pod", "group_size_nodes": 2}]
    c = cluster_from_dict(
        {"name": "c", "node_groups": [{"name": "g", "count": 2, "device": "H100-SXM5-80GB"}], "topology": topo,
         "nodes": [{"hostname": "g-0", "domains": ["pod-b"]}, {"hostname": "g-1", "domains": ["pod-a"]}]})
    assert c.nodes[0].domains == ("pod-b",)
    with pytest.raises(InvalidCluster) as e:
        cluster_from_dict({"name": "c", "node_groups": [{"name": "g", "count": 2, "device": "H100-SXM5-80GB"}], "topology": topo,
                           "nodes": [{"hostname": "g-0", "domains": ["a", "b"]}]})
    assert e.value.field == "cluster.nodes[0].domains"


def test_rank_of_follows_the_nesting():
    sizes = {"dp": 3, "cp": 2, "tp": 2, "pp": 2}
    for nest in NESTINGS:
        seen = set()
        for r in range(24):
            c = rank_coords(r, nesting=nest, **sizes)
            assert rank_of(c.pp, c.dp, c.cp, c.tp, nesting=nest, **sizes) == r
            seen.add(c)
        assert len(seen) == 24
    # tp, cp, pp, dp: consecutive ranks walk tp, then cp, then the pipeline
    assert rank_coords(4, nesting=("tp", "cp", "pp", "dp"), **sizes) == (1, 0, 0, 0)
    assert rank_of(1, 0, 0, 0, dp=3, cp=2, tp=2) == 12  # Megatron: stage 1 after every dp·cp·tp rank of stage 0


def test_nesting_parses_and_is_omitted_when_megatron():
    assert strategy_from_dict({"nesting": ["tp", "cp", "dp", "pp"]}).nesting is None
    s = strategy_from_dict({"nesting": ["tp", "cp", "pp", "dp"]})
    assert s.nesting == ("tp", "cp", "pp", "dp") and s.to_dict()["nesting"] == ["tp", "cp", "pp", "dp"]
    assert "nesting" not in Strategy().to_dict()
    with pytest.raises(InvalidStrategy) as e:
        strategy_from_dict({"nesting": ["cp", "tp", "dp", "pp"]})
    assert e.value.field == "strategy.nesting"


LLAMA = get_preset("llama3-70b")
TRAIN = Training(global_batch_size=256, sequence_length=4096)
LAYOUT = Strategy(dp=8, tp=8, pp=4, micro_batch_size=2, sequence_parallel=True, zero_stage=1)


def test_full_bisection_topology_costs_exactly_as_flat():
    flat = estimate(LLAMA, TRAIN, _cluster(), LAYOUT)
    topo = estimate(LLAMA, TRAIN, _cluster([{"name": "leaf", "group_size_nodes": 4}, {"name": "pod", "group_size_nodes": 16}]), LAYOUT)
    assert topo.step_time_s == flat.step_time_s
    assert topo.breakdown_s == flat.breakdown_s


def test_oversubscription_slows_a_group_that_crosses_pods():
    steps = [estimate(LLAMA, TRAIN, _cluster([{"name": "pod", "group_size_nodes": 4, "oversubscription": o}]), LAYOUT).step_time_s
             for o in (1.0, 4.0, 16.0)]
    assert steps[0] < steps[1] < steps[2]
    # pods of 8 nodes hold a whole dp·tp block: only the pipeline crosses, far cheaper
    inside = estimate(LLAMA, TRAIN, _cluster([{"name": "pod", "group_size_nodes": 8, "oversubscription": 16.0}]), LAYOUT).step_time_s
    assert inside < steps[2]


def test_nesting_changes_which_group_crosses_the_pod():
    c = _cluster([{"name": "pod", "group_size_nodes": 8, "oversubscription": 16.0}])
    megatron = estimate(LLAMA, TRAIN, c, LAYOUT)
    dp_outer = estimate(LLAMA, TRAIN, c, Strategy(**{**LAYOUT.__dict__, "nesting": ("tp", "cp", "pp", "dp")}))
    # Megatron's order keeps each 64-GPU dp·tp group in one 64-GPU pod; dp outermost spreads it
    assert dp_outer.breakdown_s["dp_comm_exposed"] > megatron.breakdown_s["dp_comm_exposed"]
    assert dp_outer.step_time_s > megatron.step_time_s


@pytest.mark.parametrize(("tp", "dp", "ep", "etp"), [(2, 8, 8, 0), (2, 8, 8, 1), (2, 16, 32, 0), (4, 8, 16, 2), (8, 4, 1, 1)])
def test_expert_groups_placed_by_a_nesting_order_match_megatrons_order(tp, dp, ep, etp):
    """The expert groups of a layout placed by a nesting order (here Megatron's own, written
    out) sit as the Megatron-order formula puts them — ETP innermost, then EP, then EDP —
    under parallel folding (ep spanning tensor ranks) and a pinned ETP alike."""
    from dataclasses import replace

    from cost_model.topology import expert_axes, group_size
    from cost_model.transformer.layer_cost import StrategyArrays
    from cost_model.transformer.moe import expert_data_parallel, expert_tensor_parallel

    S = StrategyArrays.from_strategies([Strategy(dp=dp, tp=tp, ep=ep, etp=etp)])
    e = float(expert_tensor_parallel(tp, 1, dp, ep, etp))
    ep_axes, edp_axes = expert_axes(replace(S, nest=np.zeros(1)))
    assert float(group_size(ep_axes)[0]) == ep and float(group_size(edp_axes)[0]) == float(expert_data_parallel(tp, 1, dp, ep, etp))
    for gpus in (1, 2, 4, 8, 16, 64):
        assert float(members_in(gpus, ep_axes)[0]) == float(members_in(gpus, [(np.array([float(ep)]), np.array([e]))])[0]), gpus
        assert float(members_in(gpus, edp_axes)[0]) == float(
            members_in(gpus, [(expert_data_parallel(tp, 1, dp, ep, etp), np.array([e * ep]))])[0]), gpus
