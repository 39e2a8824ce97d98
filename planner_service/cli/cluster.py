"""``planner cluster import``: cluster descriptions users already have → v1 cluster JSON."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cost_model.errors import PlannerError
from planner_service.cli.common import EXIT_BAD_INPUT, err_console, fail
from planner_service.importers import FORMATS, import_cluster


def register(app: typer.Typer) -> None:
    cluster = typer.Typer(help="Cluster descriptions: import from nvidia-smi, Paddle, Kubernetes, Slurm topology.conf.", no_args_is_help=True)
    app.add_typer(cluster, name="cluster")

    @cluster.command("import")
    def cluster_import(
        files: list[Path] = typer.Argument(..., help="Input files (nvidia-smi: one or more per node; slurm-topology: topology.conf and the cluster JSON; others: one)"),
        format: str = typer.Option(..., "--format", "-f", help="One of: " + ", ".join(FORMATS)),
        name: str | None = typer.Option(None, help="Cluster name"),
        out: Path | None = typer.Option(None, "--out", "-o", help="Write the cluster JSON here (else stdout)"),
        as_json: bool = typer.Option(False, "--json", help="Errors as JSON"),
    ) -> None:
        """Convert a cluster description to the planner's v1 cluster JSON."""
        sources = []
        for f in files:
            try:
                sources.append((str(f), f.read_text()))
            except (OSError, UnicodeDecodeError) as exc:
                err_console.print(f"[red]error:[/red] cannot read {f}: {exc}")
                raise typer.Exit(EXIT_BAD_INPUT) from None
        try:
            result = import_cluster(format, sources, name=name)
        except PlannerError as exc:
            fail(exc, as_json)
            return
        for w in result.warnings:
            err_console.print(f"[yellow]warning:[/yellow] {w}")
        text = json.dumps(result.cluster, indent=2) + "\n"
        if out is not None:
            out.write_text(text)
            err_console.print(f"wrote {out}")
        else:
            print(text, end="")
