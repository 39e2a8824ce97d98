"""``planner observe`` (post what a launched run printed), ``planner replan --recalibrated`` and
``planner calibration``: the observed-run loop against a planner service (``--server`` or
``$PLANNER_SERVER_URL``; ``$PLANNER_API_KEY`` as the bearer key)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from cost_model.errors import InvalidInput, PlannerError
from cost_model.transformer.memory import as_printed_GB
from planner_service.cli.common import EXIT_BAD_INPUT, console, err_console, fail
from planner_service.cli.launch import DEFAULT_SERVER_ENV
from planner_service.observations import observed_peak_GB

#: Log formats (planner_service.observations.parsers.FORMATS), repeated so the CLI's help does
#: not import the parsers.
FORMATS = ("auto", "megatron", "torchtitan", "chrome_trace", "deepspeed", "paddle", "json", "csv")


def http_client(server: str) -> Any:
    """The HTTP client the commands use (tests replace it with the app's TestClient)."""
    import httpx

    key = os.environ.get("PLANNER_API_KEY")
    return httpx.Client(base_url=server.rstrip("/"), timeout=300.0, headers={"Authorization": f"Bearer {key}"} if key else {})


def _server(server: str | None) -> str:
    url = server or os.environ.get(DEFAULT_SERVER_ENV)
    if not url:
        raise InvalidInput(f"give --server URL (or ${DEFAULT_SERVER_ENV})", field="server")
    return url


def _call(server: str, method: str, path: str, as_json: bool, body: dict[str, Any] | None = None) -> dict[str, Any]:
    import httpx

    try:
        with http_client(server) as client:
            resp = client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        err_console.print(f"[red]error:[/red] cannot reach {server}: {exc}")
        raise typer.Exit(1) from None
    try:
        data = resp.json()
    except ValueError:
        data = {"error": {"code": "bad_response", "message": resp.text[:300], "field": None}}
    if resp.status_code >= 400:
        err = data.get("error") if isinstance(data, dict) else None
        if as_json:
            print(json.dumps(data))
        elif isinstance(err, dict):
            where = f" ({err.get('field')})" if err.get("field") else ""
            err_console.print(f"[red]error{where}:[/red] {err.get('message')}")
        else:
            err_console.print(f"[red]error:[/red] {path} answered {resp.status_code}")
        raise typer.Exit(EXIT_BAD_INPUT if 400 <= resp.status_code < 500 else 1)
    return data if isinstance(data, dict) else {"items": data}


def _pct(x: Any, signed: bool = True) -> str:
    if not isinstance(x, (int, float)):
        return "n/a"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def register(app: typer.Typer) -> None:
    @app.command("observe")
    def observe(
        plan_id: str = typer.Argument(..., help="The stored plan the run was launched from"),
        logfile: Path = typer.Argument(..., help="The run's log, profiler trace, or JSON/CSV of step times"),
        fmt: str = typer.Option("auto", "--format", "-f", help="One of: " + ", ".join(FORMATS)),
        warmup_steps: int | None = typer.Option(None, "--warmup-steps", help="Log entries to drop as warm-up (default: 10%)"),
        server: str | None = typer.Option(None, help=f"Planner service URL (default ${DEFAULT_SERVER_ENV})"),
        as_json: bool = typer.Option(False, "--json", help="Print the stored observation as JSON"),
    ) -> None:
        """Post an observed run of a plan; the service recalibrates the plan's cluster."""
        try:
            url = _server(server)
            if fmt not in FORMATS:
                raise InvalidInput(f"must be one of {', '.join(FORMATS)}, got {fmt!r}", field="format")
            try:
                text = logfile.read_text(errors="replace")
            except OSError as exc:
                raise InvalidInput(f"cannot read {logfile}: {exc.strerror or exc}", field="logfile") from None
        except PlannerError as exc:
            fail(exc, as_json)
            return
        body: dict[str, Any] = {"log": text, "format": fmt}
        if warmup_steps is not None:
            body["warmup_steps"] = warmup_steps
        out = _call(url, "POST", f"/v1/plans/{plan_id}/observations", as_json, body)
        if as_json:
            print(json.dumps(out, indent=1))
            return
        o, p, c = out["observed"], out["predicted"], out.get("calibration") or {}
        console.print(f"observation {out['id']} ({out['format']}): {o['steps_used']} steps used "
                      f"({o['warmup_dropped']} warm-up, {o['outliers_dropped']} outliers dropped)")
        console.print(f"  step time observed {o['step_time_s']:.4g} s, predicted {p.get('step_time_s') or float('nan'):.4g} s "
                      f"({_pct(o.get('step_error_fraction'))})")
        observed_GB = observed_peak_GB(o)
        if observed_GB is not None:
            # predictions are in the units the allocator prints (binary; cost_model.transformer.memory)
            console.print(f"  peak memory observed {as_printed_GB(observed_GB):.1f} GiB as printed ({observed_GB:.1f} GB), "
                          f"predicted {p.get('peak_memory_GB') or float('nan'):.1f}")
        if c:
            console.print(f"  cluster {c['cluster']!r} recalibrated: version {c['version']} from {c['n_observations']} observation(s)")

    @app.command("replan")
    def replan(
        plan_id: str = typer.Argument(..., help="The stored plan to re-plan"),
        recalibrated: bool = typer.Option(False, "--recalibrated", help="At the cluster's latest calibration from observed runs"),
        server: str | None = typer.Option(None, help=f"Planner service URL (default ${DEFAULT_SERVER_ENV})"),
        as_json: bool = typer.Option(False, "--json", help="Print the new plan as JSON"),
    ) -> None:
        """Re-plan a stored plan (a new revision with a diff against it)."""
        try:
            url = _server(server)
            if not recalibrated:
                raise InvalidInput("give --recalibrated (cluster changes: POST /v1/plans/{id}/replan)", field="recalibrated")
        except PlannerError as exc:
            fail(exc, as_json)
            return
        out = _call(url, "POST", f"/v1/plans/{plan_id}/replan", as_json, {"recalibrated": True})
        if as_json:
            print(json.dumps(out, indent=1))
            return
        if "best" not in out:  # queued as a job
            console.print(f"queued as job {out.get('id')} ({out.get('status')})")
            return
        d = out.get("diff") or {}
        cal = out.get("calibration") or {}
        console.print(f"plan {out['id']} (calibration version {cal.get('version', 0)} of {cal.get('cluster')!r}): "
                      f"step {d.get('step_time_s_before') or float('nan'):.4g} s → {d.get('step_time_s_after') or float('nan'):.4g} s; "
                      + (", ".join(f"{k} {v['from']}→{v['to']}" for k, v in (d.get("strategy_changes") or {}).items()) or "same layout"))

    @app.command("calibration")
    def calibration(
        cluster: str = typer.Argument(..., help="The cluster's name"),
        server: str | None = typer.Option(None, help=f"Planner service URL (default ${DEFAULT_SERVER_ENV})"),
        as_json: bool = typer.Option(False, "--json", help="Print the calibration as JSON"),
    ) -> None:
        """The cluster's calibration from observed runs: constants, CV error, history."""
        try:
            url = _server(server)
        except PlannerError as exc:
            fail(exc, as_json)
            return
        out = _call(url, "GET", f"/v1/clusters/{cluster}/calibration", as_json)
        if as_json:
            print(json.dumps(out, indent=1))
            return
        cv = out.get("cross_validation") or {}
        console.print(f"cluster {out['cluster']!r}: calibration version {out['version']} from {out['n_observations']} observation(s); "
                      f"CV median |step error| {_pct(cv.get('median_abs_step_error'), False)} (public {_pct(cv.get('median_abs_step_error_public'), False)})")
        for k, v in sorted(out["constants"].items()):
            console.print(f"  {k:<40} {v:8.4f}  ± {out['log_sd'].get(k, 0):.3f} (log)")
