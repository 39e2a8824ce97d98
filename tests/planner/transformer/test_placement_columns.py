"""Placement by nesting order read from its arrays: the stages' host lists and the rank columns
are exactly what the row-by-row paths (``stage_blocks``, ``place_ranks``) give, for several
nesting orders, with lost nodes and uneven pods."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cost_model.cluster import cluster_from_dict
from cost_model.strategy import Strategy, even_split
from planner_service.planner.placement import place_ranks, rank_columns, stage_blocks, stage_entries
from planner_service.planner.transformer.search import normalise_cluster
from planner_service.storage.rank_table import RankTable

CLUSTER = {"name": "c", "node_groups": [{"name": "g", "count": 22, "gpus_per_node": 4, "device": "H100-SXM5-80GB"}],
           "nodes": [{"hostname": "g-3", "available": False}, {"hostname": "g-12", "available": False}],
           "topology": [{"name": "leaf", "group_size_nodes": 3, "oversubscription": 2.0},
                        {"name": "pod", "group_size_nodes": 6, "oversubscription": 4.0}]}


class _Stage:
    def __init__(self, i):
        self.i = i

    def to_dict(self):
        return {"stage": self.i}


class _Est:
    def __init__(self, pp):
        self.stages = [_Stage(i) for i in range(pp)]


@pytest.mark.parametrize(("tp", "cp", "dp", "pp", "nesting"), [
    (4, 1, 4, 4, None), (4, 1, 20, 1, None), (2, 2, 2, 4, ("tp", "dp", "cp", "pp")), (4, 2, 1, 8, ("tp", "pp", "cp", "dp")), (1, 1, 2, 2, None),
])
def test_array_paths_equal_the_row_paths(tp, cp, dp, pp, nesting):
    cluster = normalise_cluster(cluster_from_dict(CLUSTER), None)
    s = Strategy(tp=tp, cp=cp, dp=dp, pp=pp, layers_per_stage=even_split(pp * 2, pp) if pp > 1 else None)
    if nesting is not None:
        s = replace(s, nesting=nesting)
    groups = (cluster.node_groups[0].name,) * pp
    entries = stage_entries(cluster, s, groups, _Est(pp))
    for entry, block in zip(entries, stage_blocks(cluster, s, groups), strict=True):
        assert entry["hosts"] == list(dict.fromkeys(h for h, _ in block))
        assert entry["gpus"] == ([[h, g] for h, g in block] if len(block) <= 64 else None)
        assert entry["num_gpus"] == len(block)
    columns = rank_columns(cluster, s, groups)
    assert columns is not None
    table = RankTable(tuple(columns), columns, len(columns["rank"]))
    assert table.rows() == place_ranks(cluster, s, groups)
