"""Parsers of what a launched training job prints or writes, into one :class:`ParsedLog`.

Formats (``FORMATS``; ``auto`` picks the first whose signature the text has):

* ``megatron``: Megatron-LM's ``training_log`` lines (``iteration N/M | ... | elapsed time per
  iteration (ms): X | throughput per GPU (TFLOP/s/GPU): Y | ... | global batch size: G |``,
  each the mean over the log interval), its memory report lines (``[Rank N] (after N
  iterations) memory (MB) | allocated: … | max allocated: … | reserved: … | max reserved: …``,
  MB meaning MiB: ``torch.cuda.memory_allocated() / 2**20``) and the ``arguments`` block
  printed at start (``  num_layers ......... 32``), whose model and layout facts are checked
  against the plan.
* ``torchtitan``: torchtitan's metrics lines (``step: N  loss: …  memory: X GiB(Y%)  tps: T
  tflops: F  mfu: M%``, ANSI colours allowed; ``tps`` is tokens per second per device), the
  ``ModelArgs(dim=…, n_layers=…, n_heads=…)`` repr and the ``local batch size …, global batch
  size …, sequence length …`` line.
* ``chrome_trace``: a PyTorch profiler trace (``export_chrome_trace``): one step per
  ``ProfilerStep#N`` annotation; per-phase times from the trace importer's measurements
  (``planner_service.profiling.trace_import``).
* ``deepspeed``: DeepSpeed's ``wall_clock_breakdown`` lines (``time (ms) | fwd: … | bwd: … |
  step: …``, or the older ``forward``/``backward``/``step`` names; the ``_microstep`` timers
  are per micro-batch and give the phases) — a step is fwd + bwd + step; ``MaxMemAllocated=X GB``
  of ``see_memory_usage``.
* ``paddle``: PaddleNLP's trainer log lines (``interval_runtime: …,
  interval_steps_per_second: …, interval_tokens_per_second_per_device: …,
  max_memory_allocated: …, max_memory_reserved: …`` in GiB).
* ``json``: ``{"step_times_s": [...]}`` (or ``step_times_ms``, or a bare list of seconds),
  optional ``memory`` ([{rank, allocated_GB, max_allocated_GB, reserved_GB, max_reserved_GB}]),
  ``tokens_per_s_per_device``, ``phases_s``, ``versions``, ``model``, ``strategy``,
  ``global_batch_size``, ``sequence_length``.
* ``csv``: a header row with ``step_time_s`` or ``step_time_ms`` (optional ``step``,
  ``max_allocated_GB``, ``max_reserved_GB``, ``tokens_per_s_per_device``).

Every error is an :class:`InvalidObservation` (HTTP 422) naming ``log`` and what was missing.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cost_model.errors import InvalidInput
from cost_model.units import bytes_to_gb, gib_to_bytes, mib_to_bytes, ms_to_s, us_to_s

FORMATS = ("auto", "megatron", "torchtitan", "chrome_trace", "deepspeed", "paddle", "json", "csv")
MAX_LOG_BYTES = int(mib_to_bytes(64))  # a Chrome trace of a few steps; logs are far smaller


class InvalidObservation(InvalidInput):
    """An observed-run log that cannot be read (empty, truncated, not the format)."""

    code = "invalid_observation"


@dataclass(frozen=True, kw_only=True)
class MemoryReport:
    """Peak memory of one rank (GB = 1e9 bytes); None where the log does not say."""

    rank: int | None = None
    allocated_GB: float | None = None
    max_allocated_GB: float | None = None
    reserved_GB: float | None = None
    max_reserved_GB: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("rank", "allocated_GB", "max_allocated_GB", "reserved_GB", "max_reserved_GB")}


@dataclass(frozen=True, kw_only=True)
class ParsedLog:
    """What a log says: per-step (or per-log-interval mean) step times in seconds, in order;
    memory per rank; throughput; per-phase seconds per step; the run's model and layout facts
    (``header``: Megatron argument names) and software versions."""

    format: str
    step_times_s: tuple[float, ...] = ()
    steps: tuple[int | None, ...] = ()
    memory: tuple[MemoryReport, ...] = ()
    tokens_per_s_per_device: tuple[float, ...] = ()
    tflops_per_device: tuple[float, ...] = ()
    mfu: tuple[float, ...] = ()
    phases_s: Mapping[str, float] = field(default_factory=dict)
    header: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    #: Step times were derived from tokens/s (torchtitan): they need the plan's batch to convert.
    needs_batch: bool = False
    notes: tuple[str, ...] = ()


_NUM = r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# ------------------------------------------------------------------------------- Megatron-LM
_MEG_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEG_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*(" + _NUM + ")")
_MEG_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*(" + _NUM + ")")
_MEG_GBS = re.compile(r"global batch size:\s*(\d+)")
_MEG_MEM = re.compile(
    r"\[Rank (\d+)\]\s*\(after \d+ iterations\) memory \(MB\)\s*\|\s*allocated:\s*(" + _NUM + r")\s*\|\s*max allocated:\s*("
    + _NUM + r")\s*\|\s*reserved:\s*(" + _NUM + r")\s*\|\s*max reserved:\s*(" + _NUM + ")"
)
_MEG_ARG = re.compile(r"^\s*([a-z_][a-z0-9_]*) \.{3,} (.+?)\s*$")
#: Megatron arguments read from the ``arguments`` block (their Megatron names).
MEGATRON_FACTS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size", "micro_batch_size",
                  "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size", "data_parallel_size",
                  "world_size", "ffn_hidden_size", "num_query_groups", "padded_vocab_size", "num_experts",
                  "expert_model_parallel_size", "virtual_pipeline_model_parallel_size", "sequence_parallel")


def _megabytes_to_gb(mb: float) -> float:
    return float(bytes_to_gb(mib_to_bytes(mb)))


def _int_or_none(value: str) -> Any:
    v = value.strip()
    if v in ("None", "none"):
        return None
    if v in ("True", "False"):
        return v == "True"
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def parse_megatron(text: str) -> ParsedLog:
    steps: list[int | None] = []
    times: list[float] = []
    tflops: list[float] = []
    memory: dict[int, MemoryReport] = {}
    header: dict[str, Any] = {}
    versions: dict[str, str] = {}
    in_args = False
    for line in text.splitlines():
        if "------------------------ arguments ------------------------" in line or line.strip().startswith("------------------------ arguments"):
            in_args = True
            continue
        if in_args and "end of arguments" in line:
            in_args = False
            continue
        if in_args:
            m = _MEG_ARG.match(line)
            if m and m.group(1) in MEGATRON_FACTS:
                header[m.group(1)] = _int_or_none(m.group(2))
            continue
        if "elapsed time per iteration" in line:
            it, el = _MEG_ITER.search(line), _MEG_ELAPSED.search(line)
            if el is None:
                continue  # a line cut off before its step time (truncated log)
            steps.append(int(it.group(1)) if it else None)
            times.append(float(ms_to_s(_num(el.group(1)))))
            tf = _MEG_TFLOPS.search(line)
            if tf:
                tflops.append(_num(tf.group(1)))
            gbs = _MEG_GBS.search(line)
            if gbs and "global_batch_size" not in header:
                header["global_batch_size"] = int(gbs.group(1))
            continue
        mm = _MEG_MEM.search(line)
        if mm:
            rank = int(mm.group(1))
            memory[rank] = MemoryReport(rank=rank, allocated_GB=_megabytes_to_gb(_num(mm.group(2))), max_allocated_GB=_megabytes_to_gb(_num(mm.group(3))),
                                        reserved_GB=_megabytes_to_gb(_num(mm.group(4))), max_reserved_GB=_megabytes_to_gb(_num(mm.group(5))))
            continue
        v = re.search(r"\btorch version[:\s]+([\w.+-]+)", line, re.IGNORECASE)
        if v:
            versions["torch"] = v.group(1)
    return ParsedLog(format="megatron", step_times_s=tuple(times), steps=tuple(steps), tflops_per_device=tuple(tflops),
                     memory=tuple(memory[r] for r in sorted(memory)), header=header, versions=versions)


# ------------------------------------------------------------------------------- torchtitan
_TT_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*(" + _NUM + r"|nan|inf)(.*)$")
_TT_MEM = re.compile(r"memory:\s*(" + _NUM + r")\s*GiB\s*\(\s*(" + _NUM + r")\s*%\s*\)")
_TT_TPS = re.compile(r"tps:\s*(" + _NUM + ")")
_TT_TFLOPS = re.compile(r"tflops:\s*(" + _NUM + ")")
_TT_MFU = re.compile(r"mfu:\s*(" + _NUM + r")\s*%")
_TT_ARGS = re.compile(r"ModelArgs\((.*?)\)")
_TT_BATCH = re.compile(r"local batch size\s+(\d+),\s*global batch size\s+(\d+),\s*sequence length\s+(\d+)")
_TT_BUILD = re.compile(r"Building (\S+) (\S+) with")
#: torchtitan ModelArgs names → Megatron argument names (the one vocabulary of ``header``).
_TT_NAMES = {"dim": "hidden_size", "n_layers": "num_layers", "n_heads": "num_attention_heads", "n_kv_heads": "num_query_groups",
             "vocab_size": "padded_vocab_size"}


def parse_torchtitan(text: str) -> ParsedLog:
    steps: list[int | None] = []
    tps: list[float] = []
    tflops: list[float] = []
    mfu: list[float] = []
    peak_gib = 0.0
    header: dict[str, Any] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        m = _TT_STEP.search(line)
        if m:
            rest = m.group(3)
            t = _TT_TPS.search(rest)
            if t is None:
                continue  # cut off before tps
            steps.append(int(m.group(1)))
            tps.append(_num(t.group(1)))
            mem = _TT_MEM.search(rest)
            if mem:
                peak_gib = max(peak_gib, _num(mem.group(1)))
            f = _TT_TFLOPS.search(rest)
            if f:
                tflops.append(_num(f.group(1)))
            u = _TT_MFU.search(rest)
            if u:
                mfu.append(_num(u.group(1)) / 100.0)
            continue
        a = _TT_ARGS.search(line)
        if a:
            for k, v in re.findall(r"(\w+)=([^,]+)", a.group(1)):
                if k in _TT_NAMES:
                    header[_TT_NAMES[k]] = _int_or_none(v)
            b = _TT_BUILD.search(line)
            if b:
                header["model_name"] = f"{b.group(1)} {b.group(2)}"
        bt = _TT_BATCH.search(line)
        if bt:
            header.update(local_batch_size=int(bt.group(1)), global_batch_size=int(bt.group(2)), seq_length=int(bt.group(3)))
    memory = (MemoryReport(max_reserved_GB=float(bytes_to_gb(gib_to_bytes(peak_gib)))),) if peak_gib else ()
    return ParsedLog(format="torchtitan", steps=tuple(steps), tokens_per_s_per_device=tuple(tps), tflops_per_device=tuple(tflops),
                     mfu=tuple(mfu), memory=memory, header=header, needs_batch=True,
                     notes=("torchtitan logs tokens/s per device: step time = global batch · sequence / (tps · devices)",))


# ------------------------------------------------------------------------------- DeepSpeed
_DS_TIME = re.compile(r"time \(ms\)\s*\|(.*)$")
_DS_FIELD = re.compile(r"([a-z_]+):\s*(" + _NUM + ")")
_DS_MEM = re.compile(r"MaxMemAllocated=\s*(" + _NUM + r")\s*GB")
_DS_STEP_KEYS = (("fwd", "bwd", "step"), ("forward", "backward", "step"))


def parse_deepspeed(text: str) -> ParsedLog:
    times: list[float] = []
    phase_sum: dict[str, float] = {}
    phase_n: dict[str, int] = {}
    peak_gb = 0.0
    for line in text.splitlines():
        m = _DS_TIME.search(line)
        if m:
            fields = {k: _num(v) for k, v in _DS_FIELD.findall(m.group(1))}
            for keys in _DS_STEP_KEYS:
                if all(k in fields for k in keys):
                    times.append(float(ms_to_s(sum(fields[k] for k in keys))))
                    break
            for k, v in fields.items():
                phase_sum[k] = phase_sum.get(k, 0.0) + float(ms_to_s(v))
                phase_n[k] = phase_n.get(k, 0) + 1
            continue
        mm = _DS_MEM.search(line)
        if mm:
            peak_gb = max(peak_gb, _num(mm.group(1)))
    phases = {k: phase_sum[k] / phase_n[k] for k in sorted(phase_sum)}
    memory = (MemoryReport(max_allocated_GB=float(bytes_to_gb(gib_to_bytes(peak_gb)))),) if peak_gb else ()
    return ParsedLog(format="deepspeed", step_times_s=tuple(times), steps=tuple([None] * len(times)), phases_s=phases, memory=memory)


# ------------------------------------------------------------------------------- PaddleNLP
_PD_FIELD = re.compile(r"([a-z_]+):\s*(" + _NUM + ")")


def parse_paddle(text: str) -> ParsedLog:
    steps: list[int | None] = []
    times: list[float] = []
    tps: list[float] = []
    mem = {"max_memory_allocated": 0.0, "max_memory_reserved": 0.0}
    for line in text.splitlines():
        if "interval_tokens_per_second_per_device" not in line and "interval_steps_per_second" not in line:
            continue
        fields = {k: _num(v) for k, v in _PD_FIELD.findall(line)}
        sps = fields.get("interval_steps_per_second")
        if not sps:
            continue
        steps.append(int(fields["global_step"]) if "global_step" in fields else None)
        times.append(1.0 / sps)
        if "interval_tokens_per_second_per_device" in fields:
            tps.append(fields["interval_tokens_per_second_per_device"])
        for k in mem:
            if k in fields:
                mem[k] = max(mem[k], fields[k])
    memory = ()
    if any(mem.values()):
        memory = (MemoryReport(max_allocated_GB=float(bytes_to_gb(gib_to_bytes(mem["max_memory_allocated"]))) or None,
                               max_reserved_GB=float(bytes_to_gb(gib_to_bytes(mem["max_memory_reserved"]))) or None),)
    return ParsedLog(format="paddle", step_times_s=tuple(times), steps=tuple(steps), tokens_per_s_per_device=tuple(tps), memory=memory)


# ------------------------------------------------------------------------------- Chrome trace
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def parse_chrome_trace(text: str) -> ParsedLog:
    """Steps from the ``ProfilerStep#N`` annotations (``torch.profiler.schedule``); phases: the
    trace importer's measurements (GEMMs, attention, memory-bound ops, collectives) summed per
    op kind and divided by the number of steps."""
    from planner_service.profiling.trace_import import is_trace, trace_to_measurements

    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidObservation(f"the trace is not complete JSON ({exc.msg} at line {exc.lineno}): truncated?", field="log") from None
    if not is_trace(doc):
        raise InvalidObservation("not a Chrome trace: no traceEvents list", field="log")
    events = doc["traceEvents"] if isinstance(doc, Mapping) else doc
    spans: dict[int, float] = {}
    for e in events:
        if not isinstance(e, Mapping) or e.get("ph") != "X":
            continue
        m = _PROFILER_STEP.match(str(e.get("name", "")))
        dur = e.get("dur")
        if m and isinstance(dur, (int, float)) and dur > 0:
            spans[int(m.group(1))] = max(spans.get(int(m.group(1)), 0.0), float(us_to_s(dur)))
    if not spans:
        raise InvalidObservation("the trace has no ProfilerStep#N annotations: record it with torch.profiler.profile(schedule=...) "
                                 "and prof.step() after each training step", field="log")
    phases: dict[str, float] = {}
    try:
        measurements, _meta = trace_to_measurements(doc)
    except InvalidInput:
        measurements = []
    for m in measurements:
        op = str(m.get("op"))
        phases[op] = phases.get(op, 0.0) + float(m.get("seconds", 0.0)) * int(m.get("repeats", 1))
    n = len(spans)
    order = sorted(spans)
    return ParsedLog(format="chrome_trace", step_times_s=tuple(spans[k] for k in order), steps=tuple(order),
                     phases_s={k: v / n for k, v in sorted(phases.items())})


# ------------------------------------------------------------------------------- JSON / CSV
def _floats(value: Any, where: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise InvalidObservation("must be a list of numbers", field=where)
    return tuple(float(x) for x in value)


def _memory_from_json(value: Any) -> tuple[MemoryReport, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidObservation("must be a list of {rank, allocated_GB, max_allocated_GB, reserved_GB, max_reserved_GB}", field="log.memory")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise InvalidObservation("must be an object", field=f"log.memory[{i}]")
        vals: dict[str, Any] = {}
        for k in ("allocated_GB", "max_allocated_GB", "reserved_GB", "max_reserved_GB"):
            v = m.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise InvalidObservation("must be a non-negative number", field=f"log.memory[{i}].{k}")
            vals[k] = float(v) if v is not None else None
        rank = m.get("rank")
        out.append(MemoryReport(rank=rank if isinstance(rank, int) else None, **vals))
    return tuple(out)


def parse_json(text: str) -> ParsedLog:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidObservation(f"not complete JSON ({exc.msg} at line {exc.lineno}): truncated?", field="log") from None
    if isinstance(doc, list):
        doc = {"step_times_s": doc}
    if not isinstance(doc, Mapping):
        raise InvalidObservation("must be a JSON object with step_times_s (or a list of step times in seconds)", field="log")
    if "step_times_s" in doc:
        times = _floats(doc["step_times_s"], "log.step_times_s")
    elif "step_times_ms" in doc:
        times = tuple(float(ms_to_s(x)) for x in _floats(doc["step_times_ms"], "log.step_times_ms"))
    else:
        raise InvalidObservation("has neither step_times_s nor step_times_ms", field="log")
    header: dict[str, Any] = {}
    for src in ("model", "strategy"):  # facts in Megatron's argument names, checked against the plan
        v = doc.get(src)
        if isinstance(v, Mapping):
            header.update({k: v[k] for k in v if isinstance(v[k], (int, float, str, bool))})
    for k in ("global_batch_size", "sequence_length"):
        if isinstance(doc.get(k), int):
            header["seq_length" if k == "sequence_length" else k] = doc[k]
    phases = doc.get("phases_s") or {}
    if not isinstance(phases, Mapping) or not all(isinstance(v, (int, float)) for v in phases.values()):
        raise InvalidObservation("must be an object of seconds per phase", field="log.phases_s")
    versions = doc.get("versions") or {}
    if not isinstance(versions, Mapping):
        raise InvalidObservation("must be an object of name → version", field="log.versions")
    tps = doc.get("tokens_per_s_per_device")
    return ParsedLog(format="json", step_times_s=times, steps=tuple([None] * len(times)), memory=_memory_from_json(doc.get("memory")),
                     tokens_per_s_per_device=(float(tps),) if isinstance(tps, (int, float)) and not isinstance(tps, bool) else (),
                     phases_s={str(k): float(v) for k, v in phases.items()}, header=header,
                     versions={str(k): str(v) for k, v in versions.items()})


def parse_csv(text: str) -> ParsedLog:
    reader = csv.DictReader(io.StringIO(text))
    cols = reader.fieldnames or []
    key, scale = ("step_time_s", 1.0) if "step_time_s" in cols else ("step_time_ms", float(ms_to_s(1.0))) if "step_time_ms" in cols else (None, 1.0)
    if key is None:
        raise InvalidObservation(f"the CSV header has no step_time_s or step_time_ms column (has {', '.join(cols) or 'none'})", field="log")
    times: list[float] = []
    steps: list[int | None] = []
    peak = {"max_allocated_GB": 0.0, "max_reserved_GB": 0.0}
    for lineno, row in enumerate(reader, 2):
        value = (row.get(key) or "").strip()
        if not value:
            continue  # a row cut off (truncated file) or an empty line
        try:
            times.append(float(value) * scale)
        except ValueError:
            raise InvalidObservation(f"line {lineno}: {key} {value!r} is not a number", field="log") from None
        s = (row.get("step") or "").strip()
        steps.append(int(s) if s.isdigit() else None)
        for k in peak:
            v = (row.get(k) or "").strip()
            if v:
                peak[k] = max(peak[k], float(v))
    memory = (MemoryReport(max_allocated_GB=peak["max_allocated_GB"] or None, max_reserved_GB=peak["max_reserved_GB"] or None),) if any(peak.values()) else ()
    return ParsedLog(format="csv", step_times_s=tuple(times), steps=tuple(steps), memory=memory)


# ------------------------------------------------------------------------------- dispatch
PARSERS: dict[str, Callable[[str], ParsedLog]] = {
    "megatron": parse_megatron,
    "torchtitan": parse_torchtitan,
    "chrome_trace": parse_chrome_trace,
    "deepspeed": parse_deepspeed,
    "paddle": parse_paddle,
    "json": parse_json,
    "csv": parse_csv,
}


def detect_format(text: str) -> str:
    head = text.lstrip()[:4096]
    if head.startswith("{") or re.match(r"\[\s*(?:\{|\]|[-+]?[\d.]+(?:[eE][-+]?\d+)?\s*[,\]])", head):  # not a log line's "[2026-..." or "[titan]"
        return "chrome_trace" if '"traceEvents"' in text[:1_000_000] else "json"
    if "elapsed time per iteration (ms)" in text:
        return "megatron"
    if "interval_tokens_per_second_per_device" in text or "interval_steps_per_second" in text:
        return "paddle"
    if re.search(r"time \(ms\)\s*\|\s*(fwd|forward)", text):
        return "deepspeed"
    if re.search(r"step:\s*\d+\s+loss:", _ANSI.sub("", text)) and "tps:" in text:
        return "torchtitan"
    first = head.splitlines()[0] if head else ""
    if "step_time_s" in first or "step_time_ms" in first:
        return "csv"
    raise InvalidObservation("cannot tell the log's format; give format (one of " + ", ".join(FORMATS[1:]) + ")", field="format")


def parse_log(text: str, fmt: str = "auto") -> ParsedLog:
    """Parse ``text`` as ``fmt`` (``auto``: detected).  Raises :class:`InvalidObservation` on an
    empty log, an unknown format, or a log with no step times at all."""
    if fmt not in FORMATS:
        raise InvalidObservation(f"must be one of {', '.join(FORMATS)}, got {fmt!r}", field="format")
    if not text or not text.strip():
        raise InvalidObservation("is empty", field="log")
    if len(text) > MAX_LOG_BYTES:
        raise InvalidObservation(f"is {len(text)} characters; at most {MAX_LOG_BYTES}", field="log")
    fmt = detect_format(text) if fmt == "auto" else fmt
    parsed = PARSERS[fmt](text)
    if not parsed.step_times_s and not parsed.tokens_per_s_per_device:
        raise InvalidObservation(f"no step times found in the log read as {fmt}", field="log")
    return parsed


__all__ = ["FORMATS", "InvalidObservation", "MemoryReport", "ParsedLog", "detect_format", "parse_log"]
