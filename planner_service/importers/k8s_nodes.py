"""``kubectl get nodes -o json`` with GPU Feature Discovery labels → v1 cluster.

Labels read (NVIDIA k8s-device-plugin GFD README; docs/integration.md §1.5, §6):
``nvidia.com/gpu.product`` (e.g. ``NVIDIA-H100-80GB-HBM3``; a ``-MIG-…`` suffix means MIG
slices, which are skipped), ``nvidia.com/gpu.count`` (else ``status.allocatable["nvidia.com/gpu"]``),
``nvidia.com/gpu.memory`` (MiB), ``nvidia.com/cuda.driver.major/minor/rev`` (driver version;
older GFD: ``cuda.driver-version.*``), ``nvidia.com/cuda.runtime.major/minor`` (CUDA version).
The host name is the node's ``metadata.name`` (what ``spec.nodeName`` and the
``kubernetes.io/hostname`` label carry on standard clusters).  A node that is not Ready or is
cordoned (``spec.unschedulable``) is imported as unavailable.  Nodes without GPU labels are
skipped (control plane, CPU pools) and reported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cost_model.errors import InvalidCluster
from planner_service.importers.common import NodeRecord, catalog_id_for, group_nodes


def _version(labels: Mapping[str, str], prefix: str, parts: tuple[str, ...]) -> str | None:
    values = [labels.get(f"{prefix}.{p}") for p in parts]
    if values[0] is None:
        return None
    return ".".join(v for v in values if v is not None)


def import_k8s_nodes(text: str, name: str = "k8s-cluster") -> tuple[dict[str, Any], list[str]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidCluster(f"is not JSON: {exc.msg} at line {exc.lineno}", field="k8s") from None
    if isinstance(data, Mapping) and data.get("kind") == "Node":
        items = [data]
    elif isinstance(data, Mapping) and isinstance(data.get("items"), list):
        items = data["items"]
    else:
        raise InvalidCluster("must be a NodeList (kubectl get nodes -o json) or one Node", field="k8s")
    records: list[NodeRecord] = []
    skipped: list[str] = []
    for i, node in enumerate(items):
        path = f"k8s.items[{i}]"
        if not isinstance(node, Mapping) or not isinstance(node.get("metadata"), Mapping):
            raise InvalidCluster("must be a Node object with metadata", field=path)
        meta = node["metadata"]
        host = meta.get("name")
        if not isinstance(host, str) or not host:
            raise InvalidCluster("needs metadata.name", field=f"{path}.metadata.name")
        labels = meta.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise InvalidCluster("must be an object", field=f"{path}.metadata.labels")
        product = labels.get("nvidia.com/gpu.product")
        status = node.get("status") if isinstance(node.get("status"), Mapping) else {}
        if not product:
            skipped.append(f"{host}: no nvidia.com/gpu.product label (not a GPU node or GFD not running)")
            continue
        if "-MIG-" in product.upper():
            skipped.append(f"{host}: MIG product {product} (whole GPUs only)")
            continue
        count_text = labels.get("nvidia.com/gpu.count") or (status.get("allocatable") or {}).get("nvidia.com/gpu")
        try:
            count = int(str(count_text))
        except (TypeError, ValueError):
            raise InvalidCluster(
                f"GPU count {count_text!r} is not an integer (nvidia.com/gpu.count label or allocatable nvidia.com/gpu)",
                field=f"{path}.metadata.labels",
            ) from None
        if count < 1:
            skipped.append(f"{host}: 0 GPUs")
            continue
        mem = labels.get("nvidia.com/gpu.memory")
        try:
            mem_MiB = float(mem) if mem is not None else None
        except ValueError:
            raise InvalidCluster(f"nvidia.com/gpu.memory {mem!r} is not MiB", field=f"{path}.metadata.labels") from None
        device = catalog_id_for(product, mem_MiB, field_path=f"{path}.metadata.labels[nvidia.com/gpu.product]")
        ready = True
        for cond in status.get("conditions") or []:
            if isinstance(cond, Mapping) and cond.get("type") == "Ready":
                ready = cond.get("status") == "True"
        spec = node.get("spec") if isinstance(node.get("spec"), Mapping) else {}
        available = ready and not spec.get("unschedulable", False)
        driver = _version(labels, "nvidia.com/cuda.driver", ("major", "minor", "rev")) or _version(
            labels, "nvidia.com/cuda.driver-version", ("major", "minor", "revision")
        )
        cuda = _version(labels, "nvidia.com/cuda.runtime", ("major", "minor")) or _version(
            labels, "nvidia.com/cuda.runtime-version", ("major", "minor")
        )
        records.append(
            NodeRecord(
                hostname=host,
                device=device,
                gpus=count,
                available=available,
                gpu_product=product,
                versions={"driver_version": driver or "", "cuda_version": cuda or ""},
            )
        )
    if not records:
        raise InvalidCluster("no GPU nodes: " + ("; ".join(skipped) or "the list is empty"), field="k8s.items")
    cluster = group_nodes(records, name)
    if not any(n["available"] for n in cluster["nodes"]):
        raise InvalidCluster("every GPU node is NotReady or cordoned", field="k8s.items")
    return cluster, skipped
