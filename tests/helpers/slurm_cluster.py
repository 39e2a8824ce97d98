"""A real single-node Slurm on localhost for the launch-file tests: munged, slurmctld and
slurmd (Debian's ``slurm-wlm`` and ``munge``; ``.ci/run`` installs them best effort) with a
minimal ``slurm.conf`` in a temporary directory, two count-only GPUs as GRES so that the
generated ``--gpus-per-node`` requests schedule on a host without GPUs.

:func:`start` returns the environment that points ``sbatch``/``srun`` at it, or raises
:class:`Unavailable` with the reason; :meth:`SlurmCluster.stop` ends the three daemons it
started (by their pid files, nothing else).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")


class Unavailable(Exception):
    """Slurm cannot start here; the message says why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    root: Path
    host: str
    env: dict[str, str]
    pid_files: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        for pid_file in reversed(self.pid_files):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)

    def log(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.root / "log").glob("*.log")))


def _conf(root: Path, host: str, user: str, cpus: int) -> str:
    ctld_port, d_port = _free_port(), _free_port()
    return f"""ClusterName=plannertest
SlurmctldHost={host}
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
GresTypes=gpu
NodeName={host} CPUs={cpus} RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def start(root: Path, timeout_s: float = 30.0) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under ``root``; wait until the node is idle."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        raise Unavailable(f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        raise Unavailable("slurmd must run as root to launch job steps")
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "munge", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    for i in range(2):
        (root / f"gpu{i}").touch()
    (root / "slurm.conf").write_text(_conf(root, host, "root", os.cpu_count() or 1))
    (root / "gres.conf").write_text(f"AutoDetect=off\nNodeName={host} Name=gpu File={root}/gpu[0-1]\n")
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    cluster = SlurmCluster(root=root, host=host, env=env)
    steps = [
        (["munged", "--force", f"--key-file={key}", f"--socket={root}/munge/munge.sock", f"--pid-file={root}/munge/munged.pid",
          f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed"], root / "munge" / "munged.pid"),
        (["slurmctld", "-f", str(root / "slurm.conf")], root / "slurmctld.pid"),
        (["slurmd", "-f", str(root / "slurm.conf")], root / "slurmd.pid"),
    ]
    for cmd, pid_file in steps:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            cluster.stop()
            raise Unavailable(f"{cmd[0]} did not start: {(res.stderr or res.stdout).strip()[-500:]}")
        cluster.pid_files.append(pid_file)
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        res = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True, timeout=30)
        state = res.stdout.strip()
        if state == "idle":
            return cluster
        time.sleep(0.5)
    log = cluster.log()
    cluster.stop()
    raise Unavailable(f"the Slurm node did not become idle (state {state!r}):\n{log}")
