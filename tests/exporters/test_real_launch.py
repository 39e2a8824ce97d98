"""The torchrun and paddle.distributed.launch commands of a real plan, launched for real on
this host (2 processes, CPU): each process reports its RANK, LOCAL_RANK, host and the GPU it
would use, and that must be the plan's rank map.  Skips where the launcher is not installed
(.ci/run installs torch and paddlepaddle best effort)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from planner_service.exporters import launch_params, render
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_plan_request

REPORT = '''"""Report where this process landed (the launcher's environment), as JSON."""
import json, os, socket
env = os.environ
rank = int(env.get("RANK", env.get("PADDLE_TRAINER_ID", "-1")))
local = int(env.get("LOCAL_RANK", env.get("PADDLE_LOCAL_RANK", env.get("PADDLE_RANK_IN_NODE", "-1"))))
world = int(env.get("WORLD_SIZE", env.get("PADDLE_TRAINERS_NUM", "0")))
visible = env.get("CUDA_VISIBLE_DEVICES")
# The GPU this rank would use: CUDA_VISIBLE_DEVICES[LOCAL_RANK] (torchrun) or the device list
# the plan passed to paddle's --devices (PLAN_DEVICES here, see the test).
devices = (visible or env.get("PLAN_DEVICES", "")).split(",")
rec = {"rank": rank, "local_rank": local, "world": world, "host": env.get("PLAN_NODE_NAME") or socket.gethostname(),
       "gpu": int(devices[local])}
with open(os.path.join(env["REPORT_DIR"], f"report-rank{rank}.json"), "w") as fh:
    json.dump(rec, fh)
'''


@pytest.fixture(scope="module")
def one_host_plan() -> dict:
    host = socket.gethostname()
    body = {"model": {"preset": "gpt3-125m"}, "training": {"global_batch_size": 8, "sequence_length": 512},
            "cluster": {"name": "one", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 2, "device": "A100-SXM4-80GB",
                                                        "hostnames": [host]}]},
            "constraints": {"tp": 2}}
    return plan(parse_plan_request(body), SolverSettings()).to_dict()


def _launch(d: dict, target: str, tmp_path: Path, edit=lambda text: text) -> list[dict]:
    art = render(d, target, launch_params(command="report.py"))
    for name, text in art.files.items():
        (tmp_path / name).write_text(edit(text) if name == art.primary else text)
    (tmp_path / "report.py").write_text(REPORT)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "REPORT_DIR": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    res = subprocess.run(["bash", art.primary], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return sorted((json.loads(p.read_text()) for p in tmp_path.glob("report-rank*.json")), key=lambda r: r["rank"])


def _expected(d: dict) -> list[dict]:
    ranks = d["best"]["ranks"]
    hosts = sorted({r["host"] for r in ranks})
    return [{"rank": r["rank"], "local_rank": sorted(x["gpu"] for x in ranks if x["host"] == r["host"]).index(r["gpu"]),
             "world": len(ranks), "host": r["host"], "gpu": r["gpu"]} for r in sorted(ranks, key=lambda r: r["rank"])] if hosts else []


@pytest.mark.slow
def test_torchrun_command_runs_and_ranks_land_as_planned(one_host_plan, tmp_path):
    pytest.importorskip("torch.distributed.run", reason="torch is not installed (pip install torch)")
    got = _launch(one_host_plan, "torchrun", tmp_path)
    assert got == _expected(one_host_plan)


@pytest.mark.slow
def test_paddle_launch_command_runs_and_ranks_land_as_planned(one_host_plan, tmp_path):
    pytest.importorskip("paddle.distributed.launch", reason="paddlepaddle is not installed (pip install paddlepaddle)")
    import paddle

    def on_cpu(text: str) -> str:
        """Paddle's CPU build has no GPU labels for --devices to select: on a host without
        CUDA the plan's device list travels in PLAN_DEVICES instead (the rest of the command,
        master, node rank and process count, runs unchanged)."""
        if paddle.device.is_compiled_with_cuda():
            return text
        import re

        return re.sub(r" --devices=(\S+)", lambda m: "", text.replace("python -m paddle.distributed.launch",
                      "PLAN_DEVICES=" + re.search(r"--devices=(\S+)", text).group(1) + " python -m paddle.distributed.launch"))

    got = _launch(one_host_plan, "paddle-launch", tmp_path, on_cpu)
    assert got == _expected(one_host_plan)
