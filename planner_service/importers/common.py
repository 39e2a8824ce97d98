"""Shared importer pieces: GPU product name → catalog id, grouping nodes into node groups."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cost_model.devices import catalog, catalog_id, closest_catalog_ids, normalise_product
from cost_model.errors import InvalidCluster


def catalog_id_for(product: str, memory_MiB: float | None = None, field_path: str = "device") -> str:
    """Map a GPU product string to its device-catalog id, exactly (:func:`cost_model.devices.catalog_id`,
    :data:`cost_model.devices.PRODUCT_NAMES`).

    Accepts nvidia-smi names (``NVIDIA H100 80GB HBM3``, ``NVIDIA H100 NVL``, ``NVIDIA
    A800-SXM4-80GB``, ``Tesla V100-SXM2-32GB``), GPU Feature Discovery labels
    (``NVIDIA-H100-80GB-HBM3``), rocm-smi names (``AMD Instinct MI300X``) and catalog ids.  A
    reported memory size (``memory_MiB``) must agree with the entry's (±10%), so a card the
    catalog does not describe is not taken for a sibling.  Anything else is an
    :class:`InvalidCluster` (HTTP 422) naming the product and the closest catalog entries.
    """
    key = normalise_product(product)
    if "MIG" in key.split("-"):
        raise InvalidCluster(f"MIG slices ({product!r}) are not supported; give whole GPUs", field=field_path)
    mapped = catalog_id(product)
    if mapped is None:
        closest = closest_catalog_ids(product)
        raise InvalidCluster(
            f"GPU product {product!r} matches no catalog device"
            + (f"; closest catalog entries: {', '.join(closest)}" if closest else "")
            + "; give a catalog id or an inline device spec (name, memory_GB, bf16_tflops, memory_bandwidth_GBps, ...)",
            field=field_path,
        )
    return _check_memory(mapped, product, memory_MiB, field_path)


def _check_memory(cid: str, product: str, memory_MiB: float | None, field_path: str) -> str:
    if not memory_MiB:
        return cid
    reported_GB = memory_MiB / 1024.0  # nvidia-smi's MiB; catalog sizes are marketing "GB" ≈ GiB
    catalog_GB = catalog()[cid].memory_GB
    if catalog_GB and abs(reported_GB - catalog_GB) > 0.1 * catalog_GB:
        raise InvalidCluster(
            f"GPU product {product!r} reports {reported_GB:.0f} GiB but catalog entry {cid} has {catalog_GB:.0f} GB: "
            "a variant the catalog does not describe; give an inline device spec",
            field=field_path,
        )
    return cid


@dataclass
class NodeRecord:
    """One imported host before grouping."""

    hostname: str
    device: str
    gpus: int
    available: bool = True
    intra_node_bandwidth_GBps: float | None = None
    inter_node_bandwidth_GBps: float | None = None
    nccl_socket_ifname: str | None = None
    nccl_ib_hca: str | None = None
    gpu_product: str | None = None
    versions: dict[str, str] = field(default_factory=dict)


def group_nodes(records: list[NodeRecord], name: str) -> dict[str, Any]:
    """v1 cluster dict: one node group per distinct (device, GPUs, bandwidths, NCCL settings)."""
    if not records:
        raise InvalidCluster("no GPU nodes found in the input", field="cluster")
    seen: set[str] = set()
    for r in records:
        if r.hostname in seen:
            raise InvalidCluster(f"hostname {r.hostname!r} appears twice", field="cluster.nodes")
        seen.add(r.hostname)
    groups: dict[tuple, list[NodeRecord]] = {}
    for r in records:
        key = (r.device, r.gpus, r.intra_node_bandwidth_GBps, r.inter_node_bandwidth_GBps, r.nccl_socket_ifname, r.nccl_ib_hca, r.gpu_product)
        groups.setdefault(key, []).append(r)
    node_groups = []
    used: set[str] = set()
    for (device, gpus, intra, inter, ifname, hca, product), members in groups.items():
        base = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
        gname = base
        k = 2
        while gname in used:
            gname = f"{base}-{k}"
            k += 1
        used.add(gname)
        g: dict[str, Any] = {
            "name": gname,
            "count": len(members),
            "gpus_per_node": gpus,
            "device": device,
            "hostnames": [m.hostname for m in members],
        }
        if intra is not None:
            g["intra_node_bandwidth_GBps"] = intra
        if inter is not None:
            g["inter_node_bandwidth_GBps"] = inter
        if ifname:
            g["nccl_socket_ifname"] = ifname
        if hca:
            g["nccl_ib_hca"] = hca
        if product:
            g["gpu_product"] = product
        node_groups.append(g)
        for m in members:
            m.versions["_group"] = gname
    nodes = []
    for r in records:
        entry: dict[str, Any] = {"hostname": r.hostname, "group": r.versions.pop("_group"), "available": r.available}
        entry.update({k: v for k, v in r.versions.items() if v})
        nodes.append(entry)
    return {"name": name, "node_groups": node_groups, "nodes": nodes}
