"""The CLI step the training-setting tests share: ``planner estimate`` takes a request with the
setting and refuses it, exit code 2 naming the field, under a framework that cannot run it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner


def cli_estimates_then_refuses(cli: Any, tmp_path: Path, body: dict[str, Any], bad_training: dict[str, Any], field: str) -> dict[str, Any]:
    """``planner estimate FILE --json`` of ``body`` succeeds (its JSON returned); with
    ``training`` replaced by ``bad_training`` it exits 2 and names ``field``."""
    (tmp_path / "est.json").write_text(json.dumps(body))
    res = CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json"), "--json"])
    assert res.exit_code == 0, res.stdout
    (tmp_path / "bad.json").write_text(json.dumps({**body, "training": bad_training}))
    bad = CliRunner().invoke(cli, ["estimate", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and field in bad.stdout + (bad.stderr or ""), bad.stdout
    out: dict[str, Any] = json.loads(res.stdout)
    return out
