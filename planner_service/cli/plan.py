"""``planner plan``: search the best strategy and placement for a model on a cluster."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from cost_model.errors import PlannerError
from cost_model.units import s_to_ms
from planner_service.cli.common import (
    EXIT_BAD_INPUT,
    BatchFileOption,
    ProfileFileOption,
    console,
    err_console,
    fail,
    read_json_file,
    run_batch,
    step_interval,
)
from planner_service.cli.progress import batch_progress
from planner_service.planner import PlanResult, SolverSettings, plan
from planner_service.planner.request import parse_plan_request


def plan_body(body: dict, settings: SolverSettings, progress=None, profile: dict | None = None) -> tuple[PlanResult, dict]:
    """The result and its plan JSON — the object ``POST /v1/plans`` returns (``id``,
    ``revision`` and ``created_at`` null: nothing is stored), preflight warnings included."""
    from planner_service.service.identity import canonical_request, request_hash
    from planner_service.service.plans import PreparedRequest, plan_row, unstored_plan_to_api

    req = parse_plan_request(body)
    canonical = canonical_request(body, req)
    if profile is not None:
        from dataclasses import replace

        from cost_model.estimate import apply_profile_to_cluster

        req = replace(req, cluster=apply_profile_to_cluster(req.cluster, profile))
    result = plan(req, settings, progress=progress)
    prepared = PreparedRequest(request=req, canonical=canonical, request_hash=request_hash(canonical))
    return result, unstored_plan_to_api(plan_row(prepared, req, result, settings.time_limit_s))


def with_onnx(body: dict, onnx_path: Path) -> dict:
    """Replace the request's model by the graph imported from an ONNX file."""
    from planner_service.importers.onnx import load_onnx_graph

    training = body.get("training") or {}
    graph = load_onnx_graph(str(onnx_path), training)
    return {**body, "model": {"graph": graph, "name": onnx_path.stem}}


def render_plan(result: PlanResult, d: dict) -> None:
    best = d["best"]
    p = best["prediction"]
    s = best["strategy"]
    t = Table(title="Best plan", show_header=False)
    knobs = ", ".join(f"{k}={v}" for k, v in s.items() if k not in ("layers_per_stage", "op_shardings") and v is not None)
    t.add_row("Strategy", knobs)
    t.add_row("Devices", f"{p['num_devices']} ({', '.join(result.device_types)})")
    t.add_row("Step time", f"{p['step_time_s']:.4g} s" + step_interval(p.get("step_time_s_p10"), p.get("step_time_s_p90"), p.get("interval_regime")))
    t.add_row("Throughput", f"{p['tokens_per_s']:,.0f} tokens/s")
    t.add_row("MFU", f"{p['mfu'] * 100:.1f}%")
    t.add_row("Peak memory (GB, tightest stage)", f"{max(p['peak_memory_GB']):.1f}" + _interval(p))
    t.add_row("Memory", memory_word(p, best["stages"]))
    t.add_row("Search", f"{d['search']['candidates']} candidates, {d['search']['pruned']} pruned, solver {d['search']['solver_status']}, {d['search']['wall_time_s']:.2f} s")
    console.print(t)
    st = Table(title="Pipeline stages")
    for col in ("Stage", "Layers", "Device", "Hosts", "Fwd + bwd per micro-batch", "Peak GB"):
        st.add_column(col)
    for e in best["stages"][:32]:
        hosts = e["hosts"]
        st.add_row(
            str(e["index"]),
            f"{e['first_layer']}–{e['last_layer']}",
            e["device"],
            (", ".join(hosts[:3]) + (f" +{len(hosts) - 3}" if len(hosts) > 3 else "")),
            f"{s_to_ms(e['time_per_microbatch_s']):.1f} ms",
            f"{e['peak_memory_GB']:.1f}",
        )
    console.print(st)
    ex = d["explanation"]
    console.print(f"[bold]Why:[/bold] {ex['summary']}; memory headroom {ex['memory_headroom_GB']} GB")
    for line, alt in zip(ex["alternatives"], d["alternatives"], strict=False):
        console.print(f"  vs {line}" + (" [yellow](memory tight)[/yellow]" if alt["prediction"].get("tight") else ""))
    if ex.get("placement"):
        console.print(f"[bold]Placement:[/bold] {ex['placement']}")
    for w in d["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}")


def _interval(p: dict) -> str:
    lo, hi = p.get("peak_memory_GB_p10"), p.get("peak_memory_GB_p90")
    if lo is None or hi is None:
        return ""
    basis = p.get("memory_interval_basis")
    return f" (p10–p90 {lo:.1f}–{hi:.1f}, {p.get('peak_memory_quantity', 'max_reserved')}{', ' + basis if basis else ''})"


def memory_word(p: dict, stages: list[dict] | None = None) -> str:
    """``fits`` / ``tight`` (p90 over usable memory: may run out; over the device's memory at
    the predicted peak itself: more likely than not) / ``does not fit``."""
    if not p.get("fits", True):
        return "[red]does not fit[/red]"
    if not p.get("tight"):
        return "fits"
    if any(st["peak_memory_GB"] > st["memory_capacity_GB"] for st in stages or ()):
        return "[yellow]tight[/yellow] (predicted peak above the device's memory: more likely than not to run out)"
    return "[yellow]tight[/yellow] (p90 above usable memory: may run out of memory)"


def _run_with_progress(body: dict, settings: SolverSettings, profile: dict | None = None) -> tuple[PlanResult, dict]:
    """Run the search in a thread; show a progress bar if it takes longer than a second."""
    box: dict = {}
    frac = {"v": 0.0}

    def work():
        try:
            box["result"] = plan_body(body, settings, progress=lambda f: frac.__setitem__("v", f), profile=profile)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    th = threading.Thread(target=work, daemon=True)
    th.start()
    th.join(1.0)
    if th.is_alive():
        with Progress(SpinnerColumn(), TextColumn("planning"), BarColumn(), TimeElapsedColumn(), console=err_console, transient=True) as prog:
            task = prog.add_task("plan", total=1.0)
            while th.is_alive():
                th.join(0.1)
                prog.update(task, completed=frac["v"])
    if "error" in box:
        raise box["error"]
    return box["result"]


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        request: Annotated[Path | None, typer.Argument(metavar="FILE", show_default=False, help="Plan request JSON: {model, training, cluster, constraints?, objective?, top_k?}.")] = None,
        as_json: Annotated[bool, typer.Option("--json", metavar="", help="Print the plan as JSON (the object POST /v1/plans returns; id and created_at null).")] = False,
        batch: BatchFileOption = None,
        onnx: Annotated[Path | None, typer.Option("--onnx", metavar="FILE", help="Plan this ONNX model with the request's training and cluster.")] = None,
        time_limit_s: Annotated[float, typer.Option("--time-limit", metavar="SECONDS", help="Search budget in deterministic seconds (solver work, not the clock: the same plan on any host).")] = 2.0,
        profile: ProfileFileOption = None,
    ) -> None:
        """Find the best hybrid-parallel strategy and rank placement."""
        settings = SolverSettings(time_limit_s=time_limit_s)
        prof = read_json_file(profile) if profile else None
        if batch is not None:
            with batch_progress(batch, lambda body: plan_body(body, settings, profile=prof)[1], "planning") as handle:
                run_batch(batch, handle)
            return
        if request is None:
            err_console.print("[red]error:[/red] give a request FILE or --batch FILE")
            raise typer.Exit(EXIT_BAD_INPUT)
        body = read_json_file(request)
        try:
            if onnx is not None:
                body = with_onnx(body, onnx)
            result, d = plan_body(body, settings, profile=prof) if as_json else _run_with_progress(body, settings, prof)
        except PlannerError as exc:
            fail(exc, as_json)
            return
        if as_json:
            print(json.dumps(d, indent=1))
        else:
            render_plan(result, d)
