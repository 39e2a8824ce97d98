"""``nvidia-smi`` outputs, one node each → v1 cluster: ``--query-gpu=... --format=csv``,
``-q -x`` (XML), ``-L`` (the GPU list), each optionally with ``topo -m``.

Input: one or more texts.  A text holds one node's outputs (CSV, optionally followed by the
topology matrix), or several nodes separated by marker lines ``# hostname: NAME`` or
``==> NAME <==`` (what ``tail`` prints for several files).  Without a marker the host name is
the file name less its extension(s) (``node7.csv``, ``node7.topo.txt``, ``node7.xml``); a text
sent without a file name (``input``, ``-``, ``stdin``: the HTTP route's raw body) must carry a
marker.  Files of one host (a CSV and a topo) are merged.  Optional comment lines
``# cuda_version: 12.4``, ``# nccl_version: 2.21.5``, ``# nccl_socket_ifname: eth0``,
``# nic_speed_Gbps: 400``, ``# inter_node_bandwidth_GBps: 400`` add what nvidia-smi does not
print.

``-q -x`` gives per GPU ``product_name`` and ``fb_memory_usage/total`` (MiB), and the driver and
CUDA versions; ``-L`` lines (``GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)``) give names only.

CSV: a header (``name, memory.total [MiB], driver_version``) names the columns; without one
(``noheader``) the documented column order ``index,name,uuid,pci.bus_id,memory.total,
compute_cap,driver_version`` is assumed.  ``memory.total`` is MiB with or without ``nounits``.

``topo -m`` (docs/integration.md §6): GPU×GPU cells ``NV#`` are # bonded NVLinks; each carries
25 GB/s per direction on NVLink 2, 3 and 4 (V100 NV6×25 = 150, A100 NV12 = 300, H100 NV18 = 450),
so intra-node bandwidth = 25 × the smallest NV count.  Any PCIe path (``PIX PXB PHB NODE SYS``)
between two GPUs gives 32 GB/s (PCIe Gen4 x16, one direction).  Parsing is tolerant: the man
page says the format may change.

Compute NICs: a NIC of the legend serves GPU traffic when some GPU reaches it through PCIe
switches only (``PIX``/``PXB``: GPUDirect RDMA's path); NICs every GPU reaches only through the
CPU (``PHB``/``NODE``/``SYS``) are storage or management ports and are left out of
``nccl_ib_hca``.  Inter-node bandwidth is compute NICs × ``nic_speed_Gbps`` / 8 (GB/s per node,
one direction); without a speed it is not guessed (a warning says so).
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field

from cost_model.errors import InvalidCluster
from planner_service.importers.common import NodeRecord, catalog_id_for, group_nodes

DEFAULT_COLUMNS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "compute_cap", "driver_version")
NVLINK_LANE_GBps = 25.0
PCIE_GBps = 32.0
_MARKER = re.compile(r"^\s*(?:#\s*hostname\s*:\s*(\S+)|==>\s*(\S+?)\s*<==)\s*$", re.IGNORECASE)
_META = re.compile(r"^\s*#\s*([a-z_]+(?:_GBps)?)\s*:\s*(\S+)\s*$", re.IGNORECASE)
META_KEYS = ("cuda_version", "nccl_version", "driver_version", "nccl_socket_ifname", "nccl_ib_hca", "inter_node_bandwidth_GBps",
             "nic_speed_Gbps")
_UNNAMED = ("input", "-", "stdin", "")
_LIST_LINE = re.compile(r"^\s*GPU\s+(\d+)\s*:\s*(.+?)\s*(?:\(UUID:[^)]*\))?\s*$")
_GPU_DIRECT = ("PIX", "PXB")


def _xml_to_csv(text: str, filename: str) -> str:
    """``nvidia-smi -q -x`` → CSV lines (name, memory.total [MiB], driver_version) plus meta."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise InvalidCluster(f"is not nvidia-smi -q -x XML: {exc}", field=f"files[{filename}]") from None
    if root.tag != "nvidia_smi_log":
        raise InvalidCluster(f"XML root is <{root.tag}>, not <nvidia_smi_log>", field=f"files[{filename}]")
    driver = (root.findtext("driver_version") or "").strip()
    cuda = (root.findtext("cuda_version") or "").strip()
    lines = [f"# cuda_version: {cuda}"] if cuda else []
    lines.append("name, memory.total [MiB], driver_version")
    for gpu in root.findall("gpu"):
        name = (gpu.findtext("product_name") or "").strip()
        total = (gpu.findtext("fb_memory_usage/total") or "").strip()
        if not name:
            raise InvalidCluster(f"GPU {gpu.get('id')} has no <product_name>", field=f"files[{filename}]")
        lines.append(f"{name}, {total}, {driver}")
    if len(lines) == (2 if cuda else 1):
        raise InvalidCluster("nvidia-smi -q -x lists no <gpu>", field=f"files[{filename}]")
    return "\n".join(lines)


def _list_to_csv(text: str) -> str:
    """``nvidia-smi -L`` lines → a ``name`` CSV (the other lines, e.g. topo -m, kept)."""
    out: list[str] = []
    header_done = False
    for line in text.splitlines():
        m = _LIST_LINE.match(line)
        if m and not line.lstrip().startswith("GPU0"):
            if not header_done:
                out.append("name")
                header_done = True
            out.append(m.group(2).replace(",", " "))
        else:
            out.append(line)
    return "\n".join(out)


def _normalise_text(filename: str, text: str) -> str:
    stripped = text.lstrip()
    if stripped.startswith("<?xml") or stripped.startswith("<nvidia_smi_log") or stripped.startswith("<!DOCTYPE nvidia_smi_log"):
        return _xml_to_csv(stripped, filename)
    if any(_LIST_LINE.match(line) and not line.lstrip().startswith("GPU0") for line in text.splitlines()):
        return _list_to_csv(text)
    return text


@dataclass
class _Node:
    host: str
    csv_lines: list[str] = field(default_factory=list)
    topo_lines: list[str] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)


def _host_from_filename(filename: str) -> str:
    base = filename.rsplit("/", 1)[-1]
    for suffix in (".txt", ".csv", ".xml", ".topo", ".smi", ".query", ".out", ".list", "-topo", "_topo", "-smi", "_smi"):
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
        text = _normalise_text(filename, text)
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
                if host.lower() in _UNNAMED:
                    raise InvalidCluster(
                        "cannot tell the host name: add a '# hostname: NAME' line, or name the file (?filename=NAME over HTTP)",
                        field=f"files[{filename}]",
                    )
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


def _parse_topo(node: _Node, gpu_count: int) -> tuple[float | None, list[str] | None]:
    """(intra-node GB/s per direction, compute NICs) of a ``topo -m`` matrix."""
    lines = node.topo_lines
    if not lines:
        return None, None
    header_idx = next((i for i, ln in enumerate(lines) if ln.split() and ln.split()[0] == "GPU0" and len(ln.split()) > 1 and ln.split()[1].startswith(("GPU", "NIC", "CPU"))), None)
    if header_idx is None:
        # single-GPU nodes print "GPU0  CPU Affinity ..." too; accept a bare header too
        header_idx = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["GPU0"]), None)
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
    gpu_direct_nics: set[str] = set()
    for line in lines[header_idx + 1 :]:
        tokens = line.split()
        if not tokens or not re.fullmatch(r"GPU\d+", tokens[0]):
            continue
        seen_rows += 1
        cells = tokens[1 : 1 + len(cols)]
        if len(cells) < len(cols):
            raise InvalidCluster(f"row {tokens[0]} has {len(cells)} cells, expected {len(cols)}", field=f"{node.host}.topo")
        for col, cell in zip(cols, cells, strict=True):
            if not col.startswith("GPU"):
                if cell in _GPU_DIRECT:
                    gpu_direct_nics.add(col)
                continue
            if col == tokens[0]:
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
    legend = {}
    for line in lines:
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)", line)
        if m:
            legend[m.group(1)] = m.group(2)
    # columns may be the NIC names themselves (older drivers print mlx5_0 in the header)
    hcas = [legend.get(c, c) for c in cols if not c.startswith("GPU") and c in gpu_direct_nics]
    return worst, [h for h in hcas if h.startswith("mlx")] or None


def _positive(node: _Node, key: str) -> float | None:
    value = node.meta.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number <= 0:
        raise InvalidCluster(f"must be a positive number, got {value!r}", field=f"{node.host}.{key}")
    return number


def _inter_node_GBps(node: _Node, hcas: list[str] | None, warnings: list[str]) -> float | None:
    """The node's NIC bandwidth (GB/s, one direction): given, or compute NICs × speed."""
    given = _positive(node, "inter_node_bandwidth_GBps")
    if given is not None:
        return given
    speed = _positive(node, "nic_speed_Gbps")
    if hcas and speed:
        return len(hcas) * speed / 8.0
    if hcas:
        warnings.append(
            f"{node.host}: {len(hcas)} compute NICs ({','.join(hcas)}) but no speed: add '# nic_speed_Gbps: N' "
            "(ibstat's Rate) to derive the inter-node bandwidth; the device's default is used"
        )
    return None


def import_nvidia_smi(sources: Iterable[tuple[str, str]], name: str = "nvidia-smi-cluster") -> tuple[dict, list[str]]:
    """The v1 cluster dict and warnings (what could not be derived) for these outputs."""
    nodes = _split(sources)
    if not nodes:
        raise InvalidCluster("no nvidia-smi output given", field="files")
    records = []
    warnings: list[str] = []
    for node in nodes.values():
        product, count, mem_MiB, driver = _parse_csv(node)
        device = catalog_id_for(product, mem_MiB, field_path=f"{node.host}.csv.name")
        intra, hcas = _parse_topo(node, count)
        given_hca = node.meta.get("nccl_ib_hca")
        records.append(
            NodeRecord(
                hostname=node.host,
                device=device,
                gpus=count,
                intra_node_bandwidth_GBps=intra if count > 1 else None,
                inter_node_bandwidth_GBps=_inter_node_GBps(node, given_hca.split(",") if given_hca else hcas, warnings),
                nccl_socket_ifname=node.meta.get("nccl_socket_ifname"),
                nccl_ib_hca=given_hca or (",".join(hcas) if hcas else None),
                versions={
                    "driver_version": node.meta.get("driver_version") or driver or "",
                    "cuda_version": node.meta.get("cuda_version", ""),
                    "nccl_version": node.meta.get("nccl_version", ""),
                },
            )
        )
    return group_nodes(records, name), warnings
