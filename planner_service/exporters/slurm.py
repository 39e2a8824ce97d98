"""Slurm sbatch script.

``SLURM_JOB_NODELIST`` is a *sorted* hostlist, whatever order ``--nodelist`` gave
(docs/integration.md §0, §2), so nothing here derives a rank from it.  Instead the batch script
starts one job step per node with ``srun --nodes=1 --ntasks=1 --nodelist=HOST`` and an explicit
torchrun ``--node-rank`` (static rendezvous, master = the host of rank 0): the task → node
order is written out, line by line.  When the plan mixes device types there is one hetjob
component per device type (each with its own ``--nodes``/``--nodelist``/``--gpus-per-node``)
and each step names its ``--het-group``.  Every node is allocated whole (``--exclusive``, all
its GPUs) so that ``CUDA_VISIBLE_DEVICES`` can name the plan's GPUs by index.
"""

from __future__ import annotations

from planner_service.exporters.common import (
    RANK_WRAPPER,
    SMOKE_TORCH,
    Artifact,
    LaunchParams,
    job_env,
    python_command,
    q,
    rank_wrapper_script,
    rankmap_json,
    torch_smoke_script,
)
from planner_service.exporters.launchers import HEADER, torchrun_command
from planner_service.exporters.plan_view import NodeSlot, PlanView


def _components(view: PlanView) -> list[tuple[str, list[NodeSlot]]]:
    """One hetjob component per device type, in order of first appearance (rank 0's first)."""
    comps: dict[str, list[NodeSlot]] = {}
    for n in view.placement.nodes:
        comps.setdefault(n.device, []).append(n)
    return list(comps.items())


def render_slurm(view: PlanView, params: LaunchParams, entry: list[str] | None = None) -> Artifact:
    entry = entry if entry is not None else params.command_words
    wrap = view.placement.needs_remap
    comps = _components(view)
    het = len(comps) > 1
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={params.job_name}",
        "#SBATCH --output=%x-%j.out",
    ]
    for k, (_device, nodes) in enumerate(comps):
        if k > 0:
            lines.append("#SBATCH hetjob")
        gpus_per_node = max(max(view.group_of(n).gpus_per_node, n.nproc, max(n.gpus) + 1) for n in nodes)
        lines += [
            f"#SBATCH --nodes={len(nodes)}",
            f"#SBATCH --nodelist={','.join(n.host for n in nodes)}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={gpus_per_node}",
            "#SBATCH --exclusive",
        ]
        if params.queue:
            lines.append(f"#SBATCH --partition={params.queue}")
    lines += [
        "#",
        HEADER.format(plan_id=view.plan_id),
        "# Task -> node order is explicit: one srun step per node (Slurm sorts SLURM_JOB_NODELIST,",
        "# so it is never used to number nodes).  Components: "
        + "; ".join(f"{k}={device} ({len(nodes)} nodes)" for k, (device, nodes) in enumerate(comps)),
        "set -euo pipefail",
        'PLAN_DIR="${PLAN_DIR:-$SLURM_SUBMIT_DIR}"',
        f"export MASTER_ADDR={q(view.placement.master.host)}",
        f"export MASTER_PORT={params.master_port}",
        "",
        "run_steps() {",
        '  local port_offset="$1"; shift',
        "  local pids=()",
    ]
    comp_of = {n.host: k for k, (_, nodes) in enumerate(comps) for n in nodes}
    # Placeholder ``__ENTRY__`` is replaced by the entry point ("$@").
    for node in view.placement.nodes:
        env = {"PLAN_NODE_NAME": node.host, "CUDA_VISIBLE_DEVICES": node.cuda_visible_devices, **job_env(view, params, node)}
        env_words = " ".join(f"{k}={q(v)}" for k, v in env.items())
        srun = ["srun"]
        if het:
            srun.append(f"--het-group={comp_of[node.host]}")
        gpn = max(view.group_of(node).gpus_per_node, node.nproc, max(node.gpus) + 1)
        srun += ["--nodes=1", "--ntasks=1", f"--nodelist={node.host}", f"--gpus-per-node={gpn}", "--kill-on-bad-exit=1"]
        cmd = torchrun_command(view, params, node, ["__ENTRY__"], wrap)
        cmd = cmd.replace("--master-port=" + str(params.master_port), '--master-port="$((MASTER_PORT + port_offset))"')
        cmd = cmd.replace("__ENTRY__", '"$@"')
        lines.append(f"  # node rank {node.node_rank}: {node.host} ({node.device}), ranks {node.ranks[0]}..{node.ranks[-1]}")
        lines.append(f"  {' '.join(srun)} env {env_words} {cmd} &")
        lines.append("  pids+=($!)")
    lines += [
        "  local rc=0",
        '  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done',
        '  return "$rc"',
        "}",
        "",
        'cd "$PLAN_DIR"',
    ]
    if params.smoke_test:
        smoke = python_command([SMOKE_TORCH]) if wrap else [SMOKE_TORCH]
        lines.append("run_steps 1 " + " ".join(q(w) for w in smoke))
    user = python_command(entry) if wrap else entry
    lines.append("run_steps 0 " + " ".join(q(w) for w in user))
    lines.append("")
    files = {"job.sbatch": "\n".join(lines), "rankmap.json": rankmap_json(view)}
    notes = ["submit from a directory shared by all nodes: sbatch job.sbatch"]
    if het:
        notes.append(f"heterogeneous job: {len(comps)} components, one per device type")
    if wrap:
        files[RANK_WRAPPER] = rank_wrapper_script(view)
        notes.append("a host's ranks are not one contiguous block: plan_rank.sh sets RANK per process")
    if params.smoke_test:
        files[SMOKE_TORCH] = torch_smoke_script()
    return Artifact("slurm", files, "job.sbatch", tuple(notes))
