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

Feasibility against a usable memory U (the device's memory × (1 − headroom); headroom 0 unless
``constraints.memory_headroom_fraction`` says otherwise — the interval is the margin):

* ``fits``: p90 ≤ U — safe;
* ``tight``: p10 ≤ U < p90 — kept, flagged, ranked after the safe ones;
* ``does_not_fit``: p10 > U — rejected.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any

from cost_model.transformer.layer_cost import fragmentation_fraction

PEAK_MEMORY_QUANTITY = "max_reserved"
PEAK_MEMORY_QUANTITY_DESCRIPTION = (
    "device-level peak: torch.cuda.max_memory_reserved (allocated tensors + caching-allocator "
    "fragmentation) + CUDA context, cuBLAS workspaces and NCCL buffers"
)
MEMORY_FITS = ("fits", "tight", "does_not_fit")
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


def log_interval() -> tuple[float, float]:
    """(q10, q90) of log(predicted/measured) peak memory."""
    iv = stored_interval().get("log_interval")
    if not iv:
        return _prior()
    return float(iv[0]), float(iv[1])


def interval_GB(peak_GB: float) -> tuple[float, float]:
    """(p10, p90) of the true peak (GB) for a predicted ``peak_GB``."""
    q10, q90 = log_interval()
    return peak_GB / math.exp(q90), peak_GB / math.exp(q10)


def fit_capacity_factor() -> float:
    """A stage with predicted peak P does not fit usable memory U iff P > U·factor (its p10
    exceeds U): the factor the search multiplies usable memory by to keep affine tables."""
    return math.exp(log_interval()[1])


def safe_capacity_factor() -> float:
    """P fits safely (p90 ≤ U) iff P ≤ U·factor."""
    return math.exp(log_interval()[0])


def memory_fit(peak_GB: float, usable_GB: float) -> str:
    """``fits`` | ``tight`` | ``does_not_fit`` of one stage (module docstring)."""
    p10, p90 = interval_GB(peak_GB)
    if p10 > usable_GB + 1e-9:
        return "does_not_fit"
    if p90 > usable_GB + 1e-9:
        return "tight"
    return "fits"


def static_for_fragmentation(weights: Any, gradients: Any, optimizer_state: Any) -> Any:
    """Model state (bytes) such that ``× (1 + fragmentation_fraction())`` is the reserved size:
    weights and gradients fragment, optimizer state (allocated once) does not — for the
    operator-graph cost and solvers, which scale static bytes by (1 + fragmentation)."""
    return weights + gradients + optimizer_state / (1.0 + fragmentation_fraction())


def reload() -> None:
    """Forget the cached interval and fragmentation fraction (after ``bench/acceptance.py --write``)."""
    stored_interval.cache_clear()
    fragmentation_fraction.cache_clear()
