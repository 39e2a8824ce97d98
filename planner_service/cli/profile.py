"""``planner profile`` (micro-benchmark this host's CPU or a CUDA device, fit the cost model to
it, write / upload the profile) and ``planner profile-trace`` (turn a PyTorch profiler Chrome
trace into a profile).  Profile format: docs/PROFILE_FORMAT.md."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from cost_model.errors import InvalidProfile, PlannerError
from cost_model.profiles import with_fit
from cost_model.units import bytes_to_mb, bytes_to_mib, flops_to_gflops, s_to_ns, s_to_us, tflops_to_flops
from planner_service.cli.common import EXIT_BAD_INPUT, err_console, fail

#: Warn when other processes kept at least this many cores busy while profiling.
BUSY_WARNING_CORES = 0.3


def upload_url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/v1/profiles") else f"{base}/v1/profiles"


def upload_profile(url: str, profile: dict[str, Any]) -> dict[str, Any]:
    """POST a profile; return the stored summary.  Exit 2 when the server rejects it (its
    reason printed), 1 when the server cannot be reached."""
    import httpx

    target = upload_url(url)
    try:
        resp = httpx.post(target, json=profile, timeout=120.0)
    except httpx.HTTPError as exc:
        err_console.print(f"[red]error:[/red] cannot upload to {target}: {exc}")
        raise typer.Exit(1) from None
    try:
        body = resp.json()
    except ValueError:
        body = {"raw": resp.text[:500]}
    if resp.status_code >= 400:
        detail = body.get("error", body) if isinstance(body, dict) else body
        err_console.print(f"[red]error:[/red] the server rejected the profile ({resp.status_code}): {json.dumps(detail)}")
        raise typer.Exit(EXIT_BAD_INPUT if resp.status_code < 500 else 1)
    return body if isinstance(body, dict) else {"response": body}


def summary_table(profile: dict[str, Any]) -> Table:
    fit = profile["fit"]
    eff = fit["efficiency"]
    rates = fit["rates"]
    t = Table(title=f"Profile of {profile['device']['name']} ({len(profile['measurements'])} measurements)", show_header=False)
    for dtype, tf in (rates.get("gemm_tflops") or {}).items():
        if tf:
            t.add_row(f"GEMM rate {dtype}", f"{flops_to_gflops(tflops_to_flops(tf)):.4g} GFLOP/s (large shapes); half-dims m,n {eff['gemm_half_dim']:.3g}, k {eff['gemm_half_k']:.3g}")
    if rates.get("memory_bandwidth_GBps"):
        t.add_row("memory-bound ops", f"{rates['memory_bandwidth_GBps']:.3g} GB/s, {s_to_us(eff['kernel_overhead_s']):.3g} µs per kernel")
    ew = rates.get("elementwise")
    if ew and (ew["rng_s_per_element"] or ew["transcendental_s_per_element"] or ew["first_touch_s_per_byte"]):
        touch = eff.get("first_touch_min_bytes")
        t.add_row("per-element costs", f"random numbers {s_to_ns(ew['rng_s_per_element']):.3g} ns, exp/erf {s_to_ns(ew['transcendental_s_per_element']):.3g} ns; "
                  f"first touch {s_to_ns(ew['first_touch_s_per_byte']):.3g} ns/byte" + (f" for tensors ≥ {bytes_to_mib(touch):.0f} MiB" if touch else ""))
    coll = rates.get("collectives")
    if coll and "intra_node_bus_GBps" in coll:
        t.add_row(f"collectives ({coll['backend']})", f"{coll['intra_node_bus_GBps']:.3g} GB/s bus, α {s_to_us(coll['alpha_s']):.3g} µs")
    for key, q in fit.get("quality", {}).items():
        if q.get("points"):
            t.add_row(f"fit error {key}", f"median {q['median_abs_rel_error'] * 100:.1f}%, p90 {q['p90_abs_rel_error'] * 100:.1f}% over {q['points']} points")
    t.add_row("efficiency", ", ".join(f"{k}={v:.4g}" if v is not None else f"{k}=none" for k, v in eff.items()))
    if fit.get("device_overrides"):
        t.add_row("replaced figures", ", ".join(f"{k}={v:.4g}" for k, v in fit["device_overrides"].items()))
    return t


def _write(profile: dict[str, Any], out: Path | None) -> None:
    text = json.dumps(profile, indent=1, sort_keys=False)
    if out is None:
        sys.stdout.write(text + "\n")
        return
    try:
        out.write_text(text + "\n")
    except OSError as exc:
        err_console.print(f"[red]error:[/red] cannot write {out}: {exc.strerror or exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    err_console.print(f"wrote {out}")


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N"),
        out: Path | None = typer.Option(None, "--out", help="Write the profile JSON here (default: stdout)."),
        quick: bool = typer.Option(False, "--quick", help="Small grid: under a minute on a 2-core CPU."),
        upload: str | None = typer.Option(None, "--upload", help="Service URL to upload the profile to (POST /v1/profiles)."),
        threads: int | None = typer.Option(None, "--threads", min=1, help="CPU threads for numpy/torch (default: all cores). Profile with the threads one training rank gets."),
        concurrent: int = typer.Option(1, "--concurrent", help="CPU: ranks sharing this host; N-1 neighbour processes run the same benchmarks meanwhile, so the profile is one rank's share (use with --threads = cores/N)."),
        backend: str = typer.Option("auto", "--backend", help="auto (numpy, plus torch when installed), numpy or torch."),
        collectives: bool = typer.Option(True, "--collectives/--no-collectives", help="Measure torch.distributed collectives (needs torch)."),
        world_size: int | None = typer.Option(None, "--world-size", min=2, help="Ranks for the collective benchmark (default: 2 on CPU, all GPUs on CUDA)."),
        device_name: str | None = typer.Option(None, "--device-name", help="Catalog device name for a GPU whose name is not recognised."),
        as_json: bool = typer.Option(False, "--json", help="Errors as JSON."),
    ) -> None:
        """Micro-benchmark this host (GEMMs, memory-bound ops, attention, collectives), fit the
        cost model's efficiency to it and write the profile (stdout or --out) or upload it."""
        from planner_service.profiling import ProfileOptions, run_profile
        from planner_service.profiling.runner import import_torch

        if backend not in ("auto", "numpy", "torch"):
            fail(InvalidProfile(f"must be auto, numpy or torch, got {backend!r}", field="backend"), as_json)
        if backend == "torch" and import_torch() is None:
            fail(InvalidProfile("torch is not installed (pip install '.[torch]')", field="backend"), as_json)
        backends = ("numpy", "torch") if backend == "auto" else (backend,)
        options = ProfileOptions(device=device, quick=quick, threads=threads, backends=backends, concurrent=concurrent,
                                 collectives=collectives, world_size=world_size, device_name=device_name)
        try:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err_console, transient=True) as bar:
                task = bar.add_task("profiling", total=None)

                def progress(label: str, done: int, total: int) -> None:
                    bar.update(task, description=label[:60], completed=done, total=total)

                try:
                    profile = run_profile(options, progress)
                except RuntimeError as exc:
                    if "collective" not in str(exc):
                        raise
                    err_console.print(f"[yellow]warning:[/yellow] {exc}; profiling again without collectives")
                    options = dataclasses.replace(options, collectives=False)
                    profile = run_profile(options, progress)
                    profile.setdefault("warnings", []).append(f"collective benchmark failed: {exc}")
            profile = with_fit(profile)
        except PlannerError as exc:
            fail(exc, as_json)
            return
        busy = max(profile["settings"].get("host_busy_cores_before") or 0.0, profile["settings"].get("host_busy_cores_after") or 0.0)
        if busy >= BUSY_WARNING_CORES:
            err_console.print(
                f"[yellow]warning:[/yellow] other processes kept {busy:.1f} cores busy while profiling; "
                "the measurements include that contention (re-run on an idle host)"
            )
        err_console.print(summary_table(profile))
        for w in profile["fit"].get("warnings", []):
            err_console.print(f"[yellow]note:[/yellow] {w}")
        if out is not None or upload is None:
            _write(profile, out)
        if upload:
            stored = upload_profile(upload, profile)
            err_console.print(f"uploaded as profile {stored.get('id')}")

    @app.command("profile-trace")
    def profile_trace_cmd(
        trace: Path = typer.Argument(..., help="Chrome trace JSON exported by torch.profiler (record_shapes=True)."),
        device_name: str | None = typer.Option(None, "--device-name", help="Catalog device the trace was recorded on (inferred from GPU traces when omitted)."),
        out: Path | None = typer.Option(None, "--out", help="Write the profile JSON here (default: stdout)."),
        upload: str | None = typer.Option(None, "--upload", help="Service URL to upload the profile to."),
        as_json: bool = typer.Option(False, "--json", help="Errors as JSON."),
    ) -> None:
        """Turn a PyTorch profiler trace into a profile (GEMM, attention, memory-bound and NCCL
        kernel timings) fitted to the device it was recorded on."""
        from planner_service.profiling.trace_import import (
            MAX_TRACE_BYTES,
            parse_trace_bytes,
        )

        try:
            size = trace.stat().st_size
        except OSError as exc:
            err_console.print(f"[red]error:[/red] cannot read {trace}: {exc.strerror or exc}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        try:
            if size > MAX_TRACE_BYTES:
                raise InvalidProfile(f"{trace} is {bytes_to_mb(size):.1f} MB; the limit for traces is {bytes_to_mb(MAX_TRACE_BYTES):.0f} MB", field="trace")
            profile = with_fit(parse_trace_bytes(trace.read_bytes(), device_name))
        except PlannerError as exc:
            fail(exc, as_json)
            return
        err_console.print(summary_table(profile))
        if out is not None or upload is None:
            _write(profile, out)
        if upload:
            stored = upload_profile(upload, profile)
            err_console.print(f"uploaded as profile {stored.get('id')}")
