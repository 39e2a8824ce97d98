"""``planner estimate``: the cost model's prediction for one strategy.

``--json`` and every ``--batch`` line print the object ``POST /v1/estimate`` answers (the
contract's flat fields: ``step_time_s``, ``fits``, ``breakdown_s``, …), so a script reads one
shape whichever way it asked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cost_model import estimate
from cost_model.errors import PlannerError
from cost_model.result import Estimate
from cost_model.units import BILLION
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
from planner_service.planner.request import EstimateRequest, parse_estimate_request
from planner_service.service.identity import to_json_safe


def run_estimate(body: dict, profile: dict | None = None) -> tuple[EstimateRequest, Estimate]:
    """Parse an estimate request body and predict it: (request, Estimate)."""
    req = parse_estimate_request(body)
    return req, estimate(req.model, req.training, req.cluster, req.strategy, profile=profile)


def estimate_json(est: Estimate) -> dict[str, Any]:
    """The estimate as ``POST /v1/estimate`` returns it."""
    return to_json_safe(est.to_dict())


def estimate_body(body: dict, profile: dict | None = None) -> dict[str, Any]:
    """The prediction for one request body, as the JSON the API and the CLI print."""
    return estimate_json(run_estimate(body, profile)[1])


def describe_strategy(req: EstimateRequest) -> str:
    """A sentence naming the model, the cluster and the knobs that are not at their defaults,
    e.g. ``gpt3-175b on selene-128 with dp 16, tp 8, pp 8, micro-batch 1, sequence parallel,
    selective recompute, ZeRO-1``."""
    s = req.strategy
    a2a = req.training.cp_a2a_size if req.training.cp_exchange == "a2a+p2p" and s.cp > 1 else None
    parts = [f"{name} {value}" + (f" (all-to-all over {a2a} inside a ring of {s.cp // a2a})" if name == "cp" and a2a else "")
             for name, value in (("dp", s.dp), ("tp", s.tp), ("pp", s.pp), ("cp", s.cp), ("ep", s.ep), ("etp", s.etp), ("vpp", s.vpp))
             if name in ("dp", "tp", "pp") or value > 1 or (name == "etp" and value)]
    parts.append(f"micro-batch {s.micro_batch_size}")
    if s.sequence_parallel:
        parts.append("sequence parallel")
    if s.recompute != "none":
        group = f" in groups of {s.recompute_num_layers} layers" if s.recompute_method == "uniform" else ""
        first = f" of the first {s.recompute_num_layers} layers of each chunk" if s.recompute_num_layers and not group else ""
        parts.append(f"{s.recompute} recompute" + (group or first)
                     + (f" ({', '.join(s.recompute_modules)})" if s.recompute_modules else ""))
    parts.append(f"ZeRO-{s.zero_stage}" + (f" sharded over {s.dp_shard} of the dp ranks (HSDP, {s.dp // s.dp_shard} replicas)" if s.dp_shard else ""))
    if s.layers_per_stage:
        parts.append("layers per stage " + "/".join(str(n) for n in s.layers_per_stage))
    return f"{req.model.name} on {req.cluster.name} with {', '.join(parts)}"


def render_estimate(est: Estimate, title: str) -> None:
    t = Table(title=title, show_header=False)
    t.add_row("Step time", f"{est.step_time_s:.4g} s" + step_interval(est.step_time_s_p10, est.step_time_s_p90, est.interval_regime))
    t.add_row("Throughput", f"{est.tokens_per_s:,.0f} tokens/s  ({est.samples_per_s:.3g} samples/s)")
    t.add_row("Model TFLOP/s per GPU", f"{est.model_tflops_per_gpu:.1f}  (MFU {est.mfu * 100:.1f}%)")
    t.add_row("Hardware TFLOP/s per GPU", f"{est.hardware_tflops_per_gpu:.1f}")
    t.add_row("Fits in memory", ("[yellow]tight[/yellow] (p90 above the device's memory)" if est.tight else "yes") if est.fits else "[red]no[/red]")
    t.add_row("Peak memory per stage (GB)", ", ".join(f"{m:.1f}" for m in est.peak_memory_GB[:8]) + (" …" if len(est.peak_memory_GB) > 8 else ""))
    t.add_row("Bottleneck", est.bottleneck)
    if est.model_params and est.active_params and est.active_params != est.model_params:
        t.add_row("Parameters", f"{est.model_params / BILLION:.1f}B, {est.active_params / BILLION:.1f}B active per token")
    console.print(t)
    b = Table(title="Where the step time goes")
    b.add_column("Term")
    b.add_column("Seconds", justify="right")
    b.add_column("Share", justify="right")
    for k, v in est.breakdown_s.items():
        b.add_row(k, f"{v:.4g}", f"{v / est.step_time_s * 100:.1f}%")
    console.print(b)
    for w in est.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")


def load_profile(path: Path | None) -> dict | None:
    return read_json_file(path) if path else None


def register(app: typer.Typer) -> None:
    @app.command("estimate")
    def estimate_cmd(
        request: Annotated[Path | None, typer.Argument(metavar="FILE", show_default=False, help="Estimate request JSON: {model, training, cluster, strategy}.")] = None,
        print_json: Annotated[bool, typer.Option("--json", metavar="", help="Print the result as JSON (the object POST /v1/estimate returns).")] = False,
        batch: BatchFileOption = None,
        profile: ProfileFileOption = None,
    ) -> None:
        """Predict step time, throughput, MFU and memory for one parallel strategy."""
        prof = load_profile(profile)
        if batch is not None:
            with batch_progress(batch, lambda body: estimate_body(body, prof), "estimating") as handle:
                run_batch(batch, handle)
            return
        if request is None:
            err_console.print("[red]error:[/red] give a request FILE or --batch FILE")
            raise typer.Exit(EXIT_BAD_INPUT)
        body = read_json_file(request)
        try:
            req, est = run_estimate(body, prof)
        except PlannerError as exc:
            fail(exc, print_json)
            return
        if print_json:
            print(json.dumps(estimate_json(est), indent=1))
            return
        render_estimate(est, describe_strategy(req))
