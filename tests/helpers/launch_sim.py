"""Run generated launch scripts against fake launchers and report where every rank lands.

The scripts run for real under bash, with ``torchrun``, ``deepspeed``, ``srun``, ``python`` and
``hostname`` replaced by small recorders on PATH.  The harness then emulates each launcher's
documented numbering (docs/integration.md §0, §3):

* torchrun static rendezvous: node ``k`` gets global ranks ``sum(nproc of nodes < k) + i``;
* torchrun c10d: node ranks by sorted host name (the trap), so only a per-process fix-up helps;
* ``paddle.distributed.launch --rank``: the same block numbering, ``FLAGS_selected_gpus`` from
  ``--devices``, ``PADDLE_TRAINER_ENDPOINTS`` in launcher order;
* DeepSpeed: hostfile order, ``CUDA_VISIBLE_DEVICES`` = the node's ``--include`` slots (sorted).

and spawns every local process with that environment.  Each process (the fake ``python``)
records RANK and its GPU; the result is ``{rank: (host, physical gpu)}``.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import yaml

RECORDER = r'''#!/bin/bash
# Fake launcher / python / srun / hostname: records argv, env and cwd, starts nothing.
tool="$(basename "$0")"
case "$tool" in
  hostname) echo "${FAKE_HOSTNAME:-unknown-host}"; exit 0 ;;
  srun) while [[ "${1:-}" == -* ]]; do shift; done; exec "$@" ;;
esac
if [ "$tool" = python ] && [ "${1:-}" = -m ] && [ "${2:-}" = paddle.distributed.launch ]; then tool=paddle; shift 2; fi
kind=launch; if [ "$tool" = python ]; then kind=proc; fi
d="$SIM_RECORD/$kind-$$-$RANDOM$RANDOM"
mkdir "$d"
echo "$tool" > "$d/tool"
pwd > "$d/cwd"
printf '%s\0' "$@" > "$d/argv"
env -0 > "$d/env"
'''


def make_bin(tmp: Path) -> Path:
    bindir = tmp / "fakebin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name in ("torchrun", "deepspeed", "srun", "python", "hostname"):
        p = bindir / name
        p.write_text(RECORDER)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return bindir


def _read_record(d: Path) -> dict[str, Any]:
    def split0(data: bytes) -> list[str]:
        return [x.decode() for x in data.split(b"\0")[:-1]]

    env = {}
    for item in split0((d / "env").read_bytes()):
        k, _, v = item.partition("=")
        env[k] = v
    return {"tool": (d / "tool").read_text().strip(), "argv": split0((d / "argv").read_bytes()), "env": env,
            "cwd": (d / "cwd").read_text().strip()}


class Sim:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bindir = make_bin(tmp)
        self.record = tmp / "records"
        self.record.mkdir(exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "PADDLE", "NODE_NAME", "PLAN_"))}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env["PATH"] = f"{self.bindir}:{env.get('PATH', '')}"
        env["SIM_RECORD"] = str(self.record)
        env.update(extra)
        return env

    def write(self, files: dict[str, str], sub: str = "art") -> Path:
        d = self.tmp / sub
        d.mkdir(exist_ok=True)
        for name, text in files.items():
            p = d / name
            p.write_text(text)
            if name.endswith(".sh") or name.endswith(".sbatch"):
                p.chmod(0o755)
        return d

    def run(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        out = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"{args} failed ({out.returncode}): {out.stderr}\n{out.stdout}")

    def take(self, kind: str) -> list[dict[str, Any]]:
        recs = []
        for p in sorted(self.record.glob(f"{kind}-*")):
            recs.append(_read_record(p))
            shutil.rmtree(p)
        return recs

    # --- launcher emulation -------------------------------------------------------------
    def spawn(self, cmd: list[str], env: dict[str, str], cwd: str) -> None:
        self.run(cmd, env, Path(cwd))

    def emulate(self, launches: list[dict[str, Any]], c10d_order: str = "sorted") -> dict[int, tuple[str, int]]:
        if not launches:
            raise AssertionError("no launcher was started")
        tools = {r["tool"] for r in launches}
        assert len(tools) == 1, tools
        tool = tools.pop()
        if tool == "torchrun":
            self._torchrun(launches)
        elif tool == "paddle":
            self._paddle(launches)
        elif tool == "deepspeed":
            self._deepspeed(launches)
        else:  # pragma: no cover
            raise AssertionError(tool)
        return self.collect()

    @staticmethod
    def _flags(argv: list[str]) -> tuple[dict[str, str], list[str]]:
        flags: dict[str, str] = {}
        i = 0
        while i < len(argv) and argv[i].startswith("--"):
            key, _, value = argv[i][2:].partition("=")
            flags[key] = value if _ else "1"
            i += 1
        return flags, argv[i:]

    def _torchrun(self, launches: list[dict[str, Any]]) -> None:
        nodes = []
        for rec in launches:
            flags, entry = self._flags(rec["argv"])
            nodes.append((rec, flags, entry))
        backend = {f.get("rdzv-backend", "static") for _, f, _ in nodes}
        assert len(backend) == 1, backend
        if backend == {"static"}:
            nodes.sort(key=lambda n: int(n[1]["node-rank"]))
            assert [int(n[1]["node-rank"]) for n in nodes] == list(range(len(nodes)))
            masters = {n[1]["master-addr"] for n in nodes}
            assert len(masters) == 1, masters
        else:  # c10d: participants sorted by host name — the documented trap
            nodes.sort(key=lambda n: n[0]["env"].get("FAKE_HOSTNAME", ""))
        world = sum(int(f["nproc-per-node"]) for _, f, _ in nodes)
        for f in (n[1] for n in nodes):
            assert int(f["nnodes"]) == len(nodes)
        base = 0
        for group_rank, (rec, flags, entry) in enumerate(nodes):
            nproc = int(flags["nproc-per-node"])
            cmd = entry if "no-python" in flags else (["python", "-u", *entry])
            for i in range(nproc):
                env = dict(rec["env"], RANK=str(base + i), LOCAL_RANK=str(i), WORLD_SIZE=str(world), GROUP_RANK=str(group_rank),
                           LOCAL_WORLD_SIZE=str(nproc))
                self.spawn(cmd, env, rec["cwd"])
            base += nproc

    def _paddle(self, launches: list[dict[str, Any]]) -> None:
        nodes = []
        for rec in launches:
            flags, entry = self._flags(rec["argv"])
            nodes.append((rec, flags, entry))
        nodes.sort(key=lambda n: int(n[1]["rank"]))
        assert [int(n[1]["rank"]) for n in nodes] == list(range(len(nodes)))
        endpoints = []
        for rec, flags, _ in nodes:
            host = rec["env"]["FAKE_HOSTNAME"]
            for i, _dev in enumerate(flags["devices"].split(",")):
                endpoints.append(f"{host}:{6170 + i}")
        base = 0
        for rec, flags, entry in nodes:
            devices = flags["devices"].split(",")
            assert int(flags["nproc_per_node"]) == len(devices)
            cmd = ["python", "-u", *entry] if entry[0].endswith(".py") else entry
            for i, dev in enumerate(devices):
                env = {k: v for k, v in rec["env"].items() if k != "CUDA_VISIBLE_DEVICES"}
                env.update(PADDLE_TRAINER_ID=str(base + i), PADDLE_GLOBAL_RANK=str(base + i), PADDLE_LOCAL_RANK=str(i),
                           PADDLE_RANK_IN_NODE=str(i), FLAGS_selected_gpus=dev, PADDLE_TRAINER_ENDPOINTS=",".join(endpoints),
                           PADDLE_CURRENT_ENDPOINT=endpoints[base + i], PADDLE_TRAINERS_NUM=str(len(endpoints)))
                self.spawn(cmd, env, rec["cwd"])
            base += len(devices)

    def _deepspeed(self, launches: list[dict[str, Any]]) -> None:
        assert len(launches) == 1
        rec = launches[0]
        flags, entry = self._flags(rec["argv"])
        hostfile = Path(rec["cwd"]) / flags["hostfile"]
        order = []
        for line in hostfile.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                order.append(line.split()[0])
        include = {}
        for part in flags["include"].split("@"):
            host, _, slots = part.partition(":")
            include[host] = sorted(int(s) for s in slots.split(","))  # DeepSpeed may sort: assume it does
        assert set(include) == set(order)
        world = sum(len(v) for v in include.values())
        base = 0
        cmd = entry if "no_python" in flags else ["python", "-u", *entry]
        for host in order:
            slots = include[host]
            for i in range(len(slots)):
                env = dict(rec["env"], RANK=str(base + i), LOCAL_RANK=str(i), WORLD_SIZE=str(world),
                           CUDA_VISIBLE_DEVICES=",".join(map(str, slots)), FAKE_HOSTNAME=host)
                env.pop("PLAN_NODE_NAME", None)
                self.spawn(cmd, env, rec["cwd"])
            base += len(slots)

    def collect(self) -> dict[int, tuple[str, int]]:
        out: dict[int, tuple[str, int]] = {}
        for rec in self.take("proc"):
            env = rec["env"]
            host = env.get("FAKE_HOSTNAME")
            if "PADDLE_TRAINER_ID" in env:
                rank = int(env["PADDLE_TRAINER_ID"])
                sel = int(env["FLAGS_selected_gpus"])
                gpu = int(env["CUDA_VISIBLE_DEVICES"].split(",")[sel]) if env.get("CUDA_VISIBLE_DEVICES") else sel
                eps = env["PADDLE_TRAINER_ENDPOINTS"].split(",")
                assert eps[rank] == env["PADDLE_CURRENT_ENDPOINT"], "Paddle endpoint list out of rank order"
            else:
                rank = int(env["RANK"])
                gpu = int(env["CUDA_VISIBLE_DEVICES"].split(",")[int(env["LOCAL_RANK"])])
            assert rank not in out, f"rank {rank} started twice"
            out[rank] = (host, gpu)
        return out

    # --- drivers per artifact kind ----------------------------------------------------------
    def per_node_script(self, files: dict[str, str], script: str, hosts: list[str]) -> dict[int, tuple[str, int]]:
        d = self.write(files)
        for host in hosts:
            self.run(["bash", str(d / script), host], self.env(FAKE_HOSTNAME=host), d)
        return self.emulate(self.take("launch"))

    def slurm(self, files: dict[str, str]) -> dict[int, tuple[str, int]]:
        d = self.write(files)
        self.run(["bash", str(d / "job.sbatch")], self.env(SLURM_SUBMIT_DIR=str(d), SLURM_JOB_ID="42"), d)
        launches = self.take("launch")
        for rec in launches:  # the step ran on the host srun --nodelist named
            rec["env"]["FAKE_HOSTNAME"] = rec["env"]["PLAN_NODE_NAME"]
        rounds: dict[str, list[dict[str, Any]]] = {}
        for rec in launches:  # one round per run_steps call (smoke test, training)
            rounds.setdefault(self._flags(rec["argv"])[0]["master-port"], []).append(rec)
        results = [self.emulate(rounds[port]) for port in sorted(rounds)]
        assert all(r == results[0] for r in results)
        return results[0]

    def deepspeed(self, files: dict[str, str], script: str = "launch_deepspeed.sh") -> dict[int, tuple[str, int]]:
        d = self.write(files)
        self.run(["bash", str(d / script)], self.env(FAKE_HOSTNAME="launcher"), d)
        return self.emulate(self.take("launch"))

    def kubernetes(self, text: str, operator_env: dict[str, str]) -> tuple[dict[int, tuple[str, int]], list[dict[str, Any]]]:
        """Schedule one pod per affinity host of each template, run plan_node.sh in it."""
        docs = list(yaml.safe_load_all(text))
        cm = next(d for d in docs if d["kind"] == "ConfigMap")
        d = self.write(dict(cm["data"]), "pod")
        for name, b64 in (cm.get("binaryData") or {}).items():  # a ConfigMap volume holds the decoded bytes
            (d / name).write_bytes(base64.b64decode(b64))
        templates = pod_templates(docs)
        for _, replicas, tmpl in templates:
            spec = tmpl["spec"]
            hosts = affinity_hosts(spec)
            assert replicas == len(hosts), (replicas, hosts)
            container = spec["containers"][0]
            for host in hosts:
                env = self.env(FAKE_HOSTNAME=host, NODE_NAME=host, **operator_env)
                for e in container.get("env", []):
                    if "value" in e:
                        env[e["name"]] = e["value"]
                cmd = [c.replace("/opt/plan", str(d)) for c in container["command"]] + list(container.get("args", []))
                self.run(cmd, env, d)
        return self.emulate(self.take("launch")), templates


def pod_templates(docs: list[dict[str, Any]]) -> list[tuple[str, int, dict[str, Any]]]:
    """(role, replicas, pod template) of the job document."""
    out = []
    for doc in docs:
        kind = doc["kind"]
        if kind == "PyTorchJob":
            for role, spec in doc["spec"]["pytorchReplicaSpecs"].items():
                out.append((role, spec["replicas"], spec["template"]))
        elif kind == "PaddleJob":
            for role, spec in doc["spec"]["paddleReplicaSpecs"].items():
                out.append((role, spec["replicas"], spec["template"]))
        elif kind == "Job" and doc["apiVersion"].startswith("batch.volcano.sh"):
            for task in doc["spec"]["tasks"]:
                out.append((task["name"], task["replicas"], task["template"]))
        elif kind == "TrainingRuntime":
            num = doc["spec"]["mlPolicy"]["numNodes"]
            for rj in doc["spec"]["template"]["spec"]["replicatedJobs"]:
                out.append((rj["name"], num, rj["template"]["spec"]["template"]))
    return out


def affinity_hosts(pod_spec: dict[str, Any]) -> list[str]:
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 1
    for expr in terms[0]["matchExpressions"]:
        if expr["key"] == "kubernetes.io/hostname":
            assert expr["operator"] == "In"
            return list(expr["values"])
    raise AssertionError("no kubernetes.io/hostname affinity")


def plan_mapping(plan: dict[str, Any]) -> dict[int, tuple[str, int]]:
    return {r["rank"]: (r["host"], r["gpu"]) for r in plan["best"]["ranks"]}


def shell_words(line: str) -> list[str]:
    return shlex.split(line)
