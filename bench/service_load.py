"""Load benchmark of the plan service (``make bench-service``).

For each database (SQLite file, PostgreSQL database created for the run) it starts
``planner serve`` on 127.0.0.1 only, seeds plans through the API, then runs N concurrent
clients (asyncio + httpx, one connection each) for a bounded time per scenario:

* ``get_by_id``      GET /v1/plans/{id} of a random stored plan
* ``list_filtered``  GET /v1/plans with model / device / min_tokens_per_s / status filters
* ``post_repeated``  POST of an already-planned request (de-duplicated: 200 with the stored plan)
* ``post_new``       POST of a never-seen request (runs the planner: 201)
* ``mixed``          50% get, 30% list, 15% repeated POST, 5% new POST

and reports requests/s, p50/p99/max latency and errors.  Two more measurements, on SQLite, each
against a fresh server as deployed (searches in the process pool, quotas on):

* ``flood``: p99 of ``GET /healthz`` and ``GET /v1/plans/{id}`` (two probe clients, one request
  every 20 ms each, each in its own process) idle, then while 32 clients push 200 distinct
  expensive POSTs (llama3-70b on 16 mixed nodes, about 2.5 s of search each; a 429/503 is retried
  after its Retry-After);
  reported as the ratio flood / idle (goal: at most 5x).
* ``upload_memory``: the server's resident memory (``/proc/<pid>/status`` VmRSS, sampled every
  20 ms) before and during four concurrent uploads of one 250 MB ONNX file (a MatMul whose
  weight is stored in the file, generated with ``onnx.helper`` into a temporary directory);
  reported as the peak added (goal: under 600 MB).

Writes bench/results/service.json (keeping its ``check`` part, bench/service_check.py's) and
prints a table.  Client and server share the machine, so figures are a lower bound of what the
server does alone.

    python bench/service_load.py [--duration-s 10] [--clients 16] [--databases sqlite,postgresql]
                                 [--only load,flood,upload_memory]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_URL_TEMPLATE = "postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
SCENARIOS = ("get_by_id", "list_filtered", "post_repeated", "post_new", "mixed")
PRESETS = ("gpt3-125m", "gpt3-350m")


def request_body(name: str, preset: str = "gpt3-125m", nodes: int = 1) -> dict:
    return {
        "model": {"preset": preset, "name": name},
        "training": {"global_batch_size": 64, "sequence_length": 2048},
        "cluster": {
            "name": f"bench-{nodes}x8",
            "node_groups": [{"name": "g0", "count": nodes, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}],
        },
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, db_url: str, solver_time_limit_s: float, workers: int = 1, **extra_env: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # loopback, measured without keys or a rate limit (a limit would cap the figures)
        env = dict(os.environ, DATABASE_URL=db_url, PLANNER_SOLVER_TIME_LIMIT_S=str(solver_time_limit_s), PLANNER_AUTH="disabled", PLANNER_RATE_LIMIT="",
                   **extra_env)
        self.log = tempfile.NamedTemporaryFile(prefix="planner-bench-", suffix=".log", delete=False)  # noqa: SIM115 - the server's log, kept open while it runs
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "planner_service.cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--no-access-log", "--log-level", "warning", "--workers", str(workers)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited with {self.proc.returncode}; log: {self.log.name}")
            try:
                if httpx.get(self.base + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"server did not become ready; log: {self.log.name}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Stats:
    def __init__(self) -> None:
        self.latencies_s: list[float] = []
        self.errors = 0
        self.status: dict[int, int] = {}

    def record(self, status: int | None, dt: float, ok: bool) -> None:
        self.latencies_s.append(dt)
        if status is not None:
            self.status[status] = self.status.get(status, 0) + 1
        if not ok:
            self.errors += 1

    def summary(self, wall_s: float) -> dict:
        lat = sorted(self.latencies_s)
        n = len(lat)

        def pct(p: float) -> float | None:
            return round(lat[min(n - 1, int(p * n))] * 1000, 2) if n else None

        return {
            "requests": n,
            "errors": self.errors,
            "requests_per_s": round(n / wall_s, 1) if wall_s else 0.0,
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
            "max_ms": round(lat[-1] * 1000, 2) if n else None,
            "mean_ms": round(statistics.fmean(lat) * 1000, 2) if n else None,
            "status_counts": {str(k): v for k, v in sorted(self.status.items())},
            "wall_s": round(wall_s, 2),
        }


class Workload:
    def __init__(self, seeded: list[dict], run_tag: str) -> None:
        self.seeded = seeded  # [{"id", "body", "model", "tokens_per_s"}]
        self.run_tag = run_tag
        self.counter = 0

    def new_body(self) -> dict:
        self.counter += 1
        return request_body(f"bench-new-{self.run_tag}-{self.counter}", PRESETS[self.counter % 2])

    def op(self, scenario: str, rng: random.Random) -> tuple[str, str, dict | None, tuple[int, ...]]:
        if scenario == "mixed":
            x = rng.random()
            scenario = "get_by_id" if x < 0.5 else "list_filtered" if x < 0.8 else "post_repeated" if x < 0.95 else "post_new"
        if scenario == "get_by_id":
            return "GET", f"/v1/plans/{rng.choice(self.seeded)['id']}", None, (200,)
        if scenario == "list_filtered":
            p = rng.choice(self.seeded)
            params = rng.choice([
                f"model={p['model']}&limit=20",
                "device=A100-SXM4-80GB&limit=50&sort=-tokens_per_s",
                f"min_tokens_per_s={p['tokens_per_s'] * 0.5:.0f}&limit=20",
                "cluster=bench-1x8&status=optimal&limit=20",
                "limit=100",
            ])
            return "GET", f"/v1/plans?{params}", None, (200,)
        if scenario == "post_repeated":
            return "POST", "/v1/plans", rng.choice(self.seeded)["body"], (200,)
        return "POST", "/v1/plans", self.new_body(), (201,)


async def run_scenario(base: str, workload: Workload, scenario: str, clients: int, duration_s: float) -> dict:
    stats = Stats()
    stop_at = time.monotonic() + duration_s

    async def client(k: int) -> None:
        rng = random.Random(k)
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as c:
            while time.monotonic() < stop_at:
                method, url, body, expected = workload.op(scenario, rng)
                t0 = time.perf_counter()
                try:
                    r = await c.request(method, url, json=body)
                    stats.record(r.status_code, time.perf_counter() - t0, r.status_code in expected)
                except httpx.HTTPError:
                    stats.record(None, time.perf_counter() - t0, False)

    t0 = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return stats.summary(time.monotonic() - t0)


async def seed(base: str, count: int, run_tag: str) -> list[dict]:
    sem = asyncio.Semaphore(4)
    out: list[dict] = []

    async def one(i: int, c: httpx.AsyncClient) -> None:
        body = request_body(f"bench-seed-{run_tag}-{i}", PRESETS[i % 2], nodes=1 + i % 2)
        async with sem:
            r = await c.post("/v1/plans", json=body)
        if r.status_code not in (200, 201):
            raise SystemExit(f"seeding failed: {r.status_code} {r.text[:500]}")
        plan = r.json()
        out.append({"id": plan["id"], "body": body, "model": plan["model"]["name"], "tokens_per_s": plan["summary"]["tokens_per_s"]})

    async with httpx.AsyncClient(base_url=base, timeout=300) as c:
        await asyncio.gather(*(one(i, c) for i in range(count)))
    return out


def pg_create(db: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}"')
        conn.execute(f'CREATE DATABASE "{db}"')


def pg_drop(db: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def bench_database(kind: str, args: argparse.Namespace) -> dict:
    tag = f"{os.getpid()}"
    tmpdir = tempfile.TemporaryDirectory(prefix="planner-bench-")
    pg_db = None
    if kind == "sqlite":
        url = f"sqlite:///{tmpdir.name}/bench.db"
    else:
        pg_db = f"planner_bench_{os.getpid()}"
        pg_create(pg_db)
        url = PG_URL_TEMPLATE.format(db=pg_db)
        subprocess.run([sys.executable, "-m", "planner_service.cli.main", "db", "upgrade", "--database-url", url], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    # throughput, not quotas, is measured here: 16 clients may all search at once
    server = Server(url, args.solver_time_limit_s, args.server_workers, PLANNER_TENANT_MAX_CONCURRENT_SEARCHES="64",
                    PLANNER_SEARCH_MAX_INFLIGHT="64")
    try:
        t0 = time.monotonic()
        seeded = asyncio.run(seed(server.base, args.seed_plans, tag))
        seed_s = time.monotonic() - t0
        workload = Workload(seeded, tag)
        results = {}
        for scenario in args.scenarios:
            results[scenario] = asyncio.run(run_scenario(server.base, workload, scenario, args.clients, args.duration_s))
            print(f"  {kind:10s} {scenario:14s} {results[scenario]['requests_per_s']:8.1f} req/s", file=sys.stderr)
        return {"database": kind, "seed_plans": len(seeded), "seed_wall_s": round(seed_s, 2), "scenarios": results}
    finally:
        server.stop()
        if pg_db:
            pg_drop(pg_db)
        tmpdir.cleanup()


# ---------------------------------------------------------------------------------------------
# flood: cheap requests while expensive searches run
# ---------------------------------------------------------------------------------------------
FLOOD_POSTS = 200
FLOOD_CLIENTS = 32
PROBE_PAUSE_S = 0.02


def flood_body(i: int, run_tag: str) -> dict:
    body = json.loads((ROOT / "examples" / "plan_llama3_70b_mixed.json").read_text())
    body["model"]["name"] = f"flood-{run_tag}-{i}"
    return body


def _probe_main(base: str, path: str, stop, conn) -> None:
    """A probe client in its own process (so the flood's client work never delays it)."""
    out: list[float] = []
    with httpx.Client(base_url=base, timeout=60) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            r = c.get(path)
            out.append(time.perf_counter() - t0)
            if r.status_code != 200:
                out.append(float("nan"))
            time.sleep(PROBE_PAUSE_S)
    conn.send(out)


def _p(lat: list[float], q: float) -> float | None:
    lat = sorted(lat)
    return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2) if lat else None


def _probes(base: str, plan_id: str, work) -> tuple[dict, object]:
    """Run ``work`` (a coroutine function) while two probe processes measure."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs, pipes = [], []
    for path in ("/healthz", f"/v1/plans/{plan_id}"):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_probe_main, args=(base, path, stop, theirs))
        proc.start()
        procs.append(proc)
        pipes.append(mine)
    time.sleep(2.0)  # let them start before the work does
    try:
        result = asyncio.run(work())
    finally:
        stop.set()
    health, get = (pipe.recv() for pipe in pipes)
    for proc in procs:
        proc.join()
    if any(x != x for x in health + get):
        raise SystemExit("a probe got a status other than 200")
    return {"healthz": {"requests": len(health), "p50_ms": _p(health, 0.5), "p99_ms": _p(health, 0.99)},
            "get_plan": {"requests": len(get), "p50_ms": _p(get, 0.5), "p99_ms": _p(get, 0.99)}}, result


async def _flood(base: str, run_tag: str, max_s: float, posts: int = FLOOD_POSTS) -> dict:
    todo = list(range(posts))
    counts: dict[str, int] = {}
    deadline = time.monotonic() + max_s

    async def client() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=300) as c:
            while todo and time.monotonic() < deadline:
                i = todo.pop()
                while time.monotonic() < deadline:
                    r = await c.post("/v1/plans", json=flood_body(i, run_tag))
                    counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
                    if r.status_code not in (429, 503):
                        break
                    await asyncio.sleep(float(r.headers.get("Retry-After", "1")))  # as a client should

    t0 = time.monotonic()
    await asyncio.gather(*(client() for _ in range(FLOOD_CLIENTS)))
    return {"posts": posts, "clients": FLOOD_CLIENTS, "planned": counts.get("201", 0) + counts.get("200", 0),
            "status_counts": dict(sorted(counts.items())), "wall_s": round(time.monotonic() - t0, 1)}


def bench_flood(args: argparse.Namespace) -> dict:
    tag = f"{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="planner-flood-") as tmp:
        server = Server(f"sqlite:///{tmp}/flood.db", args.solver_time_limit_s, 1)
        try:
            seeded = asyncio.run(seed(server.base, 4, tag))

            async def idle() -> None:
                await asyncio.sleep(args.idle_s)

            idle_stats, _ = _probes(server.base, seeded[0]["id"], idle)
            flood_stats, flood = _probes(server.base, seeded[0]["id"], lambda: _flood(server.base, tag, args.flood_max_s, args.flood_posts))
        finally:
            server.stop()
    ratio = {k: round(flood_stats[k]["p99_ms"] / idle_stats[k]["p99_ms"], 2) for k in ("healthz", "get_plan")}
    print(f"  flood: healthz p99 {idle_stats['healthz']['p99_ms']} -> {flood_stats['healthz']['p99_ms']} ms ({ratio['healthz']}x), "
          f"get p99 {idle_stats['get_plan']['p99_ms']} -> {flood_stats['get_plan']['p99_ms']} ms ({ratio['get_plan']}x); {flood}", file=sys.stderr)
    return {"database": "sqlite", "idle": idle_stats, "flood": flood_stats, "p99_ratio": ratio, "posts": flood,
            "search_workers": 2, "request": "examples/plan_llama3_70b_mixed.json with distinct model names"}


# ---------------------------------------------------------------------------------------------
# upload memory
# ---------------------------------------------------------------------------------------------
UPLOAD_MB = 250
UPLOADS = 4


def make_big_onnx(path: Path, megabytes: int = UPLOAD_MB) -> int:
    """A two-MatMul model whose first weight (``megabytes`` MB of fp32) is stored in the file."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    cols = 1024
    rows = megabytes * 1_000_000 // (4 * cols)
    weight = helper.make_tensor("w0", TensorProto.FLOAT, [rows, cols], np.zeros(rows * cols, dtype=np.float32).tobytes(), raw=True)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [cols, 10], np.zeros(cols * 10, dtype=np.float32).tobytes(), raw=True)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["h"], name="fc0"), helper.make_node("Relu", ["h"], ["a"], name="act"),
         helper.make_node("MatMul", ["a", "w1"], ["y"], name="fc1")],
        "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], initializer=[weight, w1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = model.SerializeToString()
    del model, weight
    path.write_bytes(data)
    onnx.checker.check_model(str(path))
    return len(data)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def bench_upload_memory(args: argparse.Namespace) -> dict:
    import threading

    with tempfile.TemporaryDirectory(prefix="planner-upload-") as tmp:
        path = Path(tmp) / "big.onnx"
        size = make_big_onnx(path)
        server = Server(f"sqlite:///{tmp}/upload.db", args.solver_time_limit_s, 1)
        try:
            pid = server.proc.pid
            with httpx.Client(base_url=server.base, timeout=60) as c:  # warm: one small upload first
                small = ROOT / "examples" / "model.onnx"
                assert c.post("/v1/models/onnx", files={"file": ("model.onnx", small.read_bytes())}).status_code == 201
            time.sleep(0.5)
            before = rss_bytes(pid)
            peak = {"rss": before}
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    peak["rss"] = max(peak["rss"], rss_bytes(pid))
                    time.sleep(0.02)

            results: list[tuple[int, float]] = []

            def upload(k: int) -> None:
                t0 = time.monotonic()
                with open(path, "rb") as fh, httpx.Client(base_url=server.base, timeout=args.upload_timeout_s) as c:
                    r = c.post("/v1/models/onnx", files={"file": (f"big{k}.onnx", fh, "application/octet-stream")})
                results.append((r.status_code, time.monotonic() - t0))

            sampler = threading.Thread(target=sample)
            sampler.start()
            threads = [threading.Thread(target=upload, args=(k,)) for k in range(UPLOADS)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall_s = time.monotonic() - t0
            done.set()
            sampler.join()
            after = rss_bytes(pid)
        finally:
            server.stop()
    added_mb = (peak["rss"] - before) / 1e6
    print(f"  upload: {UPLOADS} x {size / 1e6:.0f} MB: RSS {before / 1e6:.0f} -> peak {peak['rss'] / 1e6:.0f} MB (+{added_mb:.0f} MB), "
          f"statuses {[s for s, _ in results]}, {wall_s:.1f} s", file=sys.stderr)
    return {"uploads": UPLOADS, "file_bytes": size, "statuses": sorted(s for s, _ in results), "rss_before_MB": round(before / 1e6, 1),
            "rss_peak_MB": round(peak["rss"] / 1e6, 1), "rss_after_MB": round(after / 1e6, 1), "rss_added_peak_MB": round(added_mb, 1),
            "wall_s": round(wall_s, 1)}


def print_table(doc: dict) -> None:
    header = f"{'database':<11} {'scenario':<14} {'req/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'requests':>9} {'errors':>7}"
    print(header)
    print("-" * len(header))
    for db in doc["results"]:
        for name, s in db["scenarios"].items():
            print(f"{db['database']:<11} {name:<14} {s['requests_per_s']:>8.1f} {s['p50_ms'] or 0:>9.1f} {s['p99_ms'] or 0:>9.1f} "
                  f"{s['max_ms'] or 0:>9.1f} {s['requests']:>9} {s['errors']:>7}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=10.0, help="per scenario and database")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seed-plans", type=int, default=24)
    ap.add_argument("--solver-time-limit-s", type=float, default=2.0)
    ap.add_argument("--databases", default="sqlite,postgresql")
    ap.add_argument("--server-workers", type=int, default=1, help="planner serve --workers")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "service.json"))
    ap.add_argument("--only", default="load,flood,upload_memory", help="which measurements: load, flood, upload_memory")
    ap.add_argument("--idle-s", type=float, default=8.0, help="flood: idle probing time")
    ap.add_argument("--flood-posts", type=int, default=FLOOD_POSTS, help="flood: distinct expensive POSTs")
    ap.add_argument("--flood-max-s", type=float, default=240.0, help="flood: stop pushing POSTs after this long")
    ap.add_argument("--upload-timeout-s", type=float, default=300.0)
    args = ap.parse_args()
    only = {x for x in args.only.split(",") if x}
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    bad = [s for s in args.scenarios if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario {bad[0]!r}; choose from {', '.join(SCENARIOS)}")
    kinds = [k for k in args.databases.split(",") if k]
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {}
    load_before = os.getloadavg()
    results = [bench_database(kind, args) for kind in kinds] if "load" in only else previous.get("results", [])
    flood = bench_flood(args) if "flood" in only else previous.get("flood")
    upload = bench_upload_memory(args) if "upload_memory" in only else previous.get("upload_memory")
    load_after = os.getloadavg()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    doc = {
        "benchmark": "service_load",
        "commit": commit,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(load_after[0], 2),
        },
        "config": {
            "clients": args.clients,
            "duration_s_per_scenario": args.duration_s,
            "seed_plans": args.seed_plans,
            "solver_time_limit_s": args.solver_time_limit_s,
            "server": f"planner serve --workers {args.server_workers} on 127.0.0.1; clients (asyncio, one connection each) on the same machine",
            "request": "gpt3-125m / gpt3-350m on 1-2 nodes x 8 A100-SXM4-80GB, global batch 64, seq 2048",
        },
        "results": results,
        "flood": flood,
        "upload_memory": upload,
    }
    if "check" in previous:
        doc["check"] = previous["check"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(doc)
    print(f"\nwritten {out}")
    ok = all(s["errors"] == 0 for db in results for s in db["scenarios"].values())
    if upload:
        ok = ok and upload["statuses"] == [201] * UPLOADS
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
