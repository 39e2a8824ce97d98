"""Units: the only place where the decimal prefixes of the public contract are written down.

The v1 contract states units in names (``../shared/DESIGN.md``): ``_GB`` is 1e9 bytes, ``_GBps``
1e9 bytes per second in one direction, ``_tflops`` 1e12 FLOP/s, ``_s`` seconds, ``_bytes`` bytes.
Inside the cost model every quantity is kept in base SI units (bytes, seconds, FLOP, FLOP/s,
bytes/s); conversions to and from the contract's units go through these helpers, so a prefix is
never spelled as a bare ``1e9`` in a formula.

All helpers are plain arithmetic and work element-wise on numpy arrays as well as on floats.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

#: Bytes in one GB (decimal, as GPU vendors and the contract count memory).
BYTES_PER_GB = 1e9
#: Bytes in one GiB (binary; what ``nvidia-smi`` and the CUDA allocator print as "MiB"/"GiB").
BYTES_PER_GIB = float(2**30)
#: Bytes in one MiB.
BYTES_PER_MIB = float(2**20)
#: FLOP/s in one TFLOP/s.
FLOPS_PER_TFLOPS = 1e12
#: Bits in one byte (network links are quoted in Gb/s).
BITS_PER_BYTE = 8.0
#: Seconds in one millisecond / microsecond (logs and traces report ms and us).
S_PER_MS = 1e-3
S_PER_US = 1e-6
#: Seconds in one hour (prices are per GPU-hour).
S_PER_HOUR = 3600.0
#: One million (tokens, parameters: "per million tokens" prices, "M" parameter counts).
MILLION = 1e6
#: One billion (parameter counts quoted as "B").
BILLION = 1e9

Num = TypeVar("Num", float, np.ndarray)


def gb_to_bytes(gb: Num) -> Num:
    """GB (1e9 bytes) → bytes."""
    return gb * BYTES_PER_GB


def bytes_to_gb(n_bytes: Num) -> Num:
    """Bytes → GB (1e9 bytes)."""
    return n_bytes / BYTES_PER_GB


def gib_to_bytes(gib: Num) -> Num:
    """GiB (2^30 bytes) → bytes."""
    return gib * BYTES_PER_GIB


def mib_to_bytes(mib: Num) -> Num:
    """MiB (2^20 bytes) → bytes."""
    return mib * BYTES_PER_MIB


def bytes_to_gib(n_bytes: Num) -> Num:
    """Bytes → GiB (2^30 bytes)."""
    return n_bytes / BYTES_PER_GIB


def gbps_to_bytes_per_s(gbps: Num) -> Num:
    """GB/s (1e9 bytes per second) → bytes per second."""
    return gbps * BYTES_PER_GB


def bytes_per_s_to_gbps(bytes_per_s: Num) -> Num:
    """Bytes per second → GB/s (1e9 bytes per second)."""
    return bytes_per_s / BYTES_PER_GB


def gbit_to_gbyte_per_s(gbit_per_s: Num) -> Num:
    """A link quoted in Gb/s (1e9 bits per second) → GB/s."""
    return gbit_per_s / BITS_PER_BYTE


def tflops_to_flops(tflops: Num) -> Num:
    """TFLOP/s → FLOP/s."""
    return tflops * FLOPS_PER_TFLOPS


def flops_to_tflops(flops: Num) -> Num:
    """FLOP/s (or FLOP) → TFLOP/s (or TFLOP)."""
    return flops / FLOPS_PER_TFLOPS


def ms_to_s(ms: Num) -> Num:
    """Milliseconds → seconds."""
    return ms * S_PER_MS


def us_to_s(us: Num) -> Num:
    """Microseconds → seconds."""
    return us * S_PER_US


def s_to_ms(s: Num) -> Num:
    """Seconds → milliseconds."""
    return s / S_PER_MS


#: Bytes in one KiB (``/proc/meminfo`` reports "kB" that are KiB).
BYTES_PER_KIB = 1024.0
#: Bytes in one MB (decimal; file-size limits in messages).
BYTES_PER_MB = 1e6
#: FLOP/s in one GFLOP/s.
FLOPS_PER_GFLOPS = 1e9
#: Seconds in one nanosecond.
S_PER_NS = 1e-9


def kib_to_bytes(kib: Num) -> Num:
    """KiB (1024 bytes) → bytes."""
    return kib * BYTES_PER_KIB


def bytes_to_mib(n_bytes: Num) -> Num:
    """Bytes → MiB (2^20 bytes)."""
    return n_bytes / BYTES_PER_MIB


def bytes_to_mb(n_bytes: Num) -> Num:
    """Bytes → MB (1e6 bytes)."""
    return n_bytes / BYTES_PER_MB


def flops_to_gflops(flops: Num) -> Num:
    """FLOP/s → GFLOP/s."""
    return flops / FLOPS_PER_GFLOPS


def s_to_us(s: Num) -> Num:
    """Seconds → microseconds."""
    return s / S_PER_US


def s_to_ns(s: Num) -> Num:
    """Seconds → nanoseconds."""
    return s / S_PER_NS
