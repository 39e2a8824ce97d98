"""Operator profiles: validation, calibration (least-squares fit) and application to a device.

A *profile* is the versioned JSON document that ``planner profile`` writes (micro-benchmarks on a
host) or that the trace importer builds from a PyTorch profiler trace.  Its format is documented in
``docs/PROFILE_FORMAT.md``; :func:`validate_profile` enforces it.  This module is pure: no I/O
besides :func:`load_profile_file`, no torch, no global state.

Calibration keeps the cost model's functional forms (``cost_model.compute`` and
``cost_model.comm``) and fits their parameters to the measurements:

* GEMMs (``op: gemm``), per dtype::

      t = max(2·m·n·k / (R_dtype · σ(m)σ(n)σ(k)),  bytes / BW) · batch + t_launch,
      σ(d) = d / (d + d_half)

  For a fixed ``d_half`` the model is linear in ``1/R_dtype``, ``1/BW`` and ``t_launch`` (once each
  GEMM is classified as compute- or memory-bound), so it is solved by ``numpy.linalg.lstsq`` on
  rows divided by the measured time (i.e. minimising *relative* error), with ``d_half`` chosen by
  a log-spaced grid search and the classification iterated to a fixed point.
* Streaming ops without special arithmetic (``add``, ``copy``, ``scale``, ``layernorm``) whose
  output is below the device's first-touch threshold: ``t = bytes / BW + kernels · t_launch``
  (:func:`cost_model.compute.memory_bound_time_s`), fitted jointly with the GEMMs (they share
  ``BW`` and ``t_launch``).
* Per-element arithmetic (same function, ``t = max(bytes / BW, n · c) + t_launch``): ``c_exp``
  from ``gelu`` and ``softmax``, ``c_rng`` from ``dropout`` — each the median over sizes of
  ``(t − t_launch) / n``, kept only where it exceeds the bytes' time (else 0: memory-bound).
* First touch (:func:`cost_model.compute.first_touch_s`): the median over the streaming ops
  whose fresh outputs reach ``first_touch_min_bytes`` of (measured − modelled without it) per
  output byte.
* Collectives (``allreduce``, ``allgather``, ``reduce_scatter``, ``sendrecv``) over ``n`` ranks
  moving ``S`` bytes: ``t = c_v·(n−1)/n·S/β + c_s·(n−1)·α`` with the ring factors of
  :mod:`cost_model.comm` (all-reduce c_v = c_s = 2; all-gather / reduce-scatter 1; send/recv
  ``S/β + α``), linear in ``1/β`` and ``α``.

The fitted rates become an :class:`~cost_model.devices.Efficiency`:
``gemm_max_fraction = R_primary / peak_primary``, ``memory_fraction = BW / memory_bandwidth``,
``nvlink_fraction = β / intra_node_bandwidth``.  A fraction above 1 means the catalog figure is
too low (always possible for ``local-cpu``, whose figures are generic guesses): the device's
figure is then replaced by the measured one and the fraction set to 1, so predictions reproduce
the measurements either way.  GEMM rates of secondary dtypes are expressed as corrected peaks for
those dtypes (the Efficiency has one ``gemm_max_fraction``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from cost_model.devices import (
    BYTES_PER_ELEMENT,
    DTYPES,
    DeviceSpec,
    Efficiency,
    get_device,
)
from cost_model.errors import InvalidProfile, UnknownName
from cost_model.units import (
    S_PER_HOUR,
    bytes_per_s_to_gbps,
    bytes_to_mb,
    flops_to_tflops,
    gbps_to_bytes_per_s,
    mib_to_bytes,
)

SCHEMA_NAME = "planner-profile"
SCHEMA_VERSION = 1
#: Versions this code reads.  (Version 0 was never released outside development builds.)
SUPPORTED_SCHEMA_VERSIONS = (1,)
FIT_VERSION = 2
#: Memory-bound ops whose per-element arithmetic is fitted, by the Efficiency term it sets.
TRANSCENDENTAL_OPS = ("gelu", "softmax")
RNG_OPS = ("dropout",)

MAX_PROFILE_BYTES = int(mib_to_bytes(16))
MAX_MEASUREMENTS = 50_000
MAX_SECONDS = S_PER_HOUR
MAX_DIM = 10_000_000

GEMM_OPS = ("gemm",)
MEMORY_OPS = ("add", "copy", "scale", "gelu", "layernorm", "softmax", "dropout")
COLLECTIVE_OPS = ("allreduce", "allgather", "reduce_scatter", "sendrecv", "alltoall")
OTHER_OPS = ("attention", "h2d", "d2h", "op_overhead")
KNOWN_OPS = GEMM_OPS + MEMORY_OPS + COLLECTIVE_OPS + OTHER_OPS

#: Collective ring factors (volume factor c_v, latency-steps factor c_s) as in cost_model.comm.
_COLLECTIVE_FACTORS = {
    "allreduce": (2.0, 2.0),
    "allgather": (1.0, 1.0),
    "reduce_scatter": (1.0, 1.0),
    "alltoall": (1.0, 1.0),
}



# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------
def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))


def _number_or(value: Any, default: float) -> float:
    return float(value) if _is_number(value) else default


def _positive_int(value: Any, field: str, maximum: int = MAX_DIM) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidProfile(f"must be a positive integer, got {value!r}", field=field)
    if value > maximum:
        raise InvalidProfile(f"must be at most {maximum}, got {value}", field=field)
    return value


def _seconds(value: Any, field: str, allow_zero: bool = False) -> float:
    if not _is_number(value):
        raise InvalidProfile(f"must be a finite number of seconds, got {value!r}", field=field)
    seconds = float(value)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidProfile(f"must be {'non-negative' if allow_zero else 'positive'}, got {seconds!r}", field=field)
    if seconds > MAX_SECONDS:
        raise InvalidProfile(f"must be at most {MAX_SECONDS:g} s, got {seconds!r}", field=field)
    return seconds


def _validate_measurement(m: Any, path: str) -> None:
    if not isinstance(m, Mapping):
        raise InvalidProfile("must be an object", field=path)
    op = m.get("op")
    if op not in KNOWN_OPS:
        raise InvalidProfile(f"unknown op {op!r}; one of {', '.join(KNOWN_OPS)}", field=f"{path}.op")
    sec = _seconds(m.get("seconds"), f"{path}.seconds")
    if "repeats" in m:
        _positive_int(m["repeats"], f"{path}.repeats", 10_000_000)
    spread = m.get("spread")
    if spread is not None:
        if not isinstance(spread, Mapping):
            raise InvalidProfile("must be an object with min_s / max_s", field=f"{path}.spread")
        lo = _seconds(spread["min_s"], f"{path}.spread.min_s", allow_zero=True) if "min_s" in spread else None
        hi = _seconds(spread["max_s"], f"{path}.spread.max_s", allow_zero=True) if "max_s" in spread else None
        if "iqr_s" in spread:
            _seconds(spread["iqr_s"], f"{path}.spread.iqr_s", allow_zero=True)
        tol = 1e-9 + 1e-6 * sec
        if lo is not None and lo > sec + tol:
            raise InvalidProfile(f"min_s {lo!r} exceeds the median seconds {sec!r}", field=f"{path}.spread.min_s")
        if hi is not None and hi + tol < sec:
            raise InvalidProfile(f"max_s {hi!r} is below the median seconds {sec!r}", field=f"{path}.spread.max_s")
    dtype = m.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise InvalidProfile(f"must be one of {', '.join(DTYPES)}, got {dtype!r}", field=f"{path}.dtype")
    if op == "gemm":
        shape = m.get("shape")
        if not isinstance(shape, Mapping):
            raise InvalidProfile("a gemm needs a shape {m, n, k, batch?}", field=f"{path}.shape")
        for key in ("m", "n", "k"):
            _positive_int(shape.get(key), f"{path}.shape.{key}")
        if "batch" in shape:
            _positive_int(shape["batch"], f"{path}.shape.batch")
        if dtype is None:
            raise InvalidProfile("a gemm needs a dtype", field=f"{path}.dtype")
    elif op in MEMORY_OPS or op in COLLECTIVE_OPS or op in ("h2d", "d2h"):
        b = m.get("bytes")
        if not _is_number(b) or b <= 0:
            raise InvalidProfile(f"must be a positive number of bytes, got {b!r}", field=f"{path}.bytes")
        if op in MEMORY_OPS and "kernels" in m:
            _positive_int(m["kernels"], f"{path}.kernels", 1_000_000)
        if op in MEMORY_OPS and "output_bytes" in m and (not _is_number(m["output_bytes"]) or m["output_bytes"] <= 0):
            raise InvalidProfile(f"must be a positive number of bytes, got {m['output_bytes']!r}", field=f"{path}.output_bytes")
        if op in MEMORY_OPS and isinstance(m.get("shape"), Mapping) and "elements" in m["shape"]:
            _positive_int(m["shape"]["elements"], f"{path}.shape.elements", 1 << 40)
        if op in COLLECTIVE_OPS:
            _positive_int(m.get("group_size"), f"{path}.group_size", 1_000_000)
            if m["group_size"] < 2:
                raise InvalidProfile("a collective needs at least 2 ranks", field=f"{path}.group_size")
            scope = m.get("scope", "intra_node")
            if scope not in ("intra_node", "inter_node"):
                raise InvalidProfile(f"must be intra_node or inter_node, got {scope!r}", field=f"{path}.scope")
    elif op == "attention":
        shape = m.get("shape")
        if not isinstance(shape, Mapping):
            raise InvalidProfile("attention needs a shape {batch_heads, q_len, kv_len, head_dim}", field=f"{path}.shape")
        for key in ("batch_heads", "q_len", "kv_len", "head_dim"):
            _positive_int(shape.get(key), f"{path}.shape.{key}")


def resolve_profile_device(name: Any, field: str = "device.name") -> DeviceSpec:
    """The catalog device a profile was taken on (``local-cpu`` for this host's CPU)."""
    if not isinstance(name, str) or not name:
        raise InvalidProfile("must name the catalog device the profile was taken on (e.g. local-cpu, H100-SXM5-80GB)", field=field)
    try:
        return get_device(name, field)
    except UnknownName as exc:
        raise InvalidProfile(exc.message, field=field) from None


def validate_profile(data: Any) -> dict[str, Any]:
    """Check a profile dict against schema v1; return it (unchanged) or raise
    :class:`~cost_model.errors.InvalidProfile` naming the field and the reason."""
    if not isinstance(data, Mapping):
        raise InvalidProfile("a profile must be a JSON object", field="profile")
    schema = data.get("schema", SCHEMA_NAME)
    if schema != SCHEMA_NAME:
        raise InvalidProfile(f"is {schema!r}, expected {SCHEMA_NAME!r} (is this a trace? upload traces with ?device=NAME)", field="schema")
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidProfile(f"is required and must be an integer (current: {SCHEMA_VERSION}), got {version!r}", field="schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        if version > SCHEMA_VERSION:
            msg = f"{version} is newer than this planner understands (reads {', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}); upgrade the planner"
        else:
            msg = f"{version} is no longer supported (reads {', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}); re-run `planner profile` to produce a current profile"
        raise InvalidProfile(msg, field="schema_version")
    device = data.get("device")
    if not isinstance(device, Mapping):
        raise InvalidProfile("is required: an object with at least the catalog 'name'", field="device")
    resolve_profile_device(device.get("name"))
    measurements = data.get("measurements")
    if not isinstance(measurements, list) or not measurements:
        raise InvalidProfile("must be a non-empty list of measurements", field="measurements")
    if len(measurements) > MAX_MEASUREMENTS:
        raise InvalidProfile(f"has {len(measurements)} entries; the limit is {MAX_MEASUREMENTS}", field="measurements")
    for i, m in enumerate(measurements):
        _validate_measurement(m, f"measurements[{i}]")
    if not any(m["op"] in GEMM_OPS + MEMORY_OPS + COLLECTIVE_OPS for m in measurements):
        raise InvalidProfile("contains no gemm, memory-bound or collective measurement to calibrate from", field="measurements")
    pid = data.get("id")
    if pid is not None and (not isinstance(pid, str) or not pid or len(pid) > 128):
        raise InvalidProfile("must be a non-empty string of at most 128 characters", field="id")
    return data if isinstance(data, dict) else dict(data)


def parse_profile_bytes(raw: bytes | str, max_bytes: int = MAX_PROFILE_BYTES) -> dict[str, Any]:
    """Decode and validate a profile from raw JSON (size-limited)."""
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise InvalidProfile(f"is {bytes_to_mb(size):.1f} MB; the limit is {bytes_to_mb(max_bytes):.1f} MB", field="profile")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidProfile(f"is not valid JSON: {exc}", field="profile") from None
    return validate_profile(data)


def load_profile_file(path: str | Path, max_bytes: int = MAX_PROFILE_BYTES) -> dict[str, Any]:
    """Read, size-check and validate a profile file."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise InvalidProfile(f"cannot read {str(p)!r}: {exc.strerror}", field="profile") from None
    if size > max_bytes:
        raise InvalidProfile(f"{str(p)!r} is {bytes_to_mb(size):.1f} MB; the limit is {bytes_to_mb(max_bytes):.1f} MB", field="profile")
    return parse_profile_bytes(p.read_bytes(), max_bytes)


def content_hash(profile: Mapping[str, Any]) -> str:
    """SHA-256 of the device name and the measurements: what a fit depends on."""
    device = profile.get("device")
    name = device.get("name") if isinstance(device, Mapping) else None
    canon = json.dumps({"device": name, "measurements": profile.get("measurements")}, sort_keys=True, default=str)
    return hashlib.sha256(canon.encode()).hexdigest()


def profile_id_of(profile: Mapping[str, Any]) -> str:
    """The stored id, or ``sha-`` + the content hash for profiles that were never stored."""
    pid = profile.get("id")
    if isinstance(pid, str) and pid:
        return pid
    return "sha-" + content_hash(profile)[:16]


# ----------------------------------------------------------------------------------------------
# fitting
# ----------------------------------------------------------------------------------------------
def _gemm_bytes(m: float, n: float, k: float, dtype: str) -> float:
    return (m * k + k * n + m * n) * BYTES_PER_ELEMENT[dtype]


def _select_backend(measurements: list[Mapping[str, Any]], ops: Iterable[str], prefer: tuple[str, ...]) -> str | None:
    ops = set(ops)
    present: list[str] = [m.get("backend", "unknown") for m in measurements if m["op"] in ops]
    if not present:
        return None
    for b in prefer:
        if b in present:
            return b
    return max(set(present), key=present.count)


def _primary_dtype(device: DeviceSpec, dtypes: Iterable[str]) -> str:
    dtypes = list(dtypes)
    order = ("fp32", "bf16", "fp16", "fp8", "fp4") if device.kind == "cpu" else ("bf16", "fp16", "fp32", "fp8", "fp4")
    for d in order:
        if d in dtypes:
            return d
    return dtypes[0]


def _weighted_lstsq(a: np.ndarray, t: np.ndarray, nonneg: Iterable[int], scale: np.ndarray | None = None) -> np.ndarray:
    """Least squares on relative error (rows divided by ``scale``, the measured time unless
    given), with the listed columns clamped at zero (clamped columns are dropped and the rest
    refitted)."""
    w = 1.0 / (t if scale is None else scale)
    aw = a * w[:, None]
    bw = t * w
    active = list(range(a.shape[1]))
    nonneg = set(nonneg)
    for _ in range(a.shape[1] + 1):
        x_active, *_ = np.linalg.lstsq(aw[:, active], bw, rcond=None)
        x = np.zeros(a.shape[1])
        x[active] = x_active
        bad = [j for j in active if j in nonneg and x[j] < 0]
        if not bad:
            return x
        active = [j for j in active if j not in bad]
        if not active:
            return np.zeros(a.shape[1])
    return x


def _rel_errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, Any]:
    if len(meas) == 0:
        return {"points": 0}
    err = np.abs(pred - meas) / meas
    return {
        "points": int(len(meas)),
        "median_abs_rel_error": float(np.median(err)),
        "p90_abs_rel_error": float(np.quantile(err, 0.9)),
        "max_abs_rel_error": float(np.max(err)),
    }


#: Coarse grid for the two half-dimensions (0 = no shape penalty), refined around the best cell.
_HALF_GRID = np.concatenate([[0.0], np.geomspace(1.0, 8192.0, 20)])
#: A measurement more than this factor off the first fit is left out of the final fit when its
#: own record marks it as disturbed (see :func:`_disturbed`).  A measurement that is merely far
#: from the model (e.g. GELU on a CPU, compute-bound, in the memory-bound family) stays: the fit
#: must average over what the cost model will apply it to, not hide it.
OUTLIER_FACTOR = 2.5
#: Disturbed: other processes kept at least this many cores busy during the measurement ...
DISTURBED_BUSY_CORES = 0.3
#: ... or its samples spread over more than this factor (max/min).
DISTURBED_SPREAD = 3.0


def _disturbed(m: Mapping[str, Any]) -> bool:
    busy = m.get("host_busy_cores")
    if _is_number(busy) and busy >= DISTURBED_BUSY_CORES:
        return True
    spread = m.get("spread")
    if isinstance(spread, Mapping) and _is_number(spread.get("max_s")) and _is_number(spread.get("min_s")) and spread["min_s"] > 0:
        return bool(spread["max_s"] / spread["min_s"] > DISTURBED_SPREAD)
    return False


def _fit_compute_memory(gemms: list[Mapping[str, Any]], mems: list[Mapping[str, Any]], dtypes: list[str],
                        fixed_launch_s: float | None = None) -> dict[str, Any]:
    """Joint fit of per-dtype GEMM rates, the two half-dimensions (m/n and k), the bandwidth and
    the launch overhead, minimising squared log error (see ``solve``); disturbed gross outliers
    are dropped once.  ``fixed_launch_s``: a measured per-op overhead, used instead of fitting
    the intercept."""
    nd = len(dtypes)
    col_u, col_t0 = nd, nd + 1
    g_m = np.array([g["shape"]["m"] for g in gemms], dtype=float)
    g_n = np.array([g["shape"]["n"] for g in gemms], dtype=float)
    g_k = np.array([g["shape"]["k"] for g in gemms], dtype=float)
    g_b = np.array([g["shape"].get("batch", 1) for g in gemms], dtype=float)
    g_d = np.array([dtypes.index(g["dtype"]) for g in gemms], dtype=int)
    g_t = np.array([g["seconds"] for g in gemms], dtype=float)
    g_bytes = np.array([_gemm_bytes(mm, nn, kk, g["dtype"]) for mm, nn, kk, g in zip(g_m, g_n, g_k, gemms, strict=True)], dtype=float)
    m_bytes = np.array([x["bytes"] for x in mems], dtype=float)
    m_kern = np.array([x.get("kernels", 1) for x in mems], dtype=float)
    m_t = np.array([x["seconds"] for x in mems], dtype=float)
    t_all = np.concatenate([g_t, m_t])
    ng = len(gemms)

    def solve(d_half: float, k_half: float, keep: np.ndarray, symmetric: bool = False) -> tuple[float, np.ndarray, np.ndarray]:
        """Fit for fixed half-dimensions.  ``symmetric``: iteratively reweighted so that the
        objective is Σ log²(pred/meas) (rows scaled by √(pred·meas)); plain relative error
        (pred−meas)/meas penalises over-prediction more than under-prediction, which biases
        the rate of a mixed family of ops (a 20× slower op can cost at most an error of 1)."""
        sig = (g_m / (g_m + d_half)) * (g_n / (g_n + d_half)) * (g_k / (g_k + k_half))
        x_flops = 2.0 * g_m * g_n * g_k / sig
        compute_bound = np.ones(ng, dtype=bool)
        x = np.zeros(nd + 2)
        scale = t_all.copy()
        for _it in range(12 if symmetric else 8):
            a = np.zeros((ng + len(mems), nd + 2))
            rows = np.arange(ng)
            a[rows[compute_bound], g_d[compute_bound]] = (x_flops * g_b)[compute_bound]
            a[rows[~compute_bound], col_u] = (g_bytes * g_b)[~compute_bound]
            a[rows, col_t0] = 1.0
            a[ng:, col_u] = m_bytes
            a[ng:, col_t0] = m_kern
            a_k = a[keep]
            target = t_all[keep]
            if fixed_launch_s is not None:
                target = target - a_k[:, col_t0] * fixed_launch_s
                a_k = a_k.copy()
                a_k[:, col_t0] = 0.0
            # A dtype (or the bandwidth) with no informative rows gets no column.
            usable = [j for j in range(nd + 2) if np.any(a_k[:, j] != 0)]
            x = np.zeros(nd + 2)
            x[usable] = _weighted_lstsq(a_k[:, usable], target, nonneg=range(len(usable)), scale=scale[keep])
            if fixed_launch_s is not None:
                x[col_t0] = fixed_launch_s
            t_c = x[g_d] * x_flops
            t_m = x[col_u] * g_bytes
            new_cb = (t_c >= t_m) | (x[col_u] == 0)
            pred = a @ x
            new_scale = np.sqrt(t_all * np.maximum(pred, 1e-3 * t_all)) if symmetric else t_all
            converged = np.allclose(new_scale, scale, rtol=1e-3)
            if np.array_equal(new_cb, compute_bound) and converged:
                break
            compute_bound, scale = new_cb, new_scale
        pred_g = np.maximum(x[g_d] * x_flops, x[col_u] * g_bytes) * g_b + x[col_t0]
        pred_m = x[col_u] * m_bytes + m_kern * x[col_t0]
        pred = np.concatenate([pred_g, pred_m])
        if symmetric:
            loss = float(np.sum((np.log(np.maximum(pred, 1e-30) / t_all) ** 2)[keep]))
        else:
            loss = float(np.sum((((pred - t_all) / t_all) ** 2)[keep]))
        return loss, x, pred

    def search(keep: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, float, float]:
        if ng == 0:
            loss, x, pred = solve(0.0, 0.0, keep, symmetric=True)
            return loss, x, pred, 0.0, 0.0
        coarse: tuple[float, np.ndarray, np.ndarray, float, float] | None = None
        for dh in _HALF_GRID:
            for kh in _HALF_GRID:
                r = solve(float(dh), float(kh), keep)
                if coarse is None or r[0] < coarse[0]:
                    coarse = r + (float(dh), float(kh))
        # refine with the symmetric (log-error) objective on a finer grid around the best cell
        assert coarse is not None  # the grid is not empty
        _, _, _, dh0, kh0 = coarse
        step = float(_HALF_GRID[2] / _HALF_GRID[1])
        fine_d = np.unique(np.concatenate([[dh0], dh0 * step ** np.linspace(-1, 1, 7)])) if dh0 > 0 else np.array([0.0, 0.5, 1.0])
        fine_k = np.unique(np.concatenate([[kh0], kh0 * step ** np.linspace(-1, 1, 7)])) if kh0 > 0 else np.array([0.0, 0.5, 1.0])
        best: tuple[float, np.ndarray, np.ndarray, float, float] | None = None
        for dh in fine_d:
            for kh in fine_k:
                r = solve(float(dh), float(kh), keep, symmetric=True)
                if best is None or r[0] < best[0]:
                    best = r + (float(dh), float(kh))
        assert best is not None
        return best

    keep = np.ones(len(t_all), dtype=bool)
    _, x, pred, d_half, k_half = search(keep)
    ratio = np.maximum(pred / t_all, t_all / np.maximum(pred, 1e-30))
    disturbed = np.array([_disturbed(m) for m in list(gemms) + list(mems)], dtype=bool)
    outliers = (ratio > OUTLIER_FACTOR) & disturbed
    # Drop outliers only if they are a minority: otherwise the model, not the data, is off.
    if 0 < outliers.sum() <= 0.25 * len(t_all):
        keep = ~outliers
        _, x, pred, d_half, k_half = search(keep)
    else:
        outliers = np.zeros(len(t_all), dtype=bool)
    return {
        "sec_per_flop": {d: float(x[i]) for i, d in enumerate(dtypes)},
        "sec_per_byte": float(x[col_u]),
        "launch_s": float(x[col_t0]),
        "gemm_half_dim": d_half,
        "gemm_half_k": k_half,
        "excluded_gemm": [int(i) for i in np.nonzero(outliers[:ng])[0]],
        "excluded_memory": [int(i) for i in np.nonzero(outliers[ng:])[0]],
    }


def _fresh_output_bytes(m: Mapping[str, Any]) -> float:
    """Bytes of the tensors a memory-bound measurement allocates per call: its ``output_bytes``
    when recorded, else one output of the input's size (dropout: the output and the mask,
    which PyTorch's CPU dropout keeps in the input's dtype)."""
    if _is_number(m.get("output_bytes")):
        return float(m["output_bytes"])
    elements = float(m.get("shape", {}).get("elements", 0))
    esize = BYTES_PER_ELEMENT.get(m.get("dtype", "fp32"), 4)
    return elements * esize * (2 if m["op"] in RNG_OPS else 1)


def _memory_op_time_s(m: Mapping[str, Any], device: DeviceSpec) -> float:
    """The cost model's time for one memory-bound measurement on ``device``."""
    from cost_model.compute import first_touch_s, memory_bound_time_s

    n = float(m.get("shape", {}).get("elements", 0))
    rng = n if m["op"] in RNG_OPS else 0.0
    exp = n if m["op"] in TRANSCENDENTAL_OPS else 0.0
    t = memory_bound_time_s(m["bytes"], device, m.get("kernels", 1), rng_elements=rng, transcendental_elements=exp)
    return float(t + first_touch_s(_fresh_output_bytes(m), device))


def _fit_elementwise(device: DeviceSpec, small: list[Mapping[str, Any]], fresh_large: list[Mapping[str, Any]], sec_per_byte: float,
                     launch_s: float, touch_min: float) -> dict[str, float]:
    """Per-element arithmetic costs and the first-touch cost (see the module docstring).

    ``small``: memory-bound measurements whose outputs stay below ``touch_min``;
    ``fresh_large``: those at or above it.  Medians, so one disturbed size does not move them.
    """
    def per_element(ops: tuple[str, ...]) -> float:
        rows = [x for x in small if x["op"] in ops and float(x.get("shape", {}).get("elements", 0)) > 0]
        if not rows:
            return 0.0
        alu = [(x["seconds"] - launch_s * x.get("kernels", 1)) / float(x["shape"]["elements"]) for x in rows]
        mem = [x["bytes"] * sec_per_byte / float(x["shape"]["elements"]) for x in rows]
        c = float(np.median(alu))
        # memory-bound after all: the bytes already explain the time
        return c if c > float(np.median(mem)) else 0.0

    out = {"rng_s_per_element": per_element(RNG_OPS), "transcendental_s_per_element": per_element(TRANSCENDENTAL_OPS),
           "first_touch_s_per_byte": 0.0, "points_first_touch": len(fresh_large)}
    if fresh_large and math.isfinite(touch_min):
        # the device as fitted so far (bandwidth, launch, element costs), without first touch
        fitted = replace(device, memory_bandwidth_GBps=bytes_per_s_to_gbps(1.0 / sec_per_byte), efficiency=replace(
            device.efficiency, memory_fraction=1.0, kernel_overhead_s=launch_s, first_touch_s_per_byte=0.0,
            rng_s_per_element=out["rng_s_per_element"], transcendental_s_per_element=out["transcendental_s_per_element"]))
        extra = [(x["seconds"] - _memory_op_time_s(x, fitted)) / _fresh_output_bytes(x) for x in fresh_large]
        out["first_touch_s_per_byte"] = max(0.0, float(np.median(extra)))
    return out


def _fit_collectives(colls: list[Mapping[str, Any]]) -> dict[str, float] | None:
    if not colls:
        return None
    a = np.zeros((len(colls), 2))
    t = np.zeros(len(colls))
    for i, c in enumerate(colls):
        n = float(c["group_size"])
        s = float(c["bytes"])
        if c["op"] == "sendrecv":
            a[i] = (s, 1.0)
        else:
            cv, cs = _COLLECTIVE_FACTORS[c["op"]]
            a[i] = (cv * (n - 1.0) / n * s, cs * (n - 1.0))
        t[i] = c["seconds"]
    x = _weighted_lstsq(a, t, nonneg=(0, 1))
    if x[0] <= 0:
        return None
    return {"sec_per_byte": float(x[0]), "alpha_s": float(x[1])}


def _fit_gemm_peaks(device: DeviceSpec, fitted: list[str], sec_per_flop: Mapping[str, float], rates: dict[str, Any],
                    overrides: dict[str, float], warnings: list[str]) -> float:
    """The large-GEMM fraction of peak (dimensionless) from the primary dtype's fitted rate; a
    catalog peak the measurement exceeds, or another dtype's peak more than 2% off the one the
    fraction implies, becomes a device override (TFLOP/s)."""
    primary = _primary_dtype(device, fitted)
    rates["primary_dtype"] = primary
    rate_p = flops_to_tflops(1.0 / sec_per_flop[primary])
    try:
        peak_p = device.peak_tflops(primary)
    except Exception:  # the catalog lacks this dtype: the measurement defines it
        peak_p = None
    if peak_p is None or rate_p > peak_p:
        overrides[f"{primary}_tflops"] = rate_p
        gemm_max_fraction = 1.0
        if peak_p is not None:
            warnings.append(
                f"measured {primary} GEMM rate {rate_p:.4g} TFLOP/s exceeds the catalog peak {peak_p:.4g}; "
                "the device's peak is replaced by the measurement"
            )
    else:
        gemm_max_fraction = rate_p / peak_p
    for d in fitted:
        if d == primary:
            continue
        rate_d = flops_to_tflops(1.0 / sec_per_flop[d])
        implied_peak = rate_d / gemm_max_fraction
        try:
            catalog_peak = device.peak_tflops(d)
        except Exception:
            catalog_peak = None
        # Within 2% the catalog figure stands (fit noise, not a correction).
        if catalog_peak is None or abs(implied_peak / catalog_peak - 1.0) > 0.02:
            overrides[f"{d}_tflops"] = implied_peak
    return gemm_max_fraction


def _fit_links(device: DeviceSpec, ms: list[Mapping[str, Any]], rates: dict[str, Any],
               warnings: list[str]) -> tuple[float, float, float, list[Mapping[str, Any]]]:
    """NVLink and NIC fractions (dimensionless) and the collective latency (s) from the
    collective measurements (ring model, ``cost_model.comm``); catalog defaults where none
    were taken.  Also returns the measurements used."""
    base_eff = device.efficiency
    coll_backend = _select_backend(ms, COLLECTIVE_OPS, ("nccl", "gloo") if device.kind == "gpu" else ("gloo",))
    colls = [m for m in ms if m["op"] in COLLECTIVE_OPS and m.get("backend", "unknown") == coll_backend]
    nvlink_fraction = base_eff.nvlink_fraction
    nic_fraction = base_eff.nic_fraction
    collective_latency_s = base_eff.collective_latency_s
    intra = [c for c in colls if c.get("scope", "intra_node") == "intra_node"]
    inter = [c for c in colls if c.get("scope") == "inter_node"]
    per_op = {}
    for op in COLLECTIVE_OPS:
        f_op = _fit_collectives([c for c in intra if c["op"] == op])
        if f_op:
            per_op[op] = {"bus_GBps": bytes_per_s_to_gbps(1.0 / f_op["sec_per_byte"]), "alpha_s": f_op["alpha_s"]}
    # The Efficiency has one (β, α) per link.  All-reduce defines it when measured: it is the
    # data-parallel gradient collective and its ring model is the reference for the others
    # (NCCL reaches the same bus bandwidth for all of them; gloo's all-gather/reduce-scatter are
    # slower, which the per-op figures and the quality report show).
    basis = [c for c in intra if c["op"] == "allreduce"] or intra
    fi = _fit_collectives(basis)
    used_colls = basis
    if fi:
        beta_GBps = bytes_per_s_to_gbps(1.0 / fi["sec_per_byte"])
        rates["collectives"] = {
            "backend": coll_backend,
            "basis": "allreduce" if any(c["op"] == "allreduce" for c in intra) else "all collectives",
            "intra_node_bus_GBps": beta_GBps,
            "alpha_s": fi["alpha_s"],
            "per_op": per_op,
        }
        nvlink_fraction = beta_GBps / device.intra_node_bandwidth_GBps
        collective_latency_s = fi["alpha_s"]
        used_colls = intra
    elif intra:
        warnings.append("collective measurements did not determine a bandwidth")
    else:
        warnings.append("no collective measurements: link fractions and latency keep the catalog defaults")
    fe = _fit_collectives(inter)
    if fe:
        nic_GBps = bytes_per_s_to_gbps(1.0 / fe["sec_per_byte"])
        rates.setdefault("collectives", {})["inter_node_bus_GBps"] = nic_GBps
        nic_per_gpu = device.inter_node_bandwidth_GBps / max(device.gpus_per_node, 1)
        nic_fraction = nic_GBps / nic_per_gpu
        used_colls = used_colls + inter
    return nvlink_fraction, nic_fraction, collective_latency_s, used_colls


def fit_profile(profile: Mapping[str, Any]) -> dict[str, Any]:
    """Fit the device's efficiency parameters to the profile's measurements.

    Returns the ``fit`` object stored alongside the profile (see docs/PROFILE_FORMAT.md): the
    :class:`Efficiency` fields, device figure overrides, the raw fitted rates, and the fit
    quality (relative error of the *cost model functions* evaluated on the fitted device against
    every measurement used).
    """
    profile = validate_profile(profile)
    device = resolve_profile_device(profile["device"]["name"])
    ms = profile["measurements"]
    warnings: list[str] = []

    prefer = ("torch", "numpy") if device.kind == "cpu" else ("torch", "cuda", "numpy")
    backend = _select_backend(ms, GEMM_OPS + MEMORY_OPS, prefer)
    gemms = [m for m in ms if m["op"] == "gemm" and m.get("backend", "unknown") == backend]
    all_mems = [m for m in ms if m["op"] in MEMORY_OPS and m.get("backend", "unknown") == backend]
    touch_min = device.efficiency.first_touch_min_bytes
    fresh_large = [m for m in all_mems if _fresh_output_bytes(m) >= touch_min]
    small = [m for m in all_mems if _fresh_output_bytes(m) < touch_min]
    mems = [m for m in small if m["op"] not in TRANSCENDENTAL_OPS + RNG_OPS]
    dtypes = sorted({g["dtype"] for g in gemms}, key=DTYPES.index)
    base_eff = device.efficiency
    overrides: dict[str, float] = {}
    rates: dict[str, Any] = {"backend": backend}

    gemm_max_fraction = base_eff.gemm_max_fraction
    gemm_half_dim = base_eff.gemm_half_dim
    gemm_half_k = _number_or(getattr(base_eff, "gemm_half_k", None), 256.0)
    memory_fraction = base_eff.memory_fraction
    kernel_overhead_s = base_eff.kernel_overhead_s
    elementwise = {"rng_s_per_element": base_eff.rng_s_per_element,
                   "transcendental_s_per_element": base_eff.transcendental_s_per_element,
                   "first_touch_s_per_byte": base_eff.first_touch_s_per_byte}
    used_gemms, used_mems = gemms, mems
    if gemms or mems:
        # A measured per-op overhead (the op_overhead micro-benchmark, no autograd) pins the
        # launch term; fitted as an intercept it is poorly determined next to a mixed family of
        # memory-bound ops and often lands on the zero bound.
        overheads = [m for m in ms if m["op"] == "op_overhead" and m.get("backend", "unknown") == backend and not m.get("autograd")]
        fixed_launch = (overheads[0]["seconds"] / max(int(overheads[0].get("ops", 1)), 1)) if overheads else None
        cm = _fit_compute_memory(gemms, mems, dtypes, fixed_launch)
        if fixed_launch is not None:
            rates["kernel_overhead_source"] = "op_overhead measurement"
        excluded_g, excluded_m = set(cm["excluded_gemm"]), set(cm["excluded_memory"])
        used_gemms = [g for i, g in enumerate(gemms) if i not in excluded_g]
        used_mems = [x for i, x in enumerate(mems) if i not in excluded_m]
        if excluded_g or excluded_m:
            warnings.append(
                f"left out {len(excluded_g)} GEMM and {len(excluded_m)} memory-bound measurements taken on a busy "
                f"host or with unstable samples and more than {OUTLIER_FACTOR:g}x off the fitted model"
            )
        rates["gemm_tflops"] = {d: (flops_to_tflops(1.0 / s) if s > 0 else None) for d, s in cm["sec_per_flop"].items()}
        kernel_overhead_s = cm["launch_s"]
        if cm["sec_per_byte"] > 0:
            bw_GBps = bytes_per_s_to_gbps(1.0 / cm["sec_per_byte"])
            rates["memory_bandwidth_GBps"] = bw_GBps
            memory_fraction = bw_GBps / device.memory_bandwidth_GBps
            if memory_fraction > 1.0:
                overrides["memory_bandwidth_GBps"] = bw_GBps
                memory_fraction = 1.0
                warnings.append(
                    f"measured bandwidth {bw_GBps:.1f} GB/s exceeds the catalog {device.memory_bandwidth_GBps:g} GB/s; "
                    "the device's figure is replaced by the measurement"
                )
        elif not mems:
            warnings.append("no memory-bound measurements: memory_fraction keeps the catalog default")
        sec_per_byte = cm["sec_per_byte"] if cm["sec_per_byte"] > 0 else 1.0 / (gbps_to_bytes_per_s(device.memory_bandwidth_GBps) * memory_fraction)
        elementwise = _fit_elementwise(device, small, fresh_large, sec_per_byte, kernel_overhead_s, touch_min)
        rates["elementwise"] = elementwise
        used_mems = used_mems + [m for m in small if m["op"] in TRANSCENDENTAL_OPS + RNG_OPS] + fresh_large
        fitted = [d for d in dtypes if cm["sec_per_flop"][d] > 0]
        if fitted:
            gemm_half_dim = cm["gemm_half_dim"]
            gemm_half_k = cm["gemm_half_k"]
            gemm_max_fraction = _fit_gemm_peaks(device, fitted, cm["sec_per_flop"], rates, overrides, warnings)
        elif gemms:
            warnings.append("GEMM measurements did not determine a compute rate (all memory-bound?)")
    else:
        warnings.append("no GEMM or memory-bound measurements: compute efficiency keeps the catalog default")

    nvlink_fraction, nic_fraction, collective_latency_s, used_colls = _fit_links(device, ms, rates, warnings)

    efficiency = {
        "gemm_max_fraction": gemm_max_fraction,
        "gemm_half_dim": gemm_half_dim,
        "gemm_half_k": gemm_half_k,
        "memory_fraction": memory_fraction,
        "nvlink_fraction": nvlink_fraction,
        "nic_fraction": nic_fraction,
        "collective_latency_s": collective_latency_s,
        "kernel_overhead_s": kernel_overhead_s,
        "rng_s_per_element": elementwise["rng_s_per_element"],
        "transcendental_s_per_element": elementwise["transcendental_s_per_element"],
        "first_touch_s_per_byte": elementwise["first_touch_s_per_byte"],
        # JSON has no infinity: null means "never" (GPU caching allocators)
        "first_touch_min_bytes": touch_min if math.isfinite(touch_min) else None,
    }
    fit = {
        "fit_version": FIT_VERSION,
        "device": device.name,
        "profile_id": profile_id_of(profile),
        "content_hash": content_hash(profile),
        "efficiency": efficiency,
        "device_overrides": overrides,
        "rates": rates,
        "warnings": warnings,
    }
    fit["quality"] = _fit_quality(device, fit, used_gemms, used_mems, used_colls)
    return fit


def _fitted_device(device: DeviceSpec, fit: Mapping[str, Any], profile_id: str) -> DeviceSpec:
    e = fit["efficiency"]
    eff = Efficiency(
        gemm_max_fraction=float(e["gemm_max_fraction"]),
        gemm_half_dim=float(e["gemm_half_dim"]),
        gemm_half_k=float(e["gemm_half_k"]),
        memory_fraction=float(e["memory_fraction"]),
        nvlink_fraction=float(e["nvlink_fraction"]),
        nic_fraction=float(e["nic_fraction"]),
        collective_latency_s=float(e["collective_latency_s"]),
        kernel_overhead_s=float(e["kernel_overhead_s"]),
        rng_s_per_element=float(e["rng_s_per_element"]),
        transcendental_s_per_element=float(e["transcendental_s_per_element"]),
        first_touch_s_per_byte=float(e["first_touch_s_per_byte"]),
        first_touch_min_bytes=float("inf") if e["first_touch_min_bytes"] is None else float(e["first_touch_min_bytes"]),
        comm_overlap_fraction=device.efficiency.comm_overlap_fraction,  # the kind of device's, not fitted
        source=f"profile {profile_id}",
    )
    figures: dict[str, Any] = {k: float(v) for k, v in fit.get("device_overrides", {}).items()}
    source = f"{device.source}; calibrated by profile {profile_id}" if device.source else f"calibrated by profile {profile_id}"
    return replace(device, efficiency=eff, profile_id=profile_id, source=source, **figures)


def _fit_quality(device: DeviceSpec, fit: Mapping[str, Any], gemms: list[Mapping[str, Any]], mems: list[Mapping[str, Any]],
                 colls: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Relative error of the cost model's own functions on the fitted device."""
    from cost_model.comm import (
        Links,
        allreduce_time_s,
        alltoall_time_s,
        p2p_time_s,
        reduce_scatter_time_s,
    )
    from cost_model.compute import gemm_time_s

    dev = _fitted_device(device, fit, fit["profile_id"])
    out: dict[str, Any] = {}
    if gemms:
        pred = np.array([
            float(gemm_time_s(g["shape"]["m"], g["shape"]["n"], g["shape"]["k"], dev, g["dtype"], g["shape"].get("batch", 1)))
            for g in gemms
        ])
        out["gemm"] = _rel_errors(pred, np.array([g["seconds"] for g in gemms]))
    if mems:
        pred = np.array([_memory_op_time_s(x, dev) for x in mems])
        out["memory"] = _rel_errors(pred, np.array([x["seconds"] for x in mems]))
    if colls:
        links = Links(
            intra_GBps=dev.intra_node_bandwidth_GBps * dev.efficiency.nvlink_fraction,
            inter_GBps=dev.inter_node_bandwidth_GBps / max(dev.gpus_per_node, 1) * dev.efficiency.nic_fraction,
            gpus_per_node=10**9,
            alpha_s=dev.efficiency.collective_latency_s,
        )
        colls_pred: list[float] = []
        for c in colls:
            n, s = c["group_size"], c["bytes"]
            per_node = n if c.get("scope", "intra_node") == "intra_node" else 1
            if c["op"] == "allreduce":
                colls_pred.append(float(allreduce_time_s(n, s, links, per_node)))
            elif c["op"] in ("allgather", "reduce_scatter"):
                colls_pred.append(float(reduce_scatter_time_s(n, s, links, per_node)))
            elif c["op"] == "alltoall":
                colls_pred.append(float(alltoall_time_s(n, s, links, per_node)))
            else:
                colls_pred.append(float(p2p_time_s(s, links, per_node == 1)))
        pred_a = np.array(colls_pred)
        meas_a = np.array([c["seconds"] for c in colls])
        out["collectives"] = _rel_errors(pred_a, meas_a)
        ops = np.array([c["op"] for c in colls])
        out["collectives"]["per_op"] = {op: _rel_errors(pred_a[ops == op], meas_a[ops == op]) for op in sorted(set(ops))}
    return out


def _validate_fit(fit: Any) -> TypeGuard[Mapping[str, Any]]:
    if not isinstance(fit, Mapping) or fit.get("fit_version") != FIT_VERSION:
        return False
    eff = fit.get("efficiency")
    if not isinstance(eff, Mapping):
        return False
    for key in ("gemm_max_fraction", "gemm_half_dim", "gemm_half_k", "memory_fraction", "nvlink_fraction", "nic_fraction", "collective_latency_s",
                "kernel_overhead_s", "rng_s_per_element", "transcendental_s_per_element", "first_touch_s_per_byte"):
        v = eff.get(key)
        if not _is_number(v) or v < 0:
            return False
    touch = eff.get("first_touch_min_bytes")
    if touch is not None and (not _is_number(touch) or touch <= 0):
        return False
    for key in ("gemm_max_fraction", "memory_fraction", "nvlink_fraction", "nic_fraction"):
        if eff[key] <= 0:
            return False
    over = fit.get("device_overrides", {})
    if not isinstance(over, Mapping):
        return False
    allowed = {f"{d}_tflops" for d in DTYPES} | {"memory_bandwidth_GBps"}
    return all(k in allowed and _is_number(v) and v > 0 for k, v in over.items())


def with_fit(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The profile with its ``fit`` (re)computed: what is stored and written by the CLI."""
    out = dict(validate_profile(profile))
    out.pop("fit", None)
    out["fit"] = fit_profile(out)
    return out


def profile_matches(device: DeviceSpec, profile: Mapping[str, Any]) -> bool:
    """Whether ``profile`` was taken on ``device`` (catalog name, case-insensitive, aliases)."""
    name = profile.get("device", {}).get("name") if isinstance(profile.get("device"), Mapping) else None
    if not isinstance(name, str):
        return False
    try:
        return get_device(name).name == device.name
    except UnknownName:
        return name.lower() == device.name.lower()


def apply_profile(device: DeviceSpec, profile: Mapping[str, Any]) -> DeviceSpec:
    """``device`` calibrated by ``profile``: fitted :class:`Efficiency`, corrected figures where
    the catalog's were exceeded (or missing), and ``profile_id`` set.

    Uses the profile's stored ``fit`` when it is current and well-formed, otherwise fits now.
    Raises :class:`InvalidProfile` when the profile was taken on another device.
    """
    profile = validate_profile(profile)
    if not profile_matches(device, profile):
        raise InvalidProfile(
            f"was taken on {profile['device']['name']!r}, not on {device.name!r}; a profile applies only to its own device",
            field="device.name",
        )
    pid = profile_id_of(profile)
    fit = profile.get("fit")
    # A stored fit is used only if it belongs to exactly these measurements (the service refits
    # every upload; a hand-edited file is refitted here).
    if not _validate_fit(fit) or fit.get("content_hash") != content_hash(profile):
        fit = fit_profile(profile)
    return _fitted_device(device, fit, pid)
