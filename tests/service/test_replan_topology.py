"""A replan on a cluster with a topology keeps every node in its leaf and pod: positional domains
are written out before the sticky host order reorders host names."""

from cost_model.cluster import cluster_from_dict
from planner_service.service.replan import apply_cluster_changes, pin_topology_domains, sticky_host_order

CLUSTER = {"name": "c", "node_groups": [{"name": "g", "count": 8, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}],
           "topology": [{"name": "pod", "group_size_nodes": 4, "oversubscription": 4.0}]}


def test_domains_survive_the_sticky_order():
    changed = apply_cluster_changes(CLUSTER, ["g-1"], [])
    parent_ranks = [{"rank": k * 8, "host": f"g-{k}"} for k in range(4)]  # the parent used pod 0 only
    pinned = pin_topology_domains(changed)
    out = sticky_host_order(pinned, parent_ranks)
    c = cluster_from_dict(out)
    domains = {n.hostname: n.domains for n in c.nodes}
    # the spare g-4 takes g-1's slot in the host order but stays in pod 1
    assert c.node_groups[0].hostnames[1] == "g-4"
    assert domains["g-4"] == ("pod-1",) and domains["g-0"] == ("pod-0",) and domains["g-1"] == ("pod-0",)
    assert not next(n for n in c.nodes if n.hostname == "g-1").available


def test_flat_clusters_are_untouched():
    flat = {k: v for k, v in CLUSTER.items() if k != "topology"}
    assert pin_topology_domains(flat) == flat
