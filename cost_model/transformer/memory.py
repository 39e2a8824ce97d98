"""Peak memory as a measured quantity: its interval and what "fits" means.

What the cost model predicts (``peak_memory_GB`` of an estimate and of each stage) is the
**device-level peak**: PyTorch's caching allocator's ``torch.cuda.max_memory_reserved()``
(allocated tensors plus the allocator's fragmentation, ``layer_cost.fragmentation_fraction()`` of them) plus
the CUDA context, cuBLAS workspaces and NCCL buffers (``WORKSPACE_BYTES``) — what
``nvidia-smi`` shows and what runs out first.  :data:`PEAK_MEMORY_QUANTITY` names it in every
prediction.

The interval: (q10, q90) of log(predicted/measured) over the measured peaks of the public
file (the BLOOM topology sweep's "Mem" column: max memory of the first/last stage GPUs), written
by ``bench/acceptance.py --write`` to ``cost_model/data/memory_interval.json`` with its
provenance.  The true peak lies in [peak·e^−q90, peak·e^−q10] 80% of the time (the bounds swap
as for step times, :func:`cost_model.transformer.calibration.prediction_intervals`).  Without
the file the prior is the fragmentation reserve either side.

Those peaks were all measured under one framework (Megatron-DeepSpeed; the file's
``frameworks``), so their residuals say how well the fragmentation fraction fitted there holds
there, not under another framework's allocation pattern (Transformer Engine's buffers,
Megatron-Core's distributed optimizer, FSDP's unsharded copies).  For a framework without
measured peaks (:data:`INTERVAL_BASES`: ``fragmentation-bounds``) the interval is widened by
what that fraction could be instead (:data:`UNMEASURED_FRAGMENTATION`) — a bound, not a fit: from
none (a reserved/allocated of 1.0: PyTorch's expandable segments,
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, map memory as blocks grow instead of
caching fixed segments, and large-model launchers set it) to the 1.3 PyTorch reports on
large-model runs without them, or the measured framework's own fraction where that is larger
(over gradients and activations alone the BLOOM peaks read as more: ``bench/acceptance.py``'s
``fragmentation_bases``, in the README) — applied to what
fragments: the reserve the peak carries for it (the workspace beyond ``WORKSPACE_BYTES``,
f × the gradients and activations freed and reallocated during a step), not the resident
weights and optimizer state, allocated once, nor the fixed context and buckets.  With reserve R in a
predicted peak P, a true fraction g reads P + R·(g/f − 1).  (Widening the whole peak instead, as
an earlier version did, put the p10 of a layout whose sharded state nearly filled the device well
below that state: ``bench/physics_cases.py`` ``memory_interval_state_dominated``, 671B
DeepSeek-V3 under FSDP on 128 A800 with 85 GB of state per GPU.)
That range is a ratio of bytes, while the fitted fraction f also carries the printed figures'
units (below: 1 + f = (1 + g)·10^9/2^30 for a true reserve g), so the range is put in f's
convention first (:func:`fitted_convention`).  (Compared as given, the range would have stood
7% above what it says — 1.0–1.3 read as the fitted fraction's 0–0.30 is a true 1.07–1.40.)

Both ends are affine in a stage's peak and reserve (:class:`MemoryBound`), so the search's
tables test them as they test the peak: per stage a + b·layers.

Units: the sweep's "Mem" figures and the devices' ``memory_GB`` are both compared as printed.
Both are most likely binary (the sweep's largest figure is 79 on 80 GiB A100s, as nvidia-smi's
MiB/1024 would read; HBM capacities are 2^30-byte multiples), so the fitted fraction also absorbs
the 2^30/10^9 ratio and a verdict compares like with like.  Converting both to bytes was tried
once, by hand (a patched run of bench/acceptance.py's plans and fit, not kept as a benchmark:
fraction refitted to 0.31): peaks within 10% fell from 45/48 to 44/47 and one measured BLOOM run
was refused, so the file's convention is kept.

Feasibility against a usable memory U (the device's memory × (1 − headroom); headroom 0 unless
``constraints.memory_headroom_fraction`` says otherwise — the interval is the margin):

* ``fits``: p90 ≤ U — safe;
* ``tight``: p10 ≤ U < p90 — kept, flagged, ranked after the safe ones;
* ``does_not_fit``: p10 > U — rejected.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from cost_model.frameworks import rules_for
from cost_model.transformer.layer_cost import WORKSPACE_BYTES, fragmentation_fraction
from cost_model.units import bytes_to_gb, bytes_to_gib, gb_to_bytes

PEAK_MEMORY_QUANTITY = "max_reserved"
PEAK_MEMORY_QUANTITY_DESCRIPTION = (
    "device-level peak: torch.cuda.max_memory_reserved (allocated tensors + caching-allocator "
    "fragmentation) + CUDA context, cuBLAS workspaces and NCCL buffers"
)
MEMORY_FITS = ("fits", "tight", "does_not_fit")
#: Where a memory interval comes from: the residuals of its framework's measured peaks, or
#: those widened by the fragmentation's range (module docstring).
INTERVAL_BASES = ("measured-peaks", "fragmentation-bounds")
#: The caching allocator's reserve over fragmenting memory a framework without measured peaks
#: may have: none under expandable segments, up to PyTorch's reserved/allocated of 1.3 on
#: large-model runs without them (layer_cost's comment; module docstring).
UNMEASURED_FRAGMENTATION = (0.0, 0.3)
_DATA = "data/memory_interval.json"


def _prior() -> tuple[float, float]:
    band = math.log1p(fragmentation_fraction() / (1.0 + fragmentation_fraction()))
    return -band, band


@lru_cache(maxsize=1)
def stored_interval() -> dict[str, Any]:
    """The stored document (``log_interval`` [q10, q90] and its provenance), {} when absent."""
    try:
        doc: dict[str, Any] = json.loads(resources.files("cost_model").joinpath(_DATA).read_text())
    except FileNotFoundError:
        return {}
    return doc


def interval_basis(framework: str) -> str:
    """``measured-peaks`` when the stored interval was measured under ``framework``, else
    ``fragmentation-bounds`` (module docstring).  A stored file without ``frameworks`` (or no
    file: the prior) covers none."""
    measured = stored_interval().get("frameworks") or ()
    return INTERVAL_BASES[0] if framework in measured else INTERVAL_BASES[1]


def as_printed_GB(measured_GB: float) -> float:
    """A peak measured in GB of 10^9 bytes (what the observation parsers store, converting the
    MiB/GiB the allocator prints) as predicted peaks and the catalog's device memories are
    compared: as printed, binary (module docstring: Units) — ``measured_GB``·10^9/2^30.  A log's
    "max reserved: 74,000 MiB" on an "80 GB" GPU is 77.6 GB of bytes but 72.3 against the 80."""
    return float(bytes_to_gib(gb_to_bytes(measured_GB)))


def fitted_convention(true_fraction: float) -> float:
    """A caching allocator's true reserve ``g`` (reserved/allocated − 1, a ratio of bytes) as the
    fitted fraction would read it: ``(1 + g)·10^9/2^30 − 1``, since that fraction relates the
    predicted bytes in GB to peaks printed in GiB (module docstring: Units)."""
    return as_printed_GB(1.0 + true_fraction) - 1.0


@dataclass(frozen=True)
class MemoryBound:
    """One end of a stage's true-peak interval as an affine function of its predicted peak P and
    its fragmentation reserve R (bytes or GB alike): ``(P + reserve_weight·R) / exp(log_shift)``.
    ``log_shift``: the measured peaks' log-residual quantile (q90 for the p10 end: a prediction
    that high above the truth); ``reserve_weight``: g/f − 1 for the fragmentation fraction g that
    end assumes instead of the fitted f (0 where the framework's peaks were measured).
    :data:`POINT` is the prediction itself."""

    reserve_weight: float = 0.0
    log_shift: float = 0.0

    def of(self, peak: Any, reserve: Any) -> Any:
        """The bound (same units as ``peak``)."""
        return self.from_numerator(self.numerator(peak, reserve))

    def from_numerator(self, numerator: Any) -> Any:
        """The bound whose :meth:`numerator` is ``numerator``."""
        return numerator / math.exp(self.log_shift)

    def numerator(self, peak: Any, reserve: Any) -> Any:
        """``P + reserve_weight·R``: what the search's tables compare with :meth:`capacity`."""
        return peak + self.reserve_weight * reserve

    def capacity(self, usable: float) -> float:
        """The numerator's limit for a bound within ``usable`` memory."""
        return usable * math.exp(self.log_shift)

    def admits_all_of(self, other: MemoryBound) -> bool:
        """Every stage within ``other``'s limit is within this one's (R ≥ 0): the search reuses
        candidates costed at this bound for a search at ``other``."""
        return self.reserve_weight <= other.reserve_weight + 1e-12 and self.log_shift >= other.log_shift - 1e-12


POINT = MemoryBound()


def bounds(framework: str) -> tuple[MemoryBound, MemoryBound]:
    """The (p10, p90) ends of the true peak under ``framework`` (module docstring)."""
    iv = stored_interval().get("log_interval")
    q10, q90 = (float(iv[0]), float(iv[1])) if iv else _prior()
    if interval_basis(framework) == INTERVAL_BASES[0]:
        return MemoryBound(0.0, q90), MemoryBound(0.0, q10)
    f = fragmentation_fraction()
    lo, hi = (fitted_convention(g) for g in UNMEASURED_FRAGMENTATION)
    hi = max(hi, f)  # another framework may fragment as much as the measured one does
    # a smaller true fraction makes the true peak low (the p10 end), a larger one high
    return MemoryBound(lo / f - 1.0, q90), MemoryBound(hi / f - 1.0, q10)


def fragmentation_reserve_GB(memory_GB: Mapping[str, float]) -> float:
    """The fragmentation reserve of a stage's memory breakdown (GB): its workspace beyond the
    fixed ``WORKSPACE_BYTES`` (``stage_cost``: workspace = WORKSPACE_BYTES + f·fragmenting)."""
    return max(0.0, memory_GB.get("workspace", 0.0) - bytes_to_gb(WORKSPACE_BYTES))


def interval_GB(peak_GB: float, reserve_GB: float, framework: str) -> tuple[float, float]:
    """(p10, p90) of the true peak (GB) for a predicted ``peak_GB`` holding ``reserve_GB`` of
    fragmentation reserve (:func:`fragmentation_reserve_GB`) under ``framework``."""
    p10, p90 = bounds(framework)
    return p10.of(peak_GB, reserve_GB), p90.of(peak_GB, reserve_GB)


def memory_interval_fields(peak_GB: float, memory_GB: Mapping[str, float], framework: str) -> dict[str, Any]:
    """The memory-interval fields of a prediction (``peak_memory_GB_p10``/``_p90``,
    ``memory_interval_basis``) for the stage with the largest predicted peak ``peak_GB`` and its
    memory breakdown ``memory_GB`` — one reading for transformer and operator-graph estimates."""
    p10, p90 = interval_GB(peak_GB, fragmentation_reserve_GB(memory_GB), framework)
    return {"peak_memory_GB_p10": p10, "peak_memory_GB_p90": p90, "memory_interval_basis": interval_basis(framework)}


def memory_fit(peak_GB: float, reserve_GB: float, usable_GB: float, framework: str) -> str:
    """``fits`` | ``tight`` | ``does_not_fit`` of one stage under ``framework`` (module docstring)."""
    p10, p90 = interval_GB(peak_GB, reserve_GB, framework)
    if p10 > usable_GB + 1e-9:
        return "does_not_fit"
    if p90 > usable_GB + 1e-9:
        return "tight"
    return "fits"


def churned_gradients(gradients: Any, framework: str) -> Any:
    """The gradient bytes the caching allocator's fragmentation touches under ``framework``:
    all of them where ``.grad`` tensors are allocated and freed every step, none where they live
    in a buffer allocated once (``FrameworkRules.persistent_grad_buffer``: Megatron-Core's)."""
    return 0.0 * gradients if rules_for(framework).persistent_grad_buffer else gradients


def static_for_fragmentation(weights: Any, gradients: Any, optimizer_state: Any, framework: str) -> Any:
    """Model state (bytes) such that ``× (1 + fragmentation_fraction())`` is the reserved size:
    gradients fragment (:func:`churned_gradients`), the resident weights and the optimizer state
    (allocated once) do not — for the operator-graph cost and solvers, which scale static bytes
    by (1 + fragmentation)."""
    churned = churned_gradients(gradients, framework)
    return churned + (weights + gradients - churned + optimizer_state) / (1.0 + fragmentation_fraction())


def reload() -> None:
    """Forget the cached interval and fragmentation fraction (after ``bench/acceptance.py --write``)."""
    stored_interval.cache_clear()
    fragmentation_fraction.cache_clear()
