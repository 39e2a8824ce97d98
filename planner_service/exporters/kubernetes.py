"""Kubernetes jobs: Kubeflow PyTorchJob and PaddleJob (v1), Volcano Job, Kubeflow Trainer v2
TrainJob.

An operator fixes pod index → node rank, but the scheduler picks each pod's node and all pods
of a replica type share one template (docs/integration.md §0, §1).  So:

* **Placement** — every template carries required node affinity on ``kubernetes.io/hostname``
  (``In`` the hosts it may use, plus ``nvidia.com/gpu.product`` when the cluster description
  has the GFD label) and required pod anti-affinity on the hostname, so the job's pods land
  one per plan host.  The pod of rank 0's host is pinned alone where the operator lets us
  (PyTorchJob ``Master``, a Volcano ``master`` task), so the rendezvous master is that host.
  Volcano gets one task per hardware class (node group).
* **Ranks** — a ConfigMap carries ``plan_node.sh``, which reads the node the pod landed on
  (downward API ``spec.nodeName`` → ``NODE_NAME``), looks up that host's node rank, GPU list and
  NCCL settings, and starts the launcher; ``plan_rank.sh`` sets each process's ``RANK`` from
  (host, local rank) when the operator's node numbering cannot be trusted (Trainer v2) or the
  host's ranks are not contiguous.  Both scripts are the same for every plan size: they look
  the host up in ``plan_nodes.tsv.gz`` (one line per host: node rank, process count, GPUs,
  node group, first rank, and the rank list only where it is not contiguous), gzipped in the
  ConfigMap's ``binaryData`` with the per-rank ``rankmap.json.gz`` while that fits in
  :data:`RANKMAP_BUDGET_BYTES` (beyond, the map ships only with the artifact).  So the
  ConfigMap stays below the 256 KiB that ``kubectl apply`` stores in its last-applied
  annotation: about 30 KiB for 16,384 GPUs (docs/integration.md).
* Each pod requests all GPUs of its node (``nvidia.com/gpu``), so in-pod GPU indices are the
  node's (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import yaml

from planner_service.exporters.common import (
    RANK_WRAPPER,
    SMOKE_PADDLE,
    SMOKE_TORCH,
    Artifact,
    LaunchParams,
    k8s_name,
    launch_env,
    nccl_env,
    paddle_rank_lines,
    paddle_smoke_script,
    q,
    rankmap_dict,
    rankmap_json,
    torch_smoke_script,
)
from planner_service.exporters.plan_view import InvalidPlan, NodeSlot, PlanView

PLAN_MOUNT = "/opt/plan"
JOB_LABEL = "planner.dev/job"


class _Dumper(yaml.SafeDumper):
    pass


def _str_rep(dumper: yaml.SafeDumper, data: str) -> Any:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_rep)


def dump_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def node_gpus(view: PlanView, node: NodeSlot) -> int:
    """GPUs a pod requests: the whole node, so in-pod indices equal the node's."""
    return max(view.group_of(node).gpus_per_node, node.nproc, max(node.gpus) + 1)


NODES_TABLE = "plan_nodes.tsv.gz"
RANKMAP_GZ = "rankmap.json.gz"
#: The gzipped per-rank map goes in the ConfigMap up to this size (base64), so the ConfigMap
#: stays under the 256 KiB of kubectl's last-applied-configuration annotation.
RANKMAP_BUDGET_BYTES = 128 * 1024

#: Shell that finds this pod's row of plan_nodes.tsv.gz (the plan host, or its FQDN).
_LOOKUP = [
    'host="${PLAN_NODE_NAME:-${NODE_NAME:-$(hostname)}}"',
    # (awk reads to the end: an early exit would break gzip's pipe under pipefail)
    'row="$(gzip -dc "$PLAN_DIR/' + NODES_TABLE + '" | awk -v h="$host" \'!found && ($1 == h || index(h, $1 ".") == 1) {print; found = 1}\')"',
]


def nodes_table(view: PlanView) -> bytes:
    """``plan_nodes.tsv`` (gzipped): host, node rank, processes, GPUs, group index, first
    launcher rank, plan ranks (``-`` when they are the launcher's block) — in node order."""
    names = list(dict.fromkeys(n.node_group for n in view.placement.nodes))
    lines = []
    for n in view.placement.nodes:
        ranks = "-" if n.contiguous else ",".join(str(r) for r in n.ranks)
        lines.append(f"{n.host}\t{n.node_rank}\t{n.nproc}\t{n.cuda_visible_devices}\t{names.index(n.node_group)}\t{n.base_rank}\t{ranks}")
    return gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)


def _group_env_lines(view: PlanView, params: LaunchParams) -> list[str]:
    """NCCL settings per node group, chosen by the row's group index."""
    groups: dict[str, NodeSlot] = {}
    for n in view.placement.nodes:
        groups.setdefault(n.node_group, n)
    lines = ['case "$group" in']
    for i, n in enumerate(groups.values()):
        lines.append(f"  {i})")
        for k, v in nccl_env(view.group_of(n), params).items():
            lines.append(f"    export {k}={q(v)}")
        lines.append("    ;;")
    lines.append("esac")
    return lines


def k8s_rank_wrapper(view: PlanView) -> str:
    """``plan_rank.sh`` for pods: the rank of (host, local rank) from plan_nodes.tsv.gz, so
    the mapping holds whatever node order the operator gave the pods (see
    ``common.rank_wrapper_script`` for the per-host form the shared-directory launchers use)."""
    world = view.placement.world_size
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# plan_rank.sh: pins every process of plan {view.plan_id} to its plan rank and GPU (from {NODES_TABLE}).",
        "# Generated by the auto-parallel planner; do not edit by hand.",
        "set -euo pipefail",
        'PLAN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        *_LOOKUP,
        'local_rank="${LOCAL_RANK:-${PADDLE_LOCAL_RANK:-${PADDLE_RANK_IN_NODE:-}}}"',
        'if [ -z "$local_rank" ]; then echo "plan_rank.sh: no LOCAL_RANK from the launcher" >&2; exit 3; fi',
        'if [ -z "$row" ]; then echo "plan_rank.sh: host $host is not in the plan" >&2; exit 3; fi',
        'read -r _ _ nproc gpus _ base ranks_csv <<< "$row"',
        'if [ "$local_rank" -ge "$nproc" ]; then echo "plan_rank.sh: local rank $local_rank beyond $nproc on $host" >&2; exit 3; fi',
        'if [ "$ranks_csv" = "-" ]; then rank=$((base + local_rank)); else IFS="," read -r -a ranks <<< "$ranks_csv"; rank="${ranks[$local_rank]}"; fi',
        'export CUDA_VISIBLE_DEVICES="$gpus"',
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        'export RANK="$rank"',
        f"export WORLD_SIZE={world}",
        *paddle_rank_lines('read -r -a launcher_of <<< "$(gzip -dc "$PLAN_DIR/' + NODES_TABLE + '" | awk \'{if ($7 == "-") {for (j = 0; j < $3; j++) printf "%d ", $6 + j} else {n = split($7, a, ","); for (j = 1; j <= n; j++) printf "%s ", a[j]}}\')"'),
    ])


def node_script(view: PlanView, params: LaunchParams, mode: str) -> str:
    """``plan_node.sh``: this pod's node rank, GPUs and NCCL settings from its host's row of
    plan_nodes.tsv.gz, then the launcher.

    mode: ``torch-static`` (torchrun static rendezvous at $MASTER_ADDR with our node rank),
    ``torch-c10d`` (torchrun c10d at $PET_MASTER_ADDR; ranks from plan_rank.sh) or ``paddle``.
    """
    pl = view.placement
    wrap = mode == "torch-c10d" or pl.needs_remap
    lines = [
        "#!/usr/bin/env bash",
        f"# plan_node.sh ({mode}) for plan {view.plan_id}; generated by the auto-parallel planner.",
        "set -euo pipefail",
        'PLAN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        *_LOOKUP,
        'if [ -z "$row" ]; then',
        '  echo "plan_node.sh: this pod runs on $host, which is not in plan ' + view.plan_id + '" >&2',
        "  exit 3",
        "fi",
        'read -r _ node_rank nproc gpus group _ _ <<< "$row"',
        *_group_env_lines(view, params),
        'export PLAN_NODE_NAME="$host" PLAN_NODE_RANK="$node_rank"',
    ]
    for k, v in launch_env(view, params).items():
        lines.append(f"export {k}={q(v)}")
    if wrap:
        lines.append('if [[ "${1:-}" == *.py ]]; then set -- python -u "$@"; fi')
    nnodes = len(pl.nodes)
    wrapper = ['bash "$PLAN_DIR/' + RANK_WRAPPER + '"'] if wrap else []
    if mode == "torch-static":
        lines += [
            'export CUDA_VISIBLE_DEVICES="$gpus"',
            ': "${MASTER_ADDR:?MASTER_ADDR must point at the pod on ' + pl.master.host + '}"',
            f'port="${{MASTER_PORT:-{params.master_port}}}"',
            "launch() {",
            '  local p="$1"; shift',
            f'  torchrun --nnodes={nnodes} --nproc-per-node="$nproc" --node-rank="$node_rank" --rdzv-backend=static '
            '--master-addr="$MASTER_ADDR" --master-port="$p" --max-restarts=0 '
            + ("--no-python " + " ".join(wrapper) + " " if wrap else "")
            + '"$@"',
            "}",
        ]
        smoke = ("python -u " if wrap else "") + f'"$PLAN_DIR/{SMOKE_TORCH}"'
        if params.smoke_test:
            lines.append(f'launch "$((port + 1))" {smoke}')
        lines.append('launch "$port" "$@"')
    elif mode == "torch-c10d":
        lines += [
            'export CUDA_VISIBLE_DEVICES="$gpus"',
            ': "${PET_MASTER_ADDR:?PET_MASTER_ADDR is injected by the Trainer torch plugin}"',
            f'port="${{PET_MASTER_PORT:-{params.master_port}}}"',
            "launch() {",
            '  local p="$1"; local id="$2"; shift 2',
            f'  torchrun --nnodes={nnodes} --nproc-per-node="$nproc" --rdzv-backend=c10d '
            '--rdzv-endpoint="$PET_MASTER_ADDR:$p" --rdzv-id="$id" --max-restarts=0 --no-python '
            + " ".join(wrapper)
            + ' "$@"',
            "}",
        ]
        if params.smoke_test:
            lines.append(f'launch "$((port + 1))" {q(params.job_name + "-smoke")} python -u "$PLAN_DIR/{SMOKE_TORCH}"')
        lines.append(f'launch "$port" {q(params.job_name)} "$@"')
    elif mode == "paddle":
        lines += [
            ': "${PADDLE_MASTER:?PADDLE_MASTER is injected by the PaddleJob operator}"',
            "launch() {",
            f'  python -m paddle.distributed.launch --master="$PADDLE_MASTER" --nnodes={nnodes} --rank="$node_rank" '
            f'--nproc_per_node="$nproc" --devices="$gpus" --job_id={q(params.job_name)} --log_dir=log '
            + (" ".join(wrapper) + " " if wrap else "")
            + '"$@"',
            "}",
        ]
        if params.smoke_test:
            lines.append(("launch python -u " if wrap else "launch ") + f'"$PLAN_DIR/{SMOKE_PADDLE}"')
        lines.append('launch "$@"')
    else:  # pragma: no cover - internal
        raise ValueError(mode)
    lines.append("")
    return "\n".join(lines)


def config_map(view: PlanView, params: LaunchParams, mode: str) -> dict[str, Any]:
    """The plan's scripts (``data``) and tables (``binaryData``, gzipped): the same scripts for
    any plan size, so the ConfigMap stays small (see the module docstring)."""
    data = {"plan_node.sh": node_script(view, params, mode)}
    binary = {NODES_TABLE: base64.b64encode(nodes_table(view)).decode()}
    annotations = {}
    rankmap = base64.b64encode(gzip.compress(json.dumps(rankmap_dict(view), separators=(",", ":")).encode(), mtime=0)).decode()
    if len(rankmap) <= RANKMAP_BUDGET_BYTES:
        binary[RANKMAP_GZ] = rankmap
    else:
        annotations[JOB_LABEL + "-rankmap"] = (
            f"omitted: {len(rankmap) // 1024} KiB gzipped; rankmap.json ships with the launch artifact, and the "
            "pods compute their ranks from plan_nodes.tsv.gz"
        )
    if mode == "torch-c10d" or view.placement.needs_remap:
        data[RANK_WRAPPER] = k8s_rank_wrapper(view)
    if params.smoke_test:
        if mode == "paddle":
            data[SMOKE_PADDLE] = paddle_smoke_script()
        else:
            data[SMOKE_TORCH] = torch_smoke_script()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{params.job_name}-plan", "namespace": params.namespace, "labels": {JOB_LABEL: params.job_name},
                     **({"annotations": annotations} if annotations else {})},
        "data": data,
        "binaryData": binary,
    }


def _affinity(view: PlanView, params: LaunchParams, nodes: list[NodeSlot]) -> dict[str, Any]:
    exprs: list[dict[str, Any]] = [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [n.host for n in nodes]}
    ]
    products = sorted({p for p in (view.group_of(n).gpu_product for n in nodes) if p})
    if products and all(view.group_of(n).gpu_product for n in nodes):
        exprs.append({"key": "nvidia.com/gpu.product", "operator": "In", "values": products})
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": exprs}]}},
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {JOB_LABEL: params.job_name}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        },
    }


def pod_template(
    view: PlanView,
    params: LaunchParams,
    nodes: list[NodeSlot],
    container_name: str,
    image: str,
    ports: list[dict[str, Any]] | None = None,
    extra_env: list[dict[str, Any]] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    gpus = {node_gpus(view, n) for n in nodes}
    if len(gpus) != 1:
        raise InvalidPlan(
            f"hosts {', '.join(n.host for n in nodes)} share one pod template but have different GPU counts {sorted(gpus)}",
            field="target",
        )
    gpu_count = gpus.pop()
    container: dict[str, Any] = {
        "name": container_name,
        "image": image,
        "command": ["bash", f"{PLAN_MOUNT}/plan_node.sh"],
        "args": params.command_words,
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, *(extra_env or [])],
        "resources": {"limits": {"nvidia.com/gpu": gpu_count}},
        "volumeMounts": [{"name": "plan", "mountPath": PLAN_MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if ports:
        container["ports"] = ports
    spec: dict[str, Any] = {
        "affinity": _affinity(view, params, nodes),
        "containers": [container],
        "volumes": [
            {"name": "plan", "configMap": {"name": f"{params.job_name}-plan", "defaultMode": 0o755}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    devices = sorted({n.device for n in nodes})
    return {
        "metadata": {
            "labels": {JOB_LABEL: params.job_name},
            "annotations": {"planner.dev/hosts": ",".join(n.host for n in nodes), "planner.dev/devices": ",".join(devices)},
        },
        "spec": spec,
    }


def _meta(params: LaunchParams, view: PlanView) -> dict[str, Any]:
    return {
        "name": params.job_name,
        "namespace": params.namespace,
        "labels": {JOB_LABEL: params.job_name},
        "annotations": {"planner.dev/plan-id": view.plan_id},
    }


def _nproc_text(view: PlanView) -> str:
    counts = {n.nproc for n in view.placement.nodes}
    return str(counts.pop()) if len(counts) == 1 else "gpu"


def render_pytorchjob(view: PlanView, params: LaunchParams) -> Artifact:
    image = params.require_image("kubernetes-pytorchjob")
    pl = view.placement
    ports = [{"name": "pytorchjob-port", "containerPort": params.master_port}]
    specs: dict[str, Any] = {
        "Master": {
            "replicas": 1,
            "restartPolicy": "Never",
            "template": pod_template(view, params, [pl.master], "pytorch", image, ports),
        }
    }
    workers = list(pl.nodes[1:])
    if workers:
        specs["Worker"] = {
            "replicas": len(workers),
            "restartPolicy": "Never",
            "template": pod_template(view, params, workers, "pytorch", image, ports),
        }
    job: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _meta(params, view),
        "spec": {"nprocPerNode": _nproc_text(view), "runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": specs},
    }
    if params.queue:
        job["spec"]["runPolicy"]["schedulingPolicy"] = {"queue": params.queue, "minAvailable": len(pl.nodes)}
    text = dump_yaml([config_map(view, params, "torch-static"), job])
    notes = [
        f"Master is pinned to {pl.master.host} (node rank 0); Workers share one template pinned to the other hosts; "
        "plan_node.sh takes each pod's node rank from the node it landed on"
    ]
    return Artifact("kubernetes-pytorchjob", {"pytorchjob.yaml": text, "rankmap.json": rankmap_json(view)}, "pytorchjob.yaml", tuple(notes))


def render_paddlejob(view: PlanView, params: LaunchParams) -> Artifact:
    image = params.require_image("kubernetes-paddlejob")
    pl = view.placement
    ports = [{"name": "master", "containerPort": 36543}]
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PaddleJob",
        "metadata": _meta(params, view),
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "paddleReplicaSpecs": {
                "Worker": {
                    "replicas": len(pl.nodes),
                    "restartPolicy": "Never",
                    "template": pod_template(view, params, list(pl.nodes), "paddle", image, ports),
                }
            },
        },
    }
    if params.queue:
        job["spec"]["runPolicy"]["schedulingPolicy"] = {"queue": params.queue, "minAvailable": len(pl.nodes)}
    text = dump_yaml([config_map(view, params, "paddle"), job])
    notes = ["collective mode (Worker only); plan_node.sh passes --rank and --devices from the node each pod landed on"]
    return Artifact("kubernetes-paddlejob", {"paddlejob.yaml": text, "rankmap.json": rankmap_json(view)}, "paddlejob.yaml", tuple(notes))


def render_volcano(view: PlanView, params: LaunchParams) -> Artifact:
    image = params.require_image("volcano")
    pl = view.placement
    master_addr = f"{params.job_name}-master-0.{params.job_name}"
    env = [{"name": "MASTER_ADDR", "value": master_addr}, {"name": "MASTER_PORT", "value": str(params.master_port)}]
    tasks = [
        {
            "name": "master",
            "replicas": 1,
            "template": pod_template(view, params, [pl.master], "trainer", image, extra_env=env, restart_policy="Never"),
        }
    ]
    by_group: dict[str, list[NodeSlot]] = {}
    for n in pl.nodes[1:]:
        by_group.setdefault(n.node_group, []).append(n)
    used = {"master"}
    for group, nodes in by_group.items():
        name = k8s_name(group)
        while name in used:
            name = name + "-x"
        used.add(name)
        tasks.append(
            {
                "name": name,
                "replicas": len(nodes),
                "template": pod_template(view, params, nodes, "trainer", image, extra_env=env, restart_policy="Never"),
            }
        )
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": _meta(params, view),
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": len(pl.nodes),
            "queue": params.queue or "default",
            "maxRetry": 0,
            "plugins": {"svc": [], "env": []},
            "policies": [{"event": "PodEvicted", "action": "AbortJob"}, {"event": "PodFailed", "action": "AbortJob"}],
            "tasks": tasks,
        },
    }
    text = dump_yaml([config_map(view, params, "torch-static"), job])
    notes = [
        f"task 'master' is pinned to {pl.master.host} (node rank 0, MASTER_ADDR {master_addr}); "
        f"one task per hardware class: {', '.join(t['name'] for t in tasks[1:]) or 'none'}"
    ]
    return Artifact("volcano", {"volcano-job.yaml": text, "rankmap.json": rankmap_json(view)}, "volcano-job.yaml", tuple(notes))


def render_trainjob(view: PlanView, params: LaunchParams) -> Artifact:
    image = params.require_image("kubeflow-trainjob")
    pl = view.placement
    nodes = list(pl.nodes)
    template = pod_template(view, params, nodes, "node", image, restart_policy="Never")
    gpus = node_gpus(view, nodes[0])
    runtime_name = f"{params.job_name}-runtime"
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": runtime_name, "namespace": params.namespace, "labels": {"trainer.kubeflow.org/framework": "torch", JOB_LABEL: params.job_name}},
        "spec": {
            "mlPolicy": {"numNodes": len(nodes), "torch": {"numProcPerNode": _nproc_text(view)}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {"template": template},
                            },
                        }
                    ]
                }
            },
        },
    }
    container = template["spec"]["containers"][0]
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _meta(params, view),
        "spec": {
            "runtimeRef": {"name": runtime_name, "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"},
            "trainer": {
                "image": image,
                "command": container["command"],
                "args": container["args"],
                "numNodes": len(nodes),
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}},
                "env": [e for e in container["env"] if "value" in e],
            },
        },
    }
    if not trainjob["spec"]["trainer"]["env"]:
        del trainjob["spec"]["trainer"]["env"]
    text = dump_yaml([config_map(view, params, "torch-c10d"), runtime, trainjob])
    notes = [
        "Trainer v2 API of the reference CRD (trainer.kubeflow.org/v1alpha1, podSpecOverrides era); "
        "the TrainingRuntime carries the hostname affinity; ranks come from plan_rank.sh (c10d rendezvous)"
    ]
    return Artifact("kubeflow-trainjob", {"trainjob.yaml": text, "rankmap.json": rankmap_json(view)}, "trainjob.yaml", tuple(notes))
