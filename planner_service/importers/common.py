"""Shared importer pieces: GPU product name → catalog id, grouping nodes into node groups."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cost_model.devices import catalog
from cost_model.errors import InvalidCluster
from cost_model.units import bytes_to_gb, mib_to_bytes

#: Family tokens as they appear in nvidia-smi names, GFD labels and Paddle's "model" field.
_FAMILIES = ("H200", "H100", "H800", "B200", "A100", "A800", "V100", "L40S", "A10", "MI300X", "MI250X")


def _tokens(product: str) -> list[str]:
    text = product.upper().replace("NVIDIA", " ").replace("TESLA", " ")
    return [t for t in re.split(r"[\s_\-/]+", text) if t]


def catalog_id_for(product: str, memory_MiB: float | None = None, field_path: str = "device") -> str:
    """Map a GPU product string to a device-catalog id.

    Accepts nvidia-smi names (``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-40GB``,
    ``Tesla V100-SXM2-32GB``, ``NVIDIA A100 80GB PCIe``), GPU Feature Discovery labels
    (``NVIDIA-H100-80GB-HBM3``, ``A100-SXM4-40GB``) and catalog ids themselves.  The family
    token picks the catalog family; the form factor (``PCIE`` vs SXM/HBM3) and the memory size
    (from the name, else ``memory_MiB``) pick the entry.
    """
    cat = catalog()
    stripped = product.strip()
    for cid in cat:
        if cid.lower() == stripped.lower():
            return cid
    tokens = _tokens(stripped)
    if any(t.startswith("MIG") for t in tokens):
        raise InvalidCluster(f"MIG slices ({product!r}) are not supported; give whole GPUs", field=field_path)
    family = next((f for f in _FAMILIES if f in tokens or any(t.startswith(f) and t[len(f):] in ("", "S") for t in tokens)), None)
    if family is None:
        # nvidia-smi writes e.g. "A100-SXM4-80GB" as one token after splitting on "-": handled above;
        # anything else is unknown.
        raise InvalidCluster(
            f"GPU product {product!r} matches no catalog device ({', '.join(sorted(c for c in cat if c != 'local-cpu'))})",
            field=field_path,
        )
    family = {"H800": "H100", "A800": "A100"}.get(family, family)
    pcie = any(t in ("PCIE", "PCI") for t in tokens)
    mem_GB: float | None = None
    for t in tokens:
        m = re.fullmatch(r"(\d+)GB", t)
        if m:
            mem_GB = float(m.group(1))
    if mem_GB is None and memory_MiB:
        mem_GB = bytes_to_gb(mib_to_bytes(memory_MiB))
    candidates = [c for c in cat.values() if c.name.upper().startswith(family)]
    if family == "A10":
        candidates = [c for c in candidates if c.name.upper().startswith("A10-")]
    if not candidates:
        raise InvalidCluster(f"GPU product {product!r}: family {family} is not in the device catalog", field=field_path)
    form = [c for c in candidates if ("PCIE" in c.name.upper()) == pcie] or candidates
    if mem_GB is None:
        return sorted(form, key=lambda c: c.memory_GB)[-1].name
    return min(form, key=lambda c: abs(c.memory_GB - mem_GB)).name


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
