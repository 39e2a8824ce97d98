"""Timing harness shared by the micro-benchmark backends.

Each measurement: one untimed call (also used to size the inner loop), ``warmup`` more untimed
calls, then up to ``repeats`` samples.  A sample times ``inner`` back-to-back calls (``inner`` is
chosen so that a sample lasts at least ``min_sample_s``, which keeps the clock resolution and
Python overhead out of microsecond-scale ops) and divides by ``inner``.  Sampling stops early
when ``budget_s`` is spent (after at least ``min_repeats`` samples).  The reported time is the
median sample; the spread is min, max and inter-quartile range.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    seconds: float  # median per call
    repeats: int  # samples taken
    inner: int  # calls per sample
    min_s: float
    max_s: float
    iqr_s: float

    def to_fields(self) -> dict:
        return {
            "seconds": self.seconds,
            "repeats": self.repeats,
            "inner": self.inner,
            "spread": {"min_s": self.min_s, "max_s": self.max_s, "iqr_s": self.iqr_s},
        }


@dataclass(frozen=True)
class TimingSettings:
    warmup: int = 2
    repeats: int = 7
    min_repeats: int = 3
    min_sample_s: float = 2e-3
    budget_s: float = 1.0
    max_inner: int = 10_000

    @staticmethod
    def quick() -> TimingSettings:
        return TimingSettings(warmup=1, repeats=5, min_repeats=3, min_sample_s=1e-3, budget_s=0.35)

    def to_dict(self) -> dict:
        return {
            "warmup": self.warmup,
            "repeats": self.repeats,
            "min_repeats": self.min_repeats,
            "min_sample_s": self.min_sample_s,
            "budget_s": self.budget_s,
        }


def _noop() -> None:
    return None


def measure(fn: Callable[[], object], settings: TimingSettings, sync: Callable[[], object] = _noop) -> Timing:
    """Time ``fn`` (``sync`` waits for asynchronous devices before the clock is read)."""
    clock = time.perf_counter
    t0 = clock()
    fn()
    sync()
    first = max(clock() - t0, 1e-9)
    inner = int(min(settings.max_inner, max(1, math.ceil(settings.min_sample_s / first))))
    for _ in range(settings.warmup):
        for _ in range(inner if first < settings.min_sample_s else 1):
            fn()
        sync()
    samples: list[float] = []
    start = clock()
    while len(samples) < settings.repeats:
        t0 = clock()
        for _ in range(inner):
            fn()
        sync()
        samples.append((clock() - t0) / inner)
        if len(samples) >= settings.min_repeats and clock() - start > settings.budget_s:
            break
    arr = np.asarray(samples)
    q1, q3 = np.quantile(arr, [0.25, 0.75])
    return Timing(
        seconds=float(np.median(arr)),
        repeats=len(samples),
        inner=inner,
        min_s=float(arr.min()),
        max_s=float(arr.max()),
        iqr_s=float(q3 - q1),
    )
