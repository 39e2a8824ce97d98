"""Collective micro-benchmarks across local processes with ``torch.distributed``.

``world`` processes are spawned (gloo on CPU, NCCL on CUDA with one GPU per rank) and rendezvous
over TCP on 127.0.0.1.  Every group size from 2 to ``world`` (powers of two, plus ``world``) is
measured with all-reduce, all-gather, reduce-scatter and send/recv over a range of sizes.  One
sample times ``inner`` back-to-back collectives after a barrier; each rank's time is reduced
with MAX (a collective ends when its slowest rank does); the median of the samples is reported.

``bytes`` follows cost_model.comm: the all-reduced buffer; the *gathered* size for all-gather;
the *input* size for reduce-scatter; the message for send/recv (timed as half a ping-pong).
"""

from __future__ import annotations

import functools
import os
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

from cost_model.units import ms_to_s

OPS = ("allreduce", "allgather", "reduce_scatter", "sendrecv")


def size_grid(quick: bool, cuda: bool) -> tuple[int, ...]:
    if cuda:
        return tuple(1 << p for p in range(16, 31, 3 if quick else 1))
    return tuple(1 << p for p in range(12, 25, 3 if quick else 1))  # 4 KiB .. 16 MiB


def group_sizes(world: int) -> tuple[int, ...]:
    out = []
    n = 2
    while n < world:
        out.append(n)
        n *= 2
    if world >= 2:
        out.append(world)
    return tuple(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send_recv(dist: Any, x: Any, rank: int) -> None:
    """One ping-pong between ranks 0 and 1 (the point-to-point benchmark)."""
    if rank == 0:
        dist.send(x, 1)
        dist.recv(x, 1)
    elif rank == 1:
        dist.recv(x, 0)
        dist.send(x, 0)

def _worker(rank: int, world: int, port: int, cuda: bool, quick: bool, threads: int,
            sizes: tuple[int, ...] | None = None) -> list[dict]:
    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)
    torch.set_num_threads(max(1, threads))
    backend = "nccl" if cuda else "gloo"
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    import datetime

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    results: list[dict] = []
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    repeats = 5 if quick else 9
    try:
        for n in group_sizes(world):
            members = list(range(n))
            group = dist.new_group(members) if n < world else None
            inside = rank in members
            for op in OPS:
                if op == "sendrecv" and n != 2:
                    continue  # point-to-point is between ranks 0 and 1 whatever the group
                for nbytes in sizes or size_grid(quick, cuda):
                    elems = max(n, nbytes // 4)
                    elems -= elems % n
                    if inside:
                        x = torch.ones(elems, dtype=torch.float32, device=device)
                        if op == "allgather":
                            src = torch.ones(elems // n, dtype=torch.float32, device=device)
                            fn = functools.partial(all_gather, x, src, group=group)
                        elif op == "reduce_scatter":
                            out = torch.empty(elems // n, dtype=torch.float32, device=device)
                            fn = functools.partial(reduce_scatter, out, x, group=group)
                        elif op == "allreduce":
                            fn = functools.partial(dist.all_reduce, x, group=group)
                        else:
                            fn = functools.partial(_send_recv, dist, x, rank)
                    samples = []
                    inner = 1
                    for rep in range(repeats + 2):
                        dist.barrier()
                        if inside and (op != "sendrecv" or rank < 2):
                            sync()
                            t0 = time.perf_counter()
                            for _ in range(inner):
                                fn()
                            sync()
                            dt = (time.perf_counter() - t0) / inner
                        else:
                            dt = 0.0
                        t = torch.tensor([dt], dtype=torch.float64, device=device)
                        dist.all_reduce(t, op=dist.ReduceOp.MAX)
                        dt = float(t.item())
                        if rep == 0:
                            # size the inner loop so a sample lasts >= 2 ms (same on every rank)
                            inner = max(1, min(200, int(ms_to_s(2.0) / max(dt, 1e-7))))
                        elif rep >= 2:
                            samples.append(dt)
                    if op == "sendrecv":
                        samples = [s / 2.0 for s in samples]
                    if rank == 0:
                        results.append(
                            {
                                "op": op,
                                "backend": backend,
                                "group_size": n if op != "sendrecv" else 2,
                                "scope": "intra_node",
                                "dtype": "fp32",
                                "bytes": elems * 4,
                                "seconds": statistics.median(samples),
                                "repeats": len(samples),
                                "inner": inner,
                                "spread": {"min_s": min(samples), "max_s": max(samples),
                                           "iqr_s": _iqr(samples)},
                            }
                        )
                        print(f"PROGRESS {backend} {op} n={n} {elems * 4} bytes", flush=True)
            if group is not None:
                dist.destroy_process_group(group)
        return results
    finally:
        dist.destroy_process_group()


def _iqr(samples: list[float]) -> float:
    if len(samples) < 2:
        return 0.0
    q = statistics.quantiles(samples, n=4)
    return q[2] - q[0]


def planned_count(world: int, quick: bool, cuda: bool, sizes: tuple[int, ...] | None = None) -> int:
    groups = group_sizes(world)
    per_op = len(sizes or size_grid(quick, cuda))
    return (len(groups) * (len(OPS) - 1) + (1 if 2 in groups else 0)) * per_op


def _package_root() -> str:
    import planner_service

    return os.path.dirname(os.path.dirname(os.path.abspath(planner_service.__file__)))


def run_collectives(world: int, cuda: bool, quick: bool, threads_per_rank: int,
                    progress: Callable[[str], None] | None = None, timeout_s: float = 900.0,
                    sizes: tuple[int, ...] | None = None) -> list[dict]:
    """Start ``world`` ranks (``python -m planner_service.profiling.collectives``, so nothing
    depends on the caller's ``__main__``) and return rank 0's measurements."""
    import json
    import subprocess
    import sys

    port = _free_port()
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(max(1, threads_per_rank))
    root = _package_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs = []
    for r in range(world):
        cmd = [sys.executable, "-m", "planner_service.profiling.collectives", str(r), str(world), str(port),
               "cuda" if cuda else "cpu", "quick" if quick else "full", str(threads_per_rank),
               ",".join(map(str, sizes)) if sizes else "default"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout_s
    results: list[dict] | None = None
    error: str | None = None
    import threading

    timed_out = threading.Event()

    def _kill_all() -> None:
        timed_out.set()
        for p in procs:
            if p.poll() is None:
                p.kill()

    watchdog = threading.Timer(timeout_s, _kill_all)
    watchdog.daemon = True
    watchdog.start()
    try:
        assert procs[0].stdout is not None
        for line in procs[0].stdout:
            if time.monotonic() > deadline:
                error = f"collective benchmark timed out after {timeout_s:.0f} s"
                break
            if line.startswith("PROGRESS "):
                if progress:
                    progress(line[9:].strip())
            elif line.startswith("RESULT "):
                results = json.loads(line[7:])
            elif line.startswith("ERROR "):
                error = line[6:].strip()
        for p in procs:
            remaining = max(1.0, deadline - time.monotonic())
            try:
                p.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                error = error or f"collective benchmark timed out after {timeout_s:.0f} s"
    finally:
        watchdog.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    if timed_out.is_set() and results is None:
        error = f"collective benchmark timed out after {timeout_s:.0f} s"
    if results is None and error is None:
        errs = [p.stderr.read().strip().splitlines()[-1:] if p.stderr else [] for p in procs]
        error = "collective benchmark ranks failed: " + "; ".join(f"rank {i}: {e[0] if e else 'exit ' + str(p.returncode)}" for i, (e, p) in enumerate(zip(errs, procs, strict=True)))
    for p in procs:
        if p.stderr:
            p.stderr.close()
    if error:
        raise RuntimeError(error)
    return results or []


def _main(argv: list[str]) -> int:
    rank, world, port = int(argv[0]), int(argv[1]), int(argv[2])
    cuda, quick, threads = argv[3] == "cuda", argv[4] == "quick", int(argv[5])
    sizes = tuple(int(x) for x in argv[6].split(",")) if len(argv) > 6 and argv[6] != "default" else None
    try:
        results = _worker(rank, world, port, cuda, quick, threads, sizes)
    except Exception as exc:  # reported to the parent, which raises
        print(f"ERROR rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        return 1
    if rank == 0:
        import json

        print("RESULT " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
