"""``nvidia-smi --query-gpu=... --format=csv`` plus ``nvidia-smi topo -m``, one node each → v1 cluster.

Input: one or more texts.  A text holds one node's outputs (CSV, optionally followed by the
topology matrix), or several nodes separated by marker lines ``# hostname: NAME`` or
``==> NAME <==`` (what ``tail`` prints for several files).  Without a marker the host name is
the file name less its extension(s) (``node7.csv``, ``node7.topo.txt``).  Files of one host
(a CSV and a topo) are merged.  Optional comment lines ``# cuda_version: 12.4``,
``# nccl_version: 2.21.5``, ``# nccl_socket_ifname: eth0``, ``# inter_node_bandwidth_GBps: 400``
add what nvidia-smi does not print.

CSV: a header (``name, memory.total [MiB], driver_version``) names the columns; without one
(``noheader``) the documented column order ``index,name,uuid,pci.bus_id,memory.total,
compute_cap,driver_version`` is assumed.  ``memory.total`` is MiB with or without ``nounits``.

``topo -m`` (docs/integration.md §6): GPU×GPU cells ``NV#`` are # bonded NVLinks; each carries
25 GB/s per direction on NVLink 2, 3 and 4 (V100 NV6×25 = 150, A100 NV12 = 300, H100 NV18 = 450),
so intra-node bandwidth = 25 × the smallest NV count.  Any PCIe path (``PIX PXB PHB NODE SYS``)
between two GPUs gives 32 GB/s (PCIe Gen4 x16, one direction).  NICs named ``mlx5_*`` in the
legend become ``nccl_ib_hca``.  Parsing is tolerant: the man page says the format may change.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from cost_model.errors import InvalidCluster
from planner_service.importers.common import NodeRecord, catalog_id_for, group_nodes

DEFAULT_COLUMNS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "compute_cap", "driver_version")
NVLINK_LANE_GBps = 25.0
PCIE_GBps = 32.0
_MARKER = re.compile(r"^\s*(?:#\s*hostname\s*:\s*(\S+)|==>\s*(\S+?)\s*<==)\s*$", re.IGNORECASE)
_META = re.compile(r"^\s*#\s*([a-z_]+(?:_GBps)?)\s*:\s*(\S+)\s*$", re.IGNORECASE)
META_KEYS = ("cuda_version", "nccl_version", "driver_version", "nccl_socket_ifname", "nccl_ib_hca", "inter_node_bandwidth_GBps")


@dataclass
class _Node:
    host: str
    csv_lines: list[str] = field(default_factory=list)
    topo_lines: list[str] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)


def _host_from_filename(filename: str) -> str:
    base = filename.rsplit("/", 1)[-1]
    for suffix in (".txt", ".csv", ".topo", ".smi", ".query", ".out", "-topo", "_topo", "-smi", "_smi"):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
    for suffix in (".csv", ".topo", "-topo", "_topo"):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
    return base


def _split(sources: Iterable[tuple[str, str]]) -> dict[str, _Node]:
    nodes: dict[str, _Node] = {}
    for filename, text in sources:
        current = None
        in_topo = False
        for raw in text.splitlines():
            line = raw.rstrip()
            m = _MARKER.match(line)
            if m:
                host = m.group(1) or m.group(2)
                host = _host_from_filename(host) if m.group(2) else host
                current = nodes.setdefault(host, _Node(host))
                in_topo = False
                continue
            if not line.strip():
                continue
            if current is None:
                host = _host_from_filename(filename)
                if not host:
                    raise InvalidCluster("cannot tell the host name: add a '# hostname: NAME' line", field=f"files[{filename}]")
                current = nodes.setdefault(host, _Node(host))
            meta = _META.match(line)
            if meta and meta.group(1).lower() in [k.lower() for k in META_KEYS]:
                key = next(k for k in META_KEYS if k.lower() == meta.group(1).lower())
                current.meta[key] = meta.group(2)
                continue
            if line.lstrip().startswith("#"):
                continue
            tokens = line.split()
            if tokens and tokens[0] == "GPU0" and "," not in line and not line.startswith("GPU0,"):
                in_topo = True
            if in_topo or (tokens and re.fullmatch(r"(GPU\d+|NIC\d+|NIC\s*Legend:?|Legend:?|X)", tokens[0]) and "," not in line) or re.match(r"^\s*NIC\d+\s*:", line) or re.match(r"^\s*(Legend|NIC Legend)", line):
                current.topo_lines.append(line)
            else:
                current.csv_lines.append(line)
    return nodes


def _parse_csv(node: _Node) -> tuple[str, int, float | None, str | None]:
    if not node.csv_lines:
        raise InvalidCluster("has no nvidia-smi --query-gpu CSV rows", field=f"{node.host}.csv")
    rows = [[c.strip() for c in r] for r in csv.reader(io.StringIO("\n".join(node.csv_lines)))]
    header = rows[0]
    if any(h.lower().startswith("name") for h in header):
        columns = [re.sub(r"\s*\[.*\]$", "", h).strip().lower() for h in header]
        rows = rows[1:]
    else:
        columns = list(DEFAULT_COLUMNS)
    if not rows:
        raise InvalidCluster("has a header but no GPU rows", field=f"{node.host}.csv")
    if "name" not in columns:
        raise InvalidCluster("needs the 'name' column", field=f"{node.host}.csv")
    names, mems, drivers = set(), [], set()
    for k, row in enumerate(rows):
        if len(row) != len(columns):
            raise InvalidCluster(
                f"row {k + 1} has {len(row)} values but {len(columns)} columns ({','.join(columns)}); "
                "add the header line (drop 'noheader') when querying other fields",
                field=f"{node.host}.csv",
            )
        rec = dict(zip(columns, row, strict=True))
        names.add(rec["name"])
        if "memory.total" in rec:
            m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(MiB)?\s*$", rec["memory.total"])
            if not m:
                raise InvalidCluster(f"memory.total {rec['memory.total']!r} is not MiB", field=f"{node.host}.csv")
            mems.append(float(m.group(1)))
        if rec.get("driver_version"):
            drivers.add(rec["driver_version"])
    if len(names) != 1:
        raise InvalidCluster(f"mixes GPU models on one node: {sorted(names)}", field=f"{node.host}.csv")
    if len(drivers) > 1:
        raise InvalidCluster(f"reports several driver versions {sorted(drivers)}", field=f"{node.host}.csv")
    return names.pop(), len(rows), (min(mems) if mems else None), (drivers.pop() if drivers else None)


def _parse_topo(node: _Node, gpu_count: int) -> tuple[float | None, str | None]:
    lines = node.topo_lines
    if not lines:
        return None, None
    header_idx = next((i for i, line in enumerate(lines) if line.split() and line.split()[0] == "GPU0" and len(line.split()) > 1 and line.split()[1].startswith(("GPU", "NIC", "CPU"))), None)
    if header_idx is None:
        # single-GPU nodes print "GPU0  CPU Affinity ..." too; accept a bare header too
        header_idx = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]), None)
    if header_idx is None:
        raise InvalidCluster("topo -m output has no GPU0 header", field=f"{node.host}.topo")
    cols = []
    for t in lines[header_idx].split():
        if re.fullmatch(r"(GPU|NIC|mlx5_)\d+", t):
            cols.append(t)
        else:
            break
    gpu_cols = [c for c in cols if c.startswith("GPU")]
    if len(gpu_cols) != gpu_count:
        raise InvalidCluster(
            f"topo -m has {len(gpu_cols)} GPUs but the CSV has {gpu_count}", field=f"{node.host}.topo"
        )
    worst: float | None = None
    seen_rows = 0
    for line in lines[header_idx + 1 :]:
        tokens = line.split()
        if not tokens or not re.fullmatch(r"GPU\d+", tokens[0]):
            continue
        seen_rows += 1
        cells = tokens[1 : 1 + len(cols)]
        if len(cells) < len(cols):
            raise InvalidCluster(f"row {tokens[0]} has {len(cells)} cells, expected {len(cols)}", field=f"{node.host}.topo")
        for col, cell in zip(cols, cells, strict=False):
            if not col.startswith("GPU") or col == tokens[0]:
                continue
            m = re.fullmatch(r"NV(\d+)", cell)
            if m:
                bw = int(m.group(1)) * NVLINK_LANE_GBps
            elif cell in ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC"):
                bw = PCIE_GBps
            else:
                raise InvalidCluster(f"unknown link code {cell!r} between {tokens[0]} and {col}", field=f"{node.host}.topo")
            worst = bw if worst is None else min(worst, bw)
    if seen_rows != len(gpu_cols):
        raise InvalidCluster(f"topo -m has {seen_rows} GPU rows for {len(gpu_cols)} GPUs", field=f"{node.host}.topo")
    hcas = []
    for line in lines:
        m = re.match(r"^\s*NIC\d+\s*:\s*(\S+)", line)
        if m and m.group(1).startswith("mlx"):
            hcas.append(m.group(1))
    return worst, (",".join(hcas) or None)


def import_nvidia_smi(sources: Iterable[tuple[str, str]], name: str = "nvidia-smi-cluster") -> dict:
    nodes = _split(sources)
    if not nodes:
        raise InvalidCluster("no nvidia-smi output given", field="files")
    records = []
    for node in nodes.values():
        product, count, mem_MiB, driver = _parse_csv(node)
        device = catalog_id_for(product, mem_MiB, field_path=f"{node.host}.csv.name")
        intra, hca = _parse_topo(node, count)
        inter = node.meta.get("inter_node_bandwidth_GBps")
        if inter is not None:
            try:
                inter_f = float(inter)
                assert inter_f > 0
            except (ValueError, AssertionError):
                raise InvalidCluster(f"must be a positive number, got {inter!r}", field=f"{node.host}.inter_node_bandwidth_GBps") from None
        records.append(
            NodeRecord(
                hostname=node.host,
                device=device,
                gpus=count,
                intra_node_bandwidth_GBps=intra if count > 1 else None,
                inter_node_bandwidth_GBps=float(inter) if inter is not None else None,
                nccl_socket_ifname=node.meta.get("nccl_socket_ifname"),
                nccl_ib_hca=node.meta.get("nccl_ib_hca") or hca,
                versions={
                    "driver_version": node.meta.get("driver_version") or driver or "",
                    "cuda_version": node.meta.get("cuda_version", ""),
                    "nccl_version": node.meta.get("nccl_version", ""),
                },
            )
        )
    return group_nodes(records, name)
