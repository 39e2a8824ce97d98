"""Load benchmark of the plan service (``make bench-service``).

For each database (SQLite file, PostgreSQL database created for the run) it starts
``planner serve`` on 127.0.0.1 only, seeds plans through the API, then runs N concurrent
clients (asyncio + httpx, one connection each) for a bounded time per scenario:

* ``get_by_id``      GET /v1/plans/{id} of a random stored plan
* ``list_filtered``  GET /v1/plans with model / device / min_tokens_per_s / status filters
* ``post_repeated``  POST of an already-planned request (de-duplicated: 200 with the stored plan)
* ``post_new``       POST of a never-seen request (runs the planner: 201)
* ``mixed``          50% get, 30% list, 15% repeated POST, 5% new POST

and reports requests/s, p50/p99/max latency and errors.  Writes bench/results/service.json and
prints a table.  Client and server share the machine, so figures are a lower bound of what the
server does alone.

    python bench/service_load.py [--duration-s 10] [--clients 16] [--databases sqlite,postgresql]
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
    def __init__(self, db_url: str, solver_time_limit_s: float, workers: int = 1) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # loopback, measured without keys or a rate limit (a limit would cap the figures)
        env = dict(os.environ, DATABASE_URL=db_url, PLANNER_SOLVER_TIME_LIMIT_S=str(solver_time_limit_s), PLANNER_AUTH="disabled", PLANNER_RATE_LIMIT="")
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
    server = Server(url, args.solver_time_limit_s, args.server_workers)
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
    args = ap.parse_args()
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    bad = [s for s in args.scenarios if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario {bad[0]!r}; choose from {', '.join(SCENARIOS)}")
    kinds = [k for k in args.databases.split(",") if k]
    load_before = os.getloadavg()
    results = [bench_database(kind, args) for kind in kinds]
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
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(doc)
    print(f"\nwritten {out}")
    return 0 if all(s["errors"] == 0 for db in results for s in db["scenarios"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
