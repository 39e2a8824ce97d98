"""Pieces every launch artifact shares: parameters, the artifact, shell quoting, NCCL
environment, the per-process rank wrapper and the NCCL smoke test."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from cost_model.devices import family_of
from cost_model.errors import InvalidInput
from planner_service.exporters.plan_view import (
    GroupInfo,
    InvalidPlan,
    NodeSlot,
    PlanView,
)

_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_pairs(pairs: list[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` strings (HTTP ``env`` query parameters, CLI ``--env``) → dict; a pair
    without ``=`` is an error naming ``env``."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"must be KEY=VALUE, got {pair!r}", field="env")
        env[key] = value
    return env


@dataclass(frozen=True)
class LaunchParams:
    """What the user adds to a plan to launch it.

    ``command`` is the training entry point and its arguments as one shell string; a first
    word ending in ``.py`` is run with ``python -u`` (torchrun and Paddle's launcher do that
    themselves).  ``env`` is extra environment for every process.  ``smoke_test`` adds an NCCL
    all-reduce over all ranks before training.  ``nccl_debug`` is NCCL_DEBUG (WARN by default:
    NCCL's docs advise against INFO in production).
    """

    image: str | None = None
    command: str | None = None  # None: the target's default (train.py, pretrain_gpt.py, ...)
    job_name: str | None = None
    namespace: str = "default"
    queue: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    smoke_test: bool = False
    master_port: int = 29500
    nccl_debug: str = "WARN"

    def validated(self, view: PlanView) -> LaunchParams:
        job = self.job_name or f"plan-{re.sub(r'[^a-z0-9-]', '', view.plan_id.lower())[:12] or 'job'}"
        job = job.strip("-") or "plan-job"
        if len(job) > 40 or not _DNS1123.fullmatch(job):
            raise InvalidPlan(
                f"must be a DNS-1123 label of at most 40 characters (lower-case letters, digits, '-'), got {job!r}",
                field="job_name",
            )
        if not _DNS1123.fullmatch(self.namespace or "") or len(self.namespace) > 63:
            raise InvalidPlan(f"must be a DNS-1123 label, got {self.namespace!r}", field="namespace")
        if self.queue is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", self.queue):
            raise InvalidPlan(f"must be a queue/partition name, got {self.queue!r}", field="queue")
        if self.command is not None and not self.command.strip():
            raise InvalidPlan("must not be empty", field="command")
        try:
            words = shlex.split(self.command or "train.py")
        except ValueError as exc:
            raise InvalidPlan(f"is not a valid shell command: {exc}", field="command") from None
        if not words:
            raise InvalidPlan("must not be empty", field="command")
        for key, value in self.env.items():
            if not _ENV_KEY.fullmatch(key):
                raise InvalidPlan(f"{key!r} is not an environment variable name", field="env")
            if not isinstance(value, str):
                raise InvalidPlan(f"value of {key} must be a string", field="env")
        if not (1 <= self.master_port <= 65534):
            raise InvalidPlan(f"must be a port number, got {self.master_port}", field="master_port")
        if self.nccl_debug not in ("VERSION", "WARN", "INFO", "TRACE"):
            raise InvalidPlan(f"must be VERSION, WARN, INFO or TRACE, got {self.nccl_debug!r}", field="nccl_debug")
        if self.image is not None and (not self.image or any(c.isspace() for c in self.image)):
            raise InvalidPlan(f"must be a container image reference, got {self.image!r}", field="image")
        return replace(self, job_name=job, env=dict(self.env))

    @property
    def command_words(self) -> list[str]:
        return shlex.split(self.command or "train.py")

    def with_default_command(self, command: str) -> LaunchParams:
        return self if self.command else replace(self, command=command)

    def require_image(self, target: str) -> str:
        if not self.image:
            raise InvalidInput(f"is required for target {target}", field="image")
        return self.image


def launch_params_from(options: Mapping[str, Any]) -> LaunchParams:
    """The launch parameters among ``options`` (a request's query, a command's options): the
    entries named like a :class:`LaunchParams` field, everything else ignored — so the route
    and ``planner launch`` hand over their whole request instead of repeating each field."""
    names = {f.name for f in fields(LaunchParams)}
    return launch_params(**{name: value for name, value in options.items() if name in names})


def launch_params(*, env: list[str] | None = None, **options: Any) -> LaunchParams:
    """The launch parameters from the options of ``GET /v1/plans/{id}/launch`` or
    ``planner launch`` (the one builder both use): ``env`` as ``KEY=VALUE`` strings, an option
    given as None takes :class:`LaunchParams`' default.  Checked against the plan later, by
    :meth:`LaunchParams.validated`."""
    given = {name: value for name, value in options.items() if value is not None}
    return LaunchParams(env=parse_env_pairs(env), **given)


@dataclass(frozen=True)
class Artifact:
    """Rendered files (name → text); ``primary`` is the one to look at first."""

    target: str
    files: Mapping[str, str]
    primary: str
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "primary": self.primary, "files": dict(self.files), "notes": list(self.notes)}


def q(word: Any) -> str:
    text = str(word)
    if text.startswith("="):  # NCCL's exact-match prefix: quote so no shell reads "=="
        return "'" + text.replace("'", "'\\''") + "'"
    return shlex.quote(text)


def python_command(words: list[str]) -> list[str]:
    """The command a wrapper must exec: ``x.py args`` → ``python -u x.py args``."""
    if words and (words[0].endswith(".py") or words[0] == "-m"):
        return ["python", "-u", *words]
    return list(words)


def nccl_env(group: GroupInfo | None, params: LaunchParams) -> dict[str, str]:
    """NCCL and CUDA settings for the nodes of one group (docs/integration.md §3)."""
    env = {"NCCL_DEBUG": params.nccl_debug, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if group is not None and group.nccl_socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = group.nccl_socket_ifname
    if group is not None and group.nccl_ib_hca:
        env["NCCL_IB_HCA"] = group.nccl_ib_hca
    return env


def job_env(view: PlanView, params: LaunchParams, node: NodeSlot | None = None) -> dict[str, str]:
    """Environment of one node's processes: NCCL for its group, then the framework's
    requirements and the user's extras (:func:`launch_env`)."""
    group = view.group_of(node) if node is not None else None
    env = nccl_env(group, params)
    env.update(launch_env(view, params))
    return env


def framework_env(view: PlanView) -> dict[str, str]:
    """Environment the plan's framework requires of its layout, on every node of every launcher
    (the user's ``env`` wins: :func:`launch_env`).  Megatron-LM and Megatron-DeepSpeed:

    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor or context parallelism on GPUs before
    Blackwell: one hardware work queue keeps a TP/CP collective ahead of the GEMM it overlaps,
    and Megatron-LM's ``validate_args`` asserts the variable (``megatron/training/arguments.py``:
    "Using tensor model parallelism or context parallelism require setting the environment
    variable CUDA_DEVICE_MAX_CONNECTIONS to 1"; Megatron-DeepSpeed raises the same for sequence
    parallelism and its asynchronous TP all-reduce), so a launch without it does not start.
    Blackwell lifted the requirement; under Megatron-FSDP (ZeRO 2/3) and with the MoE
    expert-parallel overlap Megatron only warns, as those want more connections, so it is left
    unset there.

    ``fsdp`` (torchtitan): ``PYTORCH_ALLOC_CONF=expandable_segments:True``, as
    torchtitan's own ``run_train.sh`` launches every job: the caching allocator maps memory as
    blocks grow instead of reserving fixed segments, so FSDP's per-unit gathers and frees leave
    little fragmentation — the low end of the plan's memory interval
    (``cost_model.transformer.memory``; the point prediction keeps the fraction fitted on
    measured peaks, which ran without it)."""
    framework = view.training.get("framework", "megatron-core")
    if framework == "fsdp":
        return {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    if framework not in ("megatron-core", "megatron-deepspeed"):
        return {}
    # Megatron-DeepSpeed's cp is Ulysses, not Megatron's context parallelism
    model_parallel = view.tp > 1 or (view.cp > 1 and framework == "megatron-core")
    pre_blackwell = any(family_of(d) != "blackwell" for d in view.device_types)
    fsdp = framework == "megatron-core" and int(view.s("zero_stage", 0)) in (2, 3)
    ep_overlap = bool(view.training.get("moe_comm_overlap")) and view.ep > 1  # the flag is written only with ep > 1
    if model_parallel and pre_blackwell and not fsdp and not ep_overlap:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def launch_env(view: PlanView, params: LaunchParams) -> dict[str, str]:
    """What every process of the job gets beyond NCCL's settings: the framework's requirements
    (:func:`framework_env`), then the user's ``env`` over them."""
    return {**framework_env(view), **params.env}


def export_lines(env: Mapping[str, str], indent: str = "") -> list[str]:
    return [f"{indent}export {k}={q(v)}" for k, v in env.items()]


def needs_rank_wrapper(view: PlanView, always: bool = False) -> bool:
    return always or view.placement.needs_remap


RANK_WRAPPER = "plan_rank.sh"


def rank_wrapper_script(view: PlanView) -> str:
    """Per-process wrapper: sets RANK (and Paddle's ids) from (host, local rank) per the plan.

    It runs between the launcher and the training script (``torchrun --no-python``,
    ``deepspeed --no_python``, Paddle's launcher runs any non-``.py`` entry point as is).  The
    host comes from ``PLAN_NODE_NAME`` (set by our node scripts), ``NODE_NAME`` (Kubernetes
    downward API ``spec.nodeName``), ``SLURMD_NODENAME``, then ``hostname``.  Because the rank
    is looked up, not computed, the mapping holds whatever order the launcher gave the nodes.
    """
    pl = view.placement
    world = pl.world_size
    lines = [
        "#!/usr/bin/env bash",
        f"# plan_rank.sh: pins every process of plan {view.plan_id} to its plan rank and GPU.",
        "# Generated by the auto-parallel planner; do not edit by hand.",
        "set -euo pipefail",
        'host="${PLAN_NODE_NAME:-${NODE_NAME:-${SLURMD_NODENAME:-$(hostname)}}}"',
        'local_rank="${LOCAL_RANK:-${PADDLE_LOCAL_RANK:-${PADDLE_RANK_IN_NODE:-}}}"',
        'if [ -z "$local_rank" ]; then echo "plan_rank.sh: no LOCAL_RANK from the launcher" >&2; exit 3; fi',
        'case "$host" in',
    ]
    for n in pl.nodes:
        pattern = f"{n.host}|{n.host}.*" if "." not in n.host else n.host
        lines.append(f"  {pattern})")
        lines.append(f"    ranks=({' '.join(str(r) for r in n.ranks)})")
        lines.append(f"    gpus={q(n.cuda_visible_devices)}")
        lines.append("    ;;")
    lines += [
        "  *)",
        '    echo "plan_rank.sh: host $host is not in the plan" >&2',
        "    exit 3",
        "    ;;",
        "esac",
        'if [ "$local_rank" -ge "${#ranks[@]}" ]; then echo "plan_rank.sh: local rank $local_rank beyond ${#ranks[@]} on $host" >&2; exit 3; fi',
        'rank="${ranks[$local_rank]}"',
        'export CUDA_VISIBLE_DEVICES="$gpus"',
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        'export RANK="$rank"',
        f"export WORLD_SIZE={world}",
        *paddle_rank_lines(f"launcher_of=({' '.join(str(r) for r in _launcher_to_plan(view))})"),
    ]
    return "\n".join(lines)


def paddle_rank_lines(launcher_of_assignment: str) -> list[str]:
    """The tail of every ``plan_rank.sh``: under Paddle's launcher (which numbers ranks in node
    order) move this process to its plan rank and reorder ``PADDLE_TRAINER_ENDPOINTS`` to match;
    then exec the command.  ``launcher_of_assignment`` is a bash statement that sets the array
    ``launcher_of`` (launcher rank → plan rank)."""
    return [
        "# Paddle: its launcher numbers ranks in node order; move this process and its endpoint.",
        'if [ -n "${PADDLE_TRAINER_ID:-}" ]; then',
        '  if [ -n "${PADDLE_TRAINER_ENDPOINTS:-}" ]; then',
        f"    {launcher_of_assignment}",
        '    IFS="," read -r -a old_eps <<< "$PADDLE_TRAINER_ENDPOINTS"',
        "    new_eps=()",
        '    for i in "${!old_eps[@]}"; do new_eps[${launcher_of[$i]}]="${old_eps[$i]}"; done',
        '    PADDLE_TRAINER_ENDPOINTS="$(IFS=,; echo "${new_eps[*]}")"',
        "    export PADDLE_TRAINER_ENDPOINTS",
        "  fi",
        '  export PADDLE_TRAINER_ID="$rank" PADDLE_GLOBAL_RANK="$rank"',
        "  export FLAGS_selected_gpus=\"$local_rank\"",
        "fi",
        'exec "$@"',
        "",
    ]


def _launcher_to_plan(view: PlanView) -> list[int]:
    """Plan rank of each launcher rank (launcher numbers nodes in our node order)."""
    out = [0] * view.placement.world_size
    for n in view.placement.nodes:
        for i, r in enumerate(n.ranks):
            out[n.base_rank + i] = r
    return out


SMOKE_TORCH = "nccl_smoke.py"
SMOKE_PADDLE = "nccl_smoke_paddle.py"


def torch_smoke_script() -> str:
    return '''"""NCCL all-reduce smoke test: every rank contributes its rank; the sum must be n(n-1)/2.
Run with the same launcher and environment as training, before it.  Generated by the planner."""
import datetime
import os
import socket

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((1 << 20,), float(rank), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    expected = world * (world - 1) / 2
    ok = bool(torch.all(x == expected))
    print(f"nccl smoke: rank {rank}/{world} on {socket.gethostname()} gpu {torch.cuda.current_device()} "
          f"({os.environ.get('CUDA_VISIBLE_DEVICES', '')}): {'ok' if ok else 'WRONG SUM'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
'''


def paddle_smoke_script() -> str:
    return '''"""NCCL all-reduce smoke test under paddle.distributed.launch.  Generated by the planner."""
import socket

import paddle
import paddle.distributed as dist


def main() -> None:
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    x = paddle.full([1 << 20], float(rank))
    dist.all_reduce(x)
    expected = world * (world - 1) / 2
    ok = bool(paddle.all(x == expected))
    print(f"nccl smoke: rank {rank}/{world} on {socket.gethostname()}: {'ok' if ok else 'WRONG SUM'}", flush=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
'''


def rankmap_dict(view: PlanView) -> dict[str, Any]:
    """Rank → host, GPU, mesh coordinates, stage and decoder layers (0-based, inclusive)."""
    starts: list[int] = []
    acc = 0
    for n in view.stage_layers or ():
        starts.append(acc)
        acc += n
    node_of = {}
    for n in view.placement.nodes:
        for i, r in enumerate(n.ranks):
            node_of[r] = (n.node_rank, i)
    chunk_layers: dict[int, list[list[int]]] = {}
    if view.virtual_layers:
        c_acc = 0
        for k, n in enumerate(view.virtual_layers):
            chunk_layers.setdefault(k % view.pp, []).append([c_acc, c_acc + n - 1] if n else [])
            c_acc += n
    ranks = []
    for s in view.placement.ranks:
        node_rank, local_rank = node_of[s.rank]
        entry: dict[str, Any] = {
            "rank": s.rank,
            "host": s.host,
            "gpu": s.gpu,
            "node_rank": node_rank,
            "local_rank": local_rank,
            "node_group": s.node_group,
            "device": s.device,
            "stage": s.stage,
            "pp": s.pp,
            "dp": s.dp,
            "cp": s.cp,
            "tp": s.tp,
        }
        if view.stage_layers:
            n = view.stage_layers[s.stage]
            entry["layers"] = [starts[s.stage], starts[s.stage] + n - 1] if n else []
            if view.vpp > 1:
                entry["layer_chunks"] = chunk_layers.get(s.stage, [])
        ranks.append(entry)
    return {
        "plan_id": view.plan_id,
        "world_size": view.placement.world_size,
        "order": "megatron: rank = ((pp*dp + dp_i)*cp + cp_i)*tp + tp_i",
        "strategy": {k: view.strategy.get(k) for k in ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch_size")},
        "nodes": [
            {
                "node_rank": n.node_rank,
                "host": n.host,
                "node_group": n.node_group,
                "device": n.device,
                "ranks": list(n.ranks),
                "gpus": list(n.gpus),
                "cuda_visible_devices": n.cuda_visible_devices,
            }
            for n in view.placement.nodes
        ],
        "ranks": ranks,
    }


def rankmap_json(view: PlanView) -> str:
    return json.dumps(rankmap_dict(view), indent=2) + "\n"


def k8s_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (name or "group")[:40].strip("-") or "group"
