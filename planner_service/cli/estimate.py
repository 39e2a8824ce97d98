"""``planner estimate``: the cost model's prediction for one strategy."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from cost_model import estimate
from cost_model.errors import PlannerError
from cost_model.result import Estimate
from planner_service.cli.common import (
    EXIT_BAD_INPUT,
    console,
    err_console,
    fail,
    read_json_file,
    run_batch,
)
from planner_service.planner.request import parse_estimate_request


def run_estimate(body: dict, profile: dict | None = None):
    """Parse an estimate request body and predict it: (request, Estimate)."""
    req = parse_estimate_request(body)
    return req, estimate(req.model, req.training, req.cluster, req.strategy, profile=profile)


def as_json(req, est) -> dict:
    return {"strategy": req.strategy.to_dict(), "prediction": est.to_dict()}


def estimate_body(body: dict, profile: dict | None = None) -> dict:
    """The prediction for one request body as the JSON the CLI prints."""
    return as_json(*run_estimate(body, profile))


def render_estimate(est: Estimate, title: str) -> None:
    t = Table(title=title, show_header=False)
    t.add_row("step time", f"{est.step_time_s:.4g} s")
    t.add_row("throughput", f"{est.tokens_per_s:,.0f} tokens/s  ({est.samples_per_s:.3g} samples/s)")
    t.add_row("model TFLOP/s per GPU", f"{est.model_tflops_per_gpu:.1f}  (MFU {est.mfu * 100:.1f}%)")
    t.add_row("hardware TFLOP/s per GPU", f"{est.hardware_tflops_per_gpu:.1f}")
    t.add_row("fits in memory", "yes" if est.fits else "[red]no[/red]")
    t.add_row("peak memory per stage (GB)", ", ".join(f"{m:.1f}" for m in est.peak_memory_GB[:8]) + (" …" if len(est.peak_memory_GB) > 8 else ""))
    t.add_row("bottleneck", est.bottleneck)
    console.print(t)
    b = Table(title="where the step goes")
    b.add_column("term")
    b.add_column("seconds", justify="right")
    b.add_column("share", justify="right")
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
        request: Path | None = typer.Argument(None, help="Estimate request JSON: {model, training, cluster, strategy}."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        batch: Path | None = typer.Option(None, "--batch", help="JSON Lines file: one request per line; one JSON line out per line."),
        profile: Path | None = typer.Option(None, "--profile", help="Operator profile JSON to apply to the device it was taken on."),
    ) -> None:
        """Predict step time, throughput, MFU and memory for one parallel strategy."""
        prof = load_profile(profile)
        if batch is not None:
            run_batch(batch, lambda body: estimate_body(body, prof))
            return
        if request is None:
            err_console.print("[red]error:[/red] give a REQUEST.json or --batch FILE")
            raise typer.Exit(EXIT_BAD_INPUT)
        body = read_json_file(request)
        try:
            req, est = run_estimate(body, prof)
        except PlannerError as exc:
            fail(exc, as_json)
            return
        if as_json:
            print(json.dumps(as_json(req, est), indent=1))
            return
        render_estimate(est, f"{req.model.name} on {req.cluster.name}: {req.strategy.to_dict()}")
