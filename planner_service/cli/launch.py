"""``planner launch``: the launch artifacts of a stored plan or a plan file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from cost_model.errors import InvalidInput, PlannerError
from planner_service.cli.common import err_console, fail, read_json_file
from planner_service.exporters import TARGETS, launch_params_from, render
from planner_service.exporters.preflight import preflight_warnings
from planner_service.storage.errors import NotFound

DEFAULT_SERVER_ENV = "PLANNER_SERVER_URL"


def _fetch_plan(plan_id: str, server: str) -> dict[str, Any]:
    import httpx

    url = f"{server.rstrip('/')}/v1/plans/{plan_id}"
    try:
        key = os.environ.get("PLANNER_API_KEY")
        resp = httpx.get(url, timeout=30.0, headers={"Authorization": f"Bearer {key}"} if key else {})
    except httpx.HTTPError as exc:
        err_console.print(f"[red]error:[/red] cannot reach {server}: {exc}")
        raise typer.Exit(1) from None
    if resp.status_code == 404:
        raise NotFound(f"no plan {plan_id!r} on {server}", field="plan_id")
    if resp.status_code != 200:
        err_console.print(f"[red]error:[/red] {url} answered {resp.status_code}: {resp.text[:300]}")
        raise typer.Exit(1)
    return resp.json()


def _write_files(out: Path, files: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)


def register(app: typer.Typer) -> None:
    @app.command("launch")
    def launch(
        plan: str = typer.Argument(..., help="A plan id (fetched from --server) or a plan JSON file"),
        target: str = typer.Option(..., "--target", "-t", help="One of: " + ", ".join(TARGETS)),
        server: str | None = typer.Option(None, help=f"Planner service URL (default ${DEFAULT_SERVER_ENV})"),
        out: Path | None = typer.Option(None, "--out", "-o", help="Write all files into this directory (else print the primary file)"),
        image: str | None = typer.Option(None, help="Container image (Kubernetes targets)"),
        command: str | None = typer.Option(None, help="Training entry point and arguments (default per target)"),
        job_name: str | None = typer.Option(None, help="Job name (DNS-1123 label)"),
        namespace: str = typer.Option("default", help="Kubernetes namespace"),
        queue: str | None = typer.Option(None, help="Slurm partition / Volcano queue"),
        env: list[str] = typer.Option([], "--env", "-e", help="Extra environment KEY=VALUE (repeatable)"),
        smoke_test: bool = typer.Option(False, "--smoke-test", help="NCCL all-reduce smoke test before training"),
        nccl_debug: str = typer.Option("WARN", help="NCCL_DEBUG level"),
        master_port: int = typer.Option(29500, help="Rendezvous port on the master node"),
        as_json: bool = typer.Option(False, "--json", help="Print {target, primary, files, notes, warnings} as JSON"),
    ) -> None:
        """Render the launch artifacts of a plan: every rank on the plan's host and GPU."""
        options = dict(locals())  # the whole request: launch_params_from takes its launch fields
        try:
            path = Path(plan)
            if path.is_file():
                plan_dict = read_json_file(path)
            else:
                url = server or os.environ.get(DEFAULT_SERVER_ENV)
                if not url:
                    raise InvalidInput(
                        f"{plan!r} is not a file; give --server URL (or ${DEFAULT_SERVER_ENV}) to fetch a stored plan",
                        field="plan",
                    )
                plan_dict = _fetch_plan(plan, url)
            if not isinstance(plan_dict, dict):
                raise InvalidInput("must be a plan JSON object", field="plan")
            artifact = render(plan_dict, target, launch_params_from(options))
            warnings = preflight_warnings(plan_dict)
        except PlannerError as exc:
            fail(exc, as_json)
            return
        if as_json:
            print(json.dumps({**artifact.to_dict(), "warnings": warnings}, indent=2))
            return
        for w in warnings:
            err_console.print(f"[yellow]warning:[/yellow] {w}")
        if out is not None:
            _write_files(out, dict(artifact.files))
            err_console.print(f"wrote {len(artifact.files)} files to {out} (start with {artifact.primary})")
            for note in artifact.notes:
                err_console.print(f"note: {note}")
        else:
            print(artifact.files[artifact.primary], end="")
