"""``planner observe``, ``planner replan --recalibrated`` and ``planner calibration`` against the
app (the CLI's HTTP client replaced by the app's TestClient)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from helpers.requests import small_request
from planner_service.cli import observe as observe_cli

SAMPLES = Path(__file__).parent / "samples"


@pytest.fixture
def cli(client, monkeypatch):
    class Same:
        def __enter__(self):
            return client

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(observe_cli, "http_client", lambda server: Same())
    app = typer.Typer()
    observe_cli.register(app)
    return app


def test_observe_then_replan_recalibrated(cli, client, tmp_path):
    plan = client.post("/v1/plans", json=small_request()).json()
    step = plan["best"]["prediction"]["step_time_s"]
    log = tmp_path / "steps.csv"
    log.write_text("step,step_time_ms\n" + "\n".join(f"{i},{step * 1e3 * (3.0 if i == 1 else 1.3):.3f}" for i in range(1, 11)) + "\n")
    r = CliRunner().invoke(cli, ["observe", plan["id"], str(log), "--server", "http://planner", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["format"] == "csv" and out["observed"]["step_time_s"] == pytest.approx(step * 1.3, rel=1e-3)
    assert out["calibration"]["version"] == 1
    r = CliRunner().invoke(cli, ["observe", plan["id"], str(log), "--server", "http://planner"])
    assert r.exit_code == 0 and "version 2" in r.output and "observed" in r.output
    r = CliRunner().invoke(cli, ["calibration", "one-node", "--server", "http://planner"])
    assert r.exit_code == 0 and "gemm_efficiency.ampere" in r.output and "version 2" in r.output
    r = CliRunner().invoke(cli, ["replan", plan["id"], "--recalibrated", "--server", "http://planner", "--json"])
    assert r.exit_code == 0, r.output
    new = json.loads(r.output)
    assert new["parent_id"] == plan["id"] and new["calibration"]["version"] == 2
    assert new["best"]["prediction"]["step_time_s"] > step


def test_observe_refusals_exit_2(cli, client, tmp_path):
    plan = client.post("/v1/plans", json=small_request()).json()
    r = CliRunner().invoke(cli, ["observe", plan["id"], str(SAMPLES / "megatron_gpt1.3b_tp2_dp4.log"), "--server", "http://planner"])
    assert r.exit_code == 2 and "num_layers" in r.output
    r = CliRunner().invoke(cli, ["observe", plan["id"], str(tmp_path / "missing.log"), "--server", "http://planner"])
    assert r.exit_code == 2 and "cannot read" in r.output
    r = CliRunner().invoke(cli, ["observe", plan["id"], str(SAMPLES / "steps.csv")])
    assert r.exit_code == 2 and "--server" in r.output
    r = CliRunner().invoke(cli, ["replan", plan["id"], "--server", "http://planner"])
    assert r.exit_code == 2


def test_observe_prints_the_peak_in_the_units_of_the_prediction(cli, client, tmp_path):
    """The log's peak is stored in GB of 10^9 bytes; the CLI prints it as the allocator does (GiB),
    the units the prediction beside it is in."""
    plan = client.post("/v1/plans", json=small_request()).json()
    step = plan["best"]["prediction"]["step_time_s"]
    log = tmp_path / "steps.csv"
    log.write_text("step,step_time_ms,max_reserved_GB\n" + "\n".join(f"{i},{step * 1e3:.3f},24.0" for i in range(1, 11)) + "\n")
    r = CliRunner().invoke(cli, ["observe", plan["id"], str(log), "--server", "http://planner"])
    assert r.exit_code == 0, r.output
    assert "peak memory observed 22.4 GiB as printed (24.0 GB)" in " ".join(r.output.split())
