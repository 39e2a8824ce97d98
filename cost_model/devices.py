"""Device catalog: accelerator figures with their sources, plus per-family calibration.

The figures come from ``cost_model/data/gpu_specs.json`` (copied from the project's shared data,
each entry carries its ``source``).  Peaks are *dense* TFLOP/s; bandwidths are GB/s (1e9 B/s),
one direction.  What a device actually achieves is a separate, small set of constants per device
*family* (:class:`Efficiency`), documented in :data:`FAMILY_EFFICIENCY` and fitted once against
the published runs (``bench/fidelity.py``).  An operator profile (``cost_model.profiles``)
replaces a device's efficiency with one fitted to measurements of that device.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from cost_model.errors import InvalidCluster, UnknownName
from cost_model.units import bytes_to_gb, flops_to_tflops, gb_to_bytes, kib_to_bytes, mib_to_bytes

DTYPES = ("bf16", "fp16", "fp32", "fp8", "fp4")
#: Bytes per element.  ``fp4`` is NVFP4 (Transformer Engine ``NVFP4BlockScaling``): 4-bit E2M1
#: values plus one E4M3 scale byte per 16-element block, 0.5 + 1/16 bytes (NVIDIA, "Pretraining
#: Large Language Models with NVFP4", arXiv 2509.25149, §2; the per-tensor FP32 scale is
#: negligible).
BYTES_PER_ELEMENT: dict[str, float] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "fp4": 0.5 + 1.0 / 16.0}
#: Training number formats whose decoder linear layers run their GEMMs in a narrow format on
#: Transformer Engine while the attention core, the embedding and the LM head stay in BF16.
NARROW_DTYPES = ("fp8", "fp4")


@dataclass(frozen=True)
class Efficiency:
    """How close a device gets to its datasheet figures.

    GEMM time (see :func:`cost_model.compute.gemm_time_s`) is
    ``flops / (peak · gemm_max_fraction · σ(m; d½) · σ(n; d½) · σ(k; k½))`` with
    ``σ(x; x½) = x/(x + x½)``, floored by the bytes moved over ``memory_bandwidth ·
    memory_fraction``.  σ over m and n models tile/wave quantisation of the output; σ over the
    reduction dimension k models each output tile's fixed prologue/epilogue (loading the
    pipeline, writing C), amortised over k/tile_k main-loop steps — deeper asynchronous
    pipelines (Hopper's wgmma/TMA) need larger k to amortise.

    Collectives run at ``link_bandwidth * link_fraction`` plus ``collective_latency_s`` per ring
    step (NCCL's bus-bandwidth model).  ``kernel_overhead_s`` is the fixed cost of one kernel
    launch, which dominates tiny operators.

    Three per-element terms describe what makes elementwise work compute-bound or slower than
    its bytes on some devices (all zero on GPUs: there the memory traffic hides them):

    * ``rng_s_per_element``: generating one random Bernoulli mask element (dropout).  CPU
      frameworks draw them one by one from a scalar generator (PyTorch's CPU ``bernoulli_``:
      mt19937, ~10–20 ns per element per socket), far slower than reading the bytes; GPU dropout
      kernels generate Philox numbers in registers at memory speed.
    * ``transcendental_s_per_element``: one exp/erf/tanh/log (softmax, GELU, SiLU, log-softmax).
      Vectorised libm on a CPU core runs ~1–3 G of them per second, below its share of memory
      bandwidth; GPU special-function units are an order of magnitude faster than HBM.
    * ``first_touch_s_per_byte`` for fresh tensors of at least ``first_touch_min_bytes``: a CPU
      allocator (glibc malloc) serves requests above its mmap threshold — at most 32 MiB on
      64-bit Linux (``DEFAULT_MMAP_THRESHOLD_MAX`` = 4 MiB · sizeof(long)) — with a new mapping
      each time, so writing the result page-faults and zero-fills every 4 KiB page; GPU caching
      allocators reuse their blocks (threshold ∞).

    Elementwise time is ``max(bytes / (bandwidth · memory_fraction), rng + transcendental
    element costs) + first-touch cost + launches`` (:func:`cost_model.compute.memory_bound_time_s`).

    ``comm_overlap_fraction`` scales every overlap of communication with compute — the DP
    gradient reduction behind backward (``DP_OVERLAP_WINDOW``), the context-parallel K/V ring
    behind attention, tensor-parallel collectives behind GEMMs (``tp_comm_overlap``): 1 on GPUs,
    where NCCL's kernels and the copy engines run beside the compute kernels on their own SMs and
    DMA queues; 0 on CPUs, where gloo's reduction loops, its loopback socket copies and DDP's
    bucket copies run on the same cores as the backward pass, so every second of all-reduce is
    a second the backward does not get (PyTorch DDP still issues them asynchronously; the cores
    are what is shared).  A property of the kind of device, not fitted by a profile.
    """

    gemm_max_fraction: float
    gemm_half_dim: float
    memory_fraction: float
    nvlink_fraction: float
    nic_fraction: float
    collective_latency_s: float
    kernel_overhead_s: float
    gemm_half_k: float = 256.0
    rng_s_per_element: float = 0.0
    transcendental_s_per_element: float = 0.0
    first_touch_s_per_byte: float = 0.0
    first_touch_min_bytes: float = float("inf")
    comm_overlap_fraction: float = 1.0
    source: str = "family default"


#: Per-family constants.  Derivation: ``gemm_max_fraction`` is the fraction of dense peak that
#: large cuBLAS GEMMs reach (A100 ≈ 0.80 of 312 TFLOP/s, H100 ≈ 0.74 of 989 in bf16, V100 ≈
#: 0.88 of 125 fp16), ``gemm_half_k`` the reduction length at which a tile's fixed cost halves
#: the rate (A100 128, H100 512: Hopper's deeper TMA/wgmma pipelines need longer k),
#: ``memory_fraction`` the STREAM-like fraction of HBM bandwidth elementwise kernels reach
#: (≈ 0.8), link fractions NCCL's achieved bus bandwidth over the link figure (NVLink ≈ 0.78,
#: InfiniBand ≈ 0.88).  The GEMM constants were then set as *global* constants (one set per
#: family, never per model or per run) against the published runs in ``bench/fidelity.py``:
#: README "Cost model fidelity" lists the result.  Families without published runs here
#: (blackwell, ada, cdna, ascend) carry conservative guesses until a profile replaces them.
FAMILY_EFFICIENCY: dict[str, Efficiency] = {
    "volta": Efficiency(gemm_max_fraction=0.88, gemm_half_dim=96.0, memory_fraction=0.80, nvlink_fraction=0.75, nic_fraction=0.85, collective_latency_s=8e-6, kernel_overhead_s=6e-6, gemm_half_k=256.0, source="volta family default"),
    "ampere": Efficiency(gemm_max_fraction=0.80, gemm_half_dim=96.0, memory_fraction=0.80, nvlink_fraction=0.78, nic_fraction=0.88, collective_latency_s=8e-6, kernel_overhead_s=5e-6, gemm_half_k=128.0, source="ampere family default"),
    "hopper": Efficiency(gemm_max_fraction=0.74, gemm_half_dim=128.0, memory_fraction=0.80, nvlink_fraction=0.78, nic_fraction=0.88, collective_latency_s=8e-6, kernel_overhead_s=4e-6, gemm_half_k=512.0, source="hopper family default"),
    "blackwell": Efficiency(gemm_max_fraction=0.72, gemm_half_dim=160.0, memory_fraction=0.80, nvlink_fraction=0.78, nic_fraction=0.88, collective_latency_s=8e-6, kernel_overhead_s=4e-6, gemm_half_k=512.0, source="blackwell family default"),
    "ada": Efficiency(gemm_max_fraction=0.72, gemm_half_dim=96.0, memory_fraction=0.80, nvlink_fraction=0.75, nic_fraction=0.85, collective_latency_s=10e-6, kernel_overhead_s=5e-6, gemm_half_k=256.0, source="ada family default"),
    "cdna": Efficiency(gemm_max_fraction=0.55, gemm_half_dim=128.0, memory_fraction=0.75, nvlink_fraction=0.70, nic_fraction=0.85, collective_latency_s=12e-6, kernel_overhead_s=8e-6, gemm_half_k=256.0, source="cdna family default"),
    "ascend": Efficiency(gemm_max_fraction=0.60, gemm_half_dim=128.0, memory_fraction=0.75, nvlink_fraction=0.70, nic_fraction=0.85, collective_latency_s=12e-6, kernel_overhead_s=8e-6, gemm_half_k=256.0, source="ascend family default"),
    # CPUs: the mmap threshold is glibc's (the allocator PyTorch and numpy use on Linux); the
    # per-element RNG, transcendental and page-fault costs depend on the library build, the
    # allocator and the hypervisor as much as on the chip, so the catalog does not guess them
    # (zero): only a profile of the host (``planner profile``) measures them.
    "cpu": Efficiency(gemm_max_fraction=0.60, gemm_half_dim=32.0, memory_fraction=0.60, nvlink_fraction=0.50, nic_fraction=0.50, collective_latency_s=30e-6, kernel_overhead_s=2e-6, gemm_half_k=32.0, first_touch_min_bytes=mib_to_bytes(32.0), comm_overlap_fraction=0.0, source="cpu default (no profile)"),
}


@dataclass(frozen=True)
class HostServer:
    """The server a device usually sits in, as optimizer offload sees it: its DRAM's peak
    bandwidth (sockets × memory channels × transfer rate × 8 B) and capacity, shared by ``gpus``
    devices.  Vendor system specifications; a cluster whose hosts differ states them on an
    inline device (``host_memory_bandwidth_GBps``, ``host_memory_GB`` per GPU)."""

    name: str
    dram_GBps: float
    dram_GB: float
    gpus: int

    @property
    def dram_GBps_per_gpu(self) -> float:
        return self.dram_GBps / self.gpus

    @property
    def dram_GB_per_gpu(self) -> float:
        return self.dram_GB / self.gpus


#: The host of PCIe cards and unlisted parts (and an inline device's when it states none): two
#: sockets of 8 channels DDR4-3200, 1 TB, 8 devices.
GENERIC_HOST = HostServer("generic 2-socket server", 2 * 8 * 3.2 * 8, 1024.0, 8)
#: PCIe x16 Gen4, one direction: the host link of a device whose catalog entry states none.
DEFAULT_HOST_LINK_GBps = 32.0


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or CPU socket) model.  Immutable; units in field names."""

    name: str
    family: str
    kind: str  # "gpu" or "cpu"
    memory_GB: float
    memory_bandwidth_GBps: float
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    fp8_tflops: float | None = None
    fp32_tflops: float | None = None
    #: Dense FP4 (NVFP4/MXFP4) tensor-core peak: Blackwell only.
    fp4_tflops: float | None = None
    intra_node_bandwidth_GBps: float = 32.0
    inter_node_bandwidth_GBps: float = 25.0
    gpus_per_node: int = 8
    cores: int | None = None
    efficiency: Efficiency = field(default_factory=lambda: FAMILY_EFFICIENCY["ampere"])
    #: The host side, what optimizer offload runs on (:data:`REFERENCE_HOSTS`): the device's link
    #: to its host CPU (GB/s one direction: PCIe x16 of the catalog's generation, NVLink-C2C on
    #: Grace superchips), and this device's share of its server's DRAM bandwidth and capacity.
    host_link_GBps: float = DEFAULT_HOST_LINK_GBps
    host_memory_bandwidth_GBps: float = GENERIC_HOST.dram_GBps_per_gpu
    host_memory_GB: float = GENERIC_HOST.dram_GB_per_gpu
    profile_id: str | None = None
    source: str = ""

    def _peak_or_none(self, dtype: str) -> float | None:
        value = {
            "bf16": self.bf16_tflops,
            "fp16": self.fp16_tflops,
            "fp8": self.fp8_tflops,
            "fp32": self.fp32_tflops,
            "fp4": self.fp4_tflops,
        }.get(dtype)
        if value is None and dtype in ("bf16", "fp16") and self.kind == "cpu":
            value = self.fp32_tflops  # CPUs run 16-bit math at (at best) the fp32 rate
        return value

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for ``dtype``; raises a field-naming error when the device has none."""
        value = self._peak_or_none(dtype)
        if value is None:
            raise InvalidCluster(
                f"device {self.name} has no {dtype} peak in the catalog; "
                f"choose a dtype it supports ({', '.join(self.supported_dtypes()) or 'none'}) "
                "or give an inline device spec",
                field="training.dtype",
            )
        return float(value)

    def supported_dtypes(self) -> tuple[str, ...]:
        return tuple(d for d in DTYPES if self._peak_or_none(d) is not None)

    @property
    def memory_bytes(self) -> float:
        return gb_to_bytes(self.memory_GB)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "kind": self.kind,
            "memory_GB": self.memory_GB,
            "memory_bandwidth_GBps": self.memory_bandwidth_GBps,
            "bf16_tflops": self.bf16_tflops,
            "fp16_tflops": self.fp16_tflops,
            "fp8_tflops": self.fp8_tflops,
            "fp32_tflops": self.fp32_tflops,
            **({"fp4_tflops": self.fp4_tflops} if self.fp4_tflops is not None else {}),
            "intra_node_bandwidth_GBps": self.intra_node_bandwidth_GBps,
            "inter_node_bandwidth_GBps": self.inter_node_bandwidth_GBps,
            "gpus_per_node": self.gpus_per_node,
            "host_link_GBps": self.host_link_GBps,
            "host_memory_bandwidth_GBps": self.host_memory_bandwidth_GBps,
            "host_memory_GB": self.host_memory_GB,
            "profile_id": self.profile_id,
            "source": self.source,
        }


_FAMILY_PATTERNS = (
    (r"^V100", "volta"),
    (r"^A100|^A10\b|^A10-", "ampere"),
    (r"^H100|^H200|^H800|^H20-|^GH200", "hopper"),
    (r"^B200|^GB200|^B300|^GB300", "blackwell"),
    (r"^L40|^L4-", "ada"),
    (r"^MI", "cdna"),
    (r"^Ascend", "ascend"),
)

#: PCIe per-direction bandwidth by generation (x16), used when a card has no NVLink figure.
_PCIE_GBps = {"3": 16.0, "4": 32.0, "5": 64.0, "6": 128.0}
#: Grace–Blackwell superchips reach their host over NVLink-C2C, 900 GB/s both directions per
#: Grace, which serves two GPUs: 225 GB/s one direction per GPU (NVIDIA GB200 NVL72 datasheet).
_C2C_GBps_PER_GPU = 225.0


#: Reference host of each catalog device (first matching pattern; else the generic server):
#: DGX-1 (2× Xeon E5-2698 v4, 4 channels DDR4-2133 each, 512 GB), DGX A100 (2× EPYC 7742,
#: 8 channels DDR4-3200 each, 1 TB), DGX H100/H200 (2× Xeon Platinum 8480C, 8 channels
#: DDR5-4800 each, 2 TB), DGX B200 (2× Xeon Platinum 8570, 8 channels DDR5-5600 each, 2 TB), a
#: GB200/GB300 NVL72 compute tray (2 Grace CPUs, LPDDR5X at up to 512 GB/s and 480 GB each, 4
#: GPUs), an 8× MI300X platform (2× EPYC 9654, 12 channels DDR5-4800 each, 1.5 TB); else
#: :data:`GENERIC_HOST`.
REFERENCE_HOSTS: tuple[tuple[str, HostServer], ...] = (
    (r"^V100", HostServer("DGX-1", 2 * 4 * 2.133 * 8, 512.0, 8)),
    (r"^A100-SXM|^A800", HostServer("DGX A100", 2 * 8 * 3.2 * 8, 1024.0, 8)),
    (r"^H100-SXM|^H200|^H800|^H20-", HostServer("DGX H100", 2 * 8 * 4.8 * 8, 2048.0, 8)),
    (r"^B200", HostServer("DGX B200", 2 * 8 * 5.6 * 8, 2048.0, 8)),
    (r"^GB200|^GB300", HostServer("GB200/GB300 NVL72 compute tray", 2 * 512.0, 2 * 480.0, 4)),
    (r"^MI300X", HostServer("8x MI300X platform", 2 * 12 * 4.8 * 8, 1536.0, 8)),
)


def reference_host(device_id: str) -> HostServer:
    """The reference server of a catalog device (:data:`REFERENCE_HOSTS`)."""
    return next((h for pattern, h in REFERENCE_HOSTS if re.search(pattern, device_id)), GENERIC_HOST)


def _host_link_GBps(text: str | None) -> float:
    """One direction of a device's link to its host: NVLink-C2C on Grace superchips, else PCIe x16
    of the catalog's generation (Gen4 when unstated)."""
    return _C2C_GBps_PER_GPU if "C2C" in (text or "") else _pcie_GBps(text)


def family_of(device_id: str) -> str:
    for pattern, family in _FAMILY_PATTERNS:
        if re.search(pattern, device_id):
            return family
    return "ampere"


def _nic_GBps(text: str | None) -> float | None:
    """Per-node NIC bandwidth from the catalog's description ('8x 200 Gb/s ...')."""
    if not text:
        return None
    count = re.search(r"(\d+)\s*x", text)
    rate = re.search(r"(\d+)\s*Gb/?p?s", text)
    if not rate:
        return None
    n = int(count.group(1)) if count else 1
    return n * int(rate.group(1)) / 8.0


def _pcie_GBps(text: str | None) -> float:
    m = re.search(r"Gen\s*(\d)", text or "")
    return _PCIE_GBps.get(m.group(1), 32.0) if m else 32.0


def _from_catalog_row(row: Mapping[str, Any]) -> DeviceSpec:
    dev_id = row["id"]
    family = family_of(dev_id)
    intra = row.get("intra_node_bandwidth_GBps") or _pcie_GBps(row.get("host_link"))
    inter = _nic_GBps(row.get("typical_inter_node_nic"))
    sxm_like = bool(row.get("intra_node_bandwidth_GBps"))
    host = reference_host(dev_id)
    if inter is None:
        # No documented NIC: SXM-class 8-GPU nodes get one 200 Gb/s HCA per GPU (DGX A100
        # layout); PCIe cards get a single 200 Gb/s NIC per node.
        inter = 200.0 if sxm_like else 25.0
    return DeviceSpec(
        name=dev_id,
        family=family,
        kind="gpu",
        memory_GB=float(row.get("memory_GB") or 0.0),
        memory_bandwidth_GBps=float(row.get("memory_bandwidth_GBps") or 0.0),
        bf16_tflops=row.get("bf16_dense_tflops"),
        fp16_tflops=row.get("fp16_dense_tflops"),
        fp8_tflops=row.get("fp8_dense_tflops"),
        fp32_tflops=row.get("fp32_tflops"),
        fp4_tflops=row.get("fp4_dense_tflops"),
        intra_node_bandwidth_GBps=float(intra),
        inter_node_bandwidth_GBps=float(inter),
        # A node is an NVLink domain: 8 GPUs on an HGX/DGX baseboard, the whole rack (72) on
        # GB200/GB300 NVL72, whose NVLink Switch System joins every GPU of the rack at the full
        # NVLink 5 rate (the catalog's ``nvlink_domain_gpus``).
        gpus_per_node=int(row.get("nvlink_domain_gpus") or 8),
        efficiency=FAMILY_EFFICIENCY[family],
        host_link_GBps=_host_link_GBps(row.get("host_link")),
        host_memory_bandwidth_GBps=host.dram_GBps_per_gpu,
        host_memory_GB=host.dram_GB_per_gpu,
        source=row.get("source", ""),
    )


@lru_cache(maxsize=1)
def _catalog_rows() -> tuple[Mapping[str, Any], ...]:
    text = resources.files("cost_model").joinpath("data/gpu_specs.json").read_text()
    return tuple(json.loads(text))


@lru_cache(maxsize=1)
def catalog() -> dict[str, DeviceSpec]:
    """All catalog devices that have a memory size and at least one compute peak."""
    out: dict[str, DeviceSpec] = {}
    for row in _catalog_rows():
        spec = _from_catalog_row(row)
        if spec.memory_GB <= 0 or not spec.supported_dtypes():
            continue
        out[spec.name] = spec
    out[LOCAL_CPU] = local_cpu_spec()
    return out


LOCAL_CPU = "local-cpu"

#: Product names as nvidia-smi, rocm-smi, GPU Feature Discovery labels and Paddle's cluster
#: JSON print them, and the short names people write in a cluster's ``device``, normalised by
#: :func:`normalise_product` (upper case, vendor words dropped, words joined by "-"), → catalog
#: id; a catalog id itself, normalised, needs no entry (:func:`catalog_id`).  A name maps to
#: exactly one entry: an export variant (H800, A800, H20) or another form factor (PCIe, NVL) is
#: its own entry, never its sibling's; a bare name is the SXM part (the training part: ``A100``
#: is the SXM4 80 GB, ``H100`` the SXM5).
PRODUCT_NAMES: dict[str, str] = {
    "V100": "V100-SXM2-32GB",
    "A100": "A100-SXM4-80GB",
    "A100-80GB": "A100-SXM4-80GB",
    "A100-40GB": "A100-SXM4-40GB",
    "A100-40GB-PCIE": "A100-PCIE-40GB",
    "A100-80GB-PCIE": "A100-PCIE-80GB",
    "A800": "A800-SXM4-80GB",
    "A800-80GB": "A800-SXM4-80GB",
    "H100": "H100-SXM5-80GB",
    "H100-SXM": "H100-SXM5-80GB",
    "H100-80GB": "H100-SXM5-80GB",
    "H100-80GB-HBM3": "H100-SXM5-80GB",
    "H100-PCIE": "H100-PCIE-80GB",
    "H100-NVL": "H100-NVL-94GB",
    "H800": "H800-SXM5-80GB",
    "H800-80GB": "H800-SXM5-80GB",
    "H800-80GB-HBM3": "H800-SXM5-80GB",
    "H200": "H200-SXM-141GB",
    "H200-SXM5": "H200-SXM-141GB",  # HGX H200 boards are listed as "H200 SXM5" beside H100 SXM5
    "H200-SXM5-141GB": "H200-SXM-141GB",
    "H200-141GB": "H200-SXM-141GB",
    "H200-141GB-HBM3E": "H200-SXM-141GB",
    "H20": "H20-96GB",
    "H20-96GB-HBM3": "H20-96GB",
    "B200": "B200-SXM-192GB",
    "GB200": "GB200-NVL72-186GB",
    "GB300": "GB300-NVL72-288GB",
    "L40S": "L40S-48GB",
    "L4": "L4-24GB",
    "A10": "A10-24GB",
    "MI250X-MI250": "MI250X",
    "MI300X-OAM": "MI300X",
}
_VENDOR_WORDS = {"NVIDIA", "TESLA", "AMD", "INSTINCT", "RADEON"}


def normalise_product(product: str) -> str:
    """A product name's key in :data:`PRODUCT_NAMES`: upper case, vendor words dropped, words
    joined by "-" (``NVIDIA H100 80GB HBM3`` → ``H100-80GB-HBM3``)."""
    words = [w for w in re.split(r"[\s_\-/]+", product.strip().upper()) if w and w not in _VENDOR_WORDS]
    return "-".join(words)


def catalog_id(name: str) -> str | None:
    """The catalog id ``name`` names — the id itself in any case and spelling
    :func:`normalise_product` folds (``NVIDIA A100-SXM4-80GB``), or a product name of
    :data:`PRODUCT_NAMES` — or None."""
    cat = catalog()
    if name in cat:
        return name
    key = normalise_product(name)
    by_key = {normalise_product(cid): cid for cid in cat}
    mapped = by_key.get(key) or PRODUCT_NAMES.get(key)
    return mapped if mapped in cat else None


def device_matches(device_name: str, names: Iterable[str]) -> bool:
    """Whether a node group's device (its catalog id, or an inline device's own name) is one of
    ``names`` — catalog ids (``parse_constraints`` resolves product names to them) or inline
    names; an inline device named like a catalog part (``H100``) matches that part's id."""
    wanted = set(names)
    return device_name in wanted or catalog_id(device_name) in wanted


def closest_catalog_ids(name: str, n: int = 3) -> list[str]:
    """Catalog ids whose ids or product names look most like ``name`` (for error messages)."""
    cat = catalog()
    known = sorted(set(PRODUCT_NAMES) | {c for c in cat if c != LOCAL_CPU})
    close = difflib.get_close_matches(normalise_product(name), known, n=n, cutoff=0.3)
    return list(dict.fromkeys(PRODUCT_NAMES.get(c, c) for c in close))


def _meminfo_GB() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return bytes_to_gb(kib_to_bytes(int(line.split()[1])))
    except OSError:
        pass
    return 16.0


_CPU_DEFAULT_CLOCK_HZ = 2.5e9
_CPU_FP32_FLOP_PER_CYCLE = 32


def local_cpu_spec() -> DeviceSpec:
    """This host's CPU as a device.  Catalog guesses only: a profile replaces them.

    Default peak: cores × 2.5 GHz × 32 fp32 FLOP/cycle (two AVX2 FMA units); memory bandwidth
    10 GB/s per core up to 50 GB/s.  These are deliberately generic; ``planner profile``
    measures the real figures.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    peak = flops_to_tflops(cores * _CPU_DEFAULT_CLOCK_HZ * _CPU_FP32_FLOP_PER_CYCLE)
    return DeviceSpec(
        name=LOCAL_CPU,
        family="cpu",
        kind="cpu",
        memory_GB=round(_meminfo_GB(), 2),
        memory_bandwidth_GBps=min(50.0, 10.0 * cores),
        bf16_tflops=None,
        fp16_tflops=None,
        fp8_tflops=None,
        fp32_tflops=peak,
        intra_node_bandwidth_GBps=5.0,
        inter_node_bandwidth_GBps=1.25,
        gpus_per_node=1,
        cores=cores,
        efficiency=FAMILY_EFFICIENCY["cpu"],
        source="this host (/proc/meminfo, sched_getaffinity); peak and bandwidth are generic guesses",
    )


def get_device(name: str, field_path: str = "device") -> DeviceSpec:
    """Look a device up by catalog id (case-insensitive) or product name (:data:`PRODUCT_NAMES`:
    ``H800``, ``NVIDIA H100 80GB HBM3``, ``a100-40gb``)."""
    cid = catalog_id(name)
    if cid is not None:
        return catalog()[cid]
    close = closest_catalog_ids(name)
    raise UnknownName(
        f"unknown device {name!r}"
        + (f"; closest catalog entries: {', '.join(close)}" if close else "")
        + f"; known devices: {', '.join(sorted(catalog()))} "
        "(or give an inline spec with memory_GB, memory_bandwidth_GBps and a *_tflops peak)",
        field=field_path,
    )


def device_from_dict(spec: Mapping[str, Any], field_path: str = "device") -> DeviceSpec:
    """An inline custom device.  Required: name, memory_GB, memory_bandwidth_GBps and at least
    one of bf16_tflops / fp16_tflops / fp8_tflops / fp32_tflops (fp4_tflops too).  Optional: family (selects the
    efficiency constants), kind, intra/inter bandwidths, and the host optimizer offload runs on
    (``host_link_GBps``, ``host_memory_bandwidth_GBps``, ``host_memory_GB``: this device's share;
    the generic server's, :data:`GENERIC_HOST`, when left out)."""
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidCluster("an inline device needs a non-empty 'name'", field=f"{field_path}.name")
    for key in ("memory_GB", "memory_bandwidth_GBps"):
        val = spec.get(key)
        if not isinstance(val, (int, float)) or isinstance(val, bool) or val <= 0:
            raise InvalidCluster(f"must be a positive number, got {val!r}", field=f"{field_path}.{key}")
    peaks: dict[str, float] = {}
    for key in ("bf16_tflops", "fp16_tflops", "fp8_tflops", "fp32_tflops", "fp4_tflops"):
        val = spec.get(key)
        if val is None:
            continue
        if not isinstance(val, (int, float)) or isinstance(val, bool) or val <= 0:
            raise InvalidCluster(f"must be a positive number, got {val!r}", field=f"{field_path}.{key}")
        peaks[key] = float(val)
    if not peaks:
        raise InvalidCluster(
            "an inline device needs at least one of bf16_tflops, fp16_tflops, fp8_tflops, fp32_tflops",
            field=field_path,
        )
    family = spec.get("family") or family_of(name)
    if family not in FAMILY_EFFICIENCY:
        raise InvalidCluster(
            f"unknown family {family!r}; one of {', '.join(FAMILY_EFFICIENCY)}", field=f"{field_path}.family"
        )
    kind = spec.get("kind", "cpu" if family == "cpu" else "gpu")
    intra = spec.get("intra_node_bandwidth_GBps", 32.0)
    inter = spec.get("inter_node_bandwidth_GBps", 25.0)
    # the host optimizer offload runs on (DeviceSpec): the generic server's unless stated
    host = {"host_link_GBps": DEFAULT_HOST_LINK_GBps, "host_memory_bandwidth_GBps": GENERIC_HOST.dram_GBps_per_gpu,
            "host_memory_GB": GENERIC_HOST.dram_GB_per_gpu}
    host.update({k: spec[k] for k in host if spec.get(k) is not None})
    for key, val in (("intra_node_bandwidth_GBps", intra), ("inter_node_bandwidth_GBps", inter), *host.items()):
        if not isinstance(val, (int, float)) or isinstance(val, bool) or val <= 0:
            raise InvalidCluster(f"must be a positive number, got {val!r}", field=f"{field_path}.{key}")
    return DeviceSpec(
        name=name,
        family=family,
        kind=kind,
        memory_GB=float(spec["memory_GB"]),
        memory_bandwidth_GBps=float(spec["memory_bandwidth_GBps"]),
        intra_node_bandwidth_GBps=float(intra),
        inter_node_bandwidth_GBps=float(inter),
        cores=spec.get("cores"),
        efficiency=FAMILY_EFFICIENCY[family],
        host_link_GBps=float(host["host_link_GBps"]),
        host_memory_bandwidth_GBps=float(host["host_memory_bandwidth_GBps"]),
        host_memory_GB=float(host["host_memory_GB"]),
        source="inline",
        bf16_tflops=peaks.get("bf16_tflops"),
        fp16_tflops=peaks.get("fp16_tflops"),
        fp8_tflops=peaks.get("fp8_tflops"),
        fp32_tflops=peaks.get("fp32_tflops"),
        fp4_tflops=peaks.get("fp4_tflops"),
    )


def resolve_device(value: Any, field_path: str = "device") -> DeviceSpec:
    if isinstance(value, DeviceSpec):
        return value
    if isinstance(value, str):
        return get_device(value, field_path)
    if isinstance(value, Mapping):
        return device_from_dict(value, field_path)
    raise InvalidCluster("must be a catalog device name or an inline device object", field=field_path)
