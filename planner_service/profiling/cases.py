"""What a micro-benchmark measures: a :class:`Case` is one profile measurement to be taken.

Cases are planned first (so the progress bar knows the total) and set up lazily (so only one
case's buffers are alive at a time).  ``fields`` become the measurement object of the profile
(op, backend, dtype, shape, bytes, kernels, ...); the timing fields are added when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cost_model.units import BYTES_PER_KIB, BYTES_PER_MIB, mib_to_bytes


@dataclass(frozen=True)
class Case:
    label: str
    fields: dict[str, Any]
    #: returns (fn, sync): the callable to time and the function that waits for the device
    setup: Callable[[], tuple[Callable[[], object], Callable[[], object]]]
    cost_hint: float = 1.0  # relative cost, for ordering/progress only
    extra: dict[str, Any] = field(default_factory=dict)


def gemm_grid(dims: tuple[int, ...]) -> list[tuple[int, int, int]]:
    return [(m, n, k) for m in dims for n in dims for k in dims]


def elements_grid(quick: bool) -> tuple[int, ...]:
    """Element counts for memory-bound ops: from cache-resident to well beyond the LLC."""
    return (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24) if quick else tuple(1 << p for p in range(12, 27))


def last_level_cache_bytes() -> int:
    """Size of this CPU's largest cache (sysfs), 32 MiB when unknown."""
    import glob

    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as fh:
                text = fh.read().strip().upper()
        except OSError:
            continue
        mult = BYTES_PER_MIB if text.endswith("M") else BYTES_PER_KIB if text.endswith("K") else 1
        try:
            best = max(best, int(int(text.rstrip("KMG")) * mult))
        except ValueError:
            continue
    return best or int(mib_to_bytes(32))


def rotation_count(bytes_per_set: int, cache_bytes: int, cap: int = 64) -> int:
    """How many input sets to cycle through so that each call reads operands that are not in
    the cache (their total exceeds twice the cache): training reads activations produced long
    before, not the hot result of the previous call."""
    return int(min(cap, max(1, -(-2 * cache_bytes // max(bytes_per_set, 1)))))
