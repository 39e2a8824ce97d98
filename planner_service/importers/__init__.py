"""Cluster importers: formats users already have → the v1 cluster dict.

    from planner_service.importers import import_cluster
    result = import_cluster("nvidia-smi", [("node7.csv", text), ("node7.topo", topo)])
    result.cluster   # {"name", "node_groups": [...], "nodes": [...]}  (cluster_from_dict accepts it)

Formats: ``paddle`` (PaddlePaddle auto-parallel cluster JSON), ``nvidia-smi`` (query CSV,
``-q -x`` XML or ``-L`` list, plus ``topo -m`` per node), ``k8s-nodes`` (``kubectl get nodes -o json`` with GPU Feature Discovery
labels; the network-topology labels become the cluster's ``topology``), ``slurm-topology`` (Slurm
``topology.conf``, tree or block plugin, applied to a v1 cluster JSON: two files).  Malformed input raises :class:`cost_model.errors.InvalidCluster` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cost_model.cluster import cluster_from_dict
from cost_model.errors import InvalidCluster
from planner_service.importers.common import catalog_id_for
from planner_service.importers.k8s_nodes import import_k8s_nodes
from planner_service.importers.nvidia_smi import import_nvidia_smi
from planner_service.importers.paddle import import_paddle
from planner_service.importers.topology import apply_k8s_topology, import_slurm_topology

FORMATS = ("paddle", "nvidia-smi", "k8s-nodes", "slurm-topology")


@dataclass(frozen=True)
class ImportResult:
    cluster: dict[str, Any]
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "warnings": list(self.warnings)}


def import_cluster(fmt: str, sources: Sequence[tuple[str, str]], name: str | None = None) -> ImportResult:
    """Parse ``sources`` (file name, text) in format ``fmt``; validate with ``cluster_from_dict``."""
    if fmt not in FORMATS:
        raise InvalidCluster(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}", field="format")
    if not sources:
        raise InvalidCluster("no input given", field="files")
    warnings: list[str] = []
    if fmt == "nvidia-smi":
        cluster, smi_warnings = import_nvidia_smi(sources, name or "nvidia-smi-cluster")
        warnings += smi_warnings
    elif fmt == "slurm-topology":
        cluster, topo_warnings = import_slurm_topology(sources, name)
        warnings += topo_warnings
    else:
        if len(sources) != 1:
            raise InvalidCluster(f"format {fmt} takes exactly one file, got {len(sources)}", field="files")
        text = sources[0][1]
        if fmt == "paddle":
            cluster = import_paddle(text, name or "paddle-cluster")
        else:
            cluster, skipped = import_k8s_nodes(text, name or "k8s-cluster")
            warnings += [f"skipped node {s}" for s in skipped]
            data = json.loads(text)
            items = [data] if data.get("kind") == "Node" else list(data["items"])
            cluster, topo_warnings = apply_k8s_topology(cluster, [i for i in items if isinstance(i, dict)])
            warnings += topo_warnings
    cluster_from_dict(cluster)  # the importer's output must be a valid v1 cluster
    return ImportResult(cluster=cluster, warnings=tuple(warnings))


__all__ = ["FORMATS", "ImportResult", "catalog_id_for", "import_cluster"]
