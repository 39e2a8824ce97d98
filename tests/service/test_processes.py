"""Real processes: ``planner serve`` under concurrent identical POSTs, SIGKILL in the middle of a
stream of POSTs, two ``planner worker`` processes sharing one queue, start-up schema checks.

Everything runs as deployed on a shared network: the servers with auth on (``PLANNER_AUTH=
enabled``, clients send a tenant's key) and their searches in the default process pool; the
workers' jobs belong to two tenants."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select, text

from helpers.requests import PG_URL, small_request
from planner_service.service.identity import canonical_request, request_hash
from planner_service.service.plans import PlanService
from planner_service.settings import ServiceSettings
from planner_service.storage.db import check_schema, head_revision, make_engine
from planner_service.storage.errors import NotFound
from planner_service.storage.models import PlanRow
from planner_service.storage.repository import Repository

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "planner_service.cli.main"]


def _env(db_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"DATABASE_URL": db_url, "PLANNER_SOLVER_TIME_LIMIT_S": "1.0", "PLANNER_WORKER_POLL_INTERVAL_S": "0.05", "PYTHONUNBUFFERED": "1",
                "PLANNER_AUTH": "enabled", "PLANNER_SEARCH_EXECUTOR": "process"})
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, db_url: str, log: Path, tenant: str = "team-a", log_args: tuple[str, ...] = ("--no-access-log", "--log-level", "warning"),
                 **env: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115 - the server's log for its lifetime, closed in stop()
        self.proc = subprocess.Popen(
            [*CLI, "serve", "--host", "127.0.0.1", "--port", str(self.port), *log_args],
            env=_env(db_url, **env),
            stdout=self._fh,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {log.read_text()[-3000:]}")
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        engine = make_engine(db_url)  # the server created and migrated the database; a key of one tenant
        try:
            key, _ = Repository(engine).create_api_key(tenant, "member")
        finally:
            engine.dispose()
        self.headers = {"Authorization": f"Bearer {key}"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()


@pytest.fixture
def servers(tmp_path):
    started: list[Server] = []

    def start(db_url: str, **env: str) -> Server:
        s = Server(db_url, tmp_path / f"server{len(started)}.log", **env)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def _plan_rows(db_url: str) -> list:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(PlanRow.__table__)).all()
    finally:
        engine.dispose()


def test_16_clients_posting_the_same_request_50_times_store_one_plan(db_url, servers):
    server = servers(db_url)
    body = small_request()

    async def client(start: asyncio.Event) -> list[tuple[int, str]]:
        out = []
        async with httpx.AsyncClient(base_url=server.base, timeout=60, limits=httpx.Limits(max_connections=1), headers=server.headers) as c:
            await start.wait()
            for _ in range(50):
                r = await c.post("/v1/plans", json=body)
                out.append((r.status_code, r.json()["id"] if r.status_code in (200, 201) else r.text[:200]))
        return out

    async def run() -> list[tuple[int, str]]:
        start = asyncio.Event()
        tasks = [asyncio.create_task(client(start)) for _ in range(16)]
        await asyncio.sleep(0.05)
        start.set()  # all 16 connections fire their first POST together
        return [r for rs in await asyncio.gather(*tasks) for r in rs]

    assert httpx.post(server.base + "/v1/plans", json=body, timeout=60).status_code == 401
    results = asyncio.run(run())
    assert len(results) == 800
    assert {status for status, _ in results} <= {200, 201}, [r for r in results if r[0] not in (200, 201)][:3]
    assert len({plan_id for _, plan_id in results}) == 1
    assert sum(1 for status, _ in results if status == 201) == 1
    rows = _plan_rows(db_url)
    assert len(rows) == 1 and rows[0].tenant == "team-a"


def test_sigkill_mid_stream_keeps_every_acknowledged_plan_and_no_partial_rows(db_url, servers, tmp_path):
    if db_url.startswith("sqlite"):  # a file that does not exist yet: the server creates and migrates it
        db_url = f"sqlite:///{tmp_path / 'new' / 'killed.db'}"
    server = servers(db_url)
    acked: dict[str, tuple[dict, dict]] = {}
    lock = threading.Lock()
    killed = threading.Event()
    target = 5

    def stream(k: int) -> None:
        with httpx.Client(base_url=server.base, timeout=60, headers=server.headers) as c:
            i = 0
            while not killed.is_set():
                body = small_request(model={"preset": "gpt3-125m", "name": f"kill-{k}-{i}"})
                i += 1
                try:
                    r = c.post("/v1/plans", json=body)
                except httpx.TransportError:
                    return
                assert r.status_code == 201, r.text
                with lock:
                    acked[r.json()["id"]] = (body, r.json())

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(acked) < target:
        assert time.monotonic() < deadline and all(t.is_alive() for t in threads)
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    killed.set()
    for t in threads:
        t.join()
    assert server.proc.returncode == -signal.SIGKILL

    rows = _plan_rows(db_url)
    assert len(acked) <= len(rows) <= len(acked) + 3  # at most the in-flight requests committed unacknowledged
    for row in rows:  # every row is whole: summary columns and the full request and result
        assert row.result["best"]["ranks"] and row.request["model"]["name"].startswith("kill-")
        assert row.tokens_per_s > 0 and row.step_time_s > 0 and row.device_types.startswith(",")
    if db_url.startswith("sqlite"):
        engine = make_engine(db_url)
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"
        engine.dispose()

    restarted = servers(db_url)
    with httpx.Client(base_url=restarted.base, timeout=60, headers=restarted.headers) as c:
        for plan_id, (body, plan) in acked.items():
            got = c.get(f"/v1/plans/{plan_id}")
            assert got.status_code == 200 and got.json() == plan
            again = c.post("/v1/plans", json=body)
            assert again.status_code == 200 and again.json()["id"] == plan_id
    assert len(_plan_rows(db_url)) == len(rows)


def test_log_lines_are_json_with_the_request_id_and_no_request_values(db_url, tmp_path):
    log = tmp_path / "server.log"
    server = Server(db_url, log, log_args=("--log-level", "info"))
    try:
        with httpx.Client(base_url=server.base, timeout=60, headers=server.headers) as c:
            r = c.get("/v1/plans?model=secret-model-name", headers={"X-Request-ID": "trace-77"})
            assert r.status_code == 200 and r.headers["X-Request-ID"] == "trace-77"
            bad = c.post("/v1/plans", json=small_request(cluster={"name": "x\u0000secret", "node_groups": []}))
            assert bad.status_code == 422 and len(bad.headers["X-Request-ID"]) == 32
    finally:
        server.stop()
    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
    assert lines and all({"ts", "level", "logger", "message", "request_id"} <= set(x) for x in lines)
    access = [x for x in lines if x["request_id"] == "trace-77"]
    assert access and "GET /v1/plans?model=secret-model-name" in access[0]["message"]
    assert not [x for x in lines if x["level"] in ("error", "critical")]
    assert "secret\\u0000" not in log.read_text() and "x\x00secret" not in log.read_text()


def _start_worker(db_url: str, log: Path, name: str) -> tuple[subprocess.Popen, Path]:
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*CLI, "worker", "--worker-id", name, "--log-level", "info"], env=_env(db_url), stdout=fh, stderr=subprocess.STDOUT)
    return proc, log


def _wait_ready(proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while b"ready" not in log.read_bytes():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


JOBS = 8


def test_two_worker_processes_never_run_the_same_job_twice(db_url, tmp_path):
    workers = [_start_worker(db_url, tmp_path / f"w{i}.log", f"worker-{i}") for i in range(2)]
    for proc, log in workers:
        _wait_ready(proc, log)
    engine = make_engine(db_url)
    repo = Repository(engine)
    service = PlanService(repo, ServiceSettings(database_url=db_url))
    job_ids = []
    try:
        for i in range(JOBS):
            body = small_request(model={"preset": "gpt3-125m", "name": f"job-{i}"})
            canonical = canonical_request(body, service.parse(body))
            job_ids.append(repo.scoped(f"team-{i % 2}").create_job("plan", canonical, request_hash(canonical)).id)
        deadline = time.monotonic() + 90
        while True:
            jobs = [repo.get_job(j) for j in job_ids]
            if all(j.finished for j in jobs):
                break
            assert time.monotonic() < deadline, [j.status for j in jobs]
            time.sleep(0.1)
    finally:
        for proc, _ in workers:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in workers:
            proc.wait(30)
    assert [j.status for j in jobs] == ["succeeded"] * JOBS
    assert all(j.attempts == 1 for j in jobs)
    claimed = [re.findall(r"claimed job ([0-9a-f-]{36})", log.read_text()) for _, log in workers]
    all_claims = claimed[0] + claimed[1]
    assert sorted(all_claims) == sorted(job_ids)  # each job claimed exactly once, by one worker
    assert all(claimed), "both workers took jobs"
    assert {j.worker_id for j in jobs} == {"worker-0", "worker-1"}
    assert len({j.plan_id for j in jobs}) == JOBS
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(PlanRow)).scalar() == JOBS
    for i, job in enumerate(jobs):  # each plan is stored in its job's tenant, visible to it only
        assert repo.scoped(f"team-{i % 2}").get_plan(job.plan_id).id == job.plan_id
        with pytest.raises(NotFound):
            repo.scoped(f"team-{(i + 1) % 2}").get_plan(job.plan_id)
    assert all(proc.returncode == 0 for proc, _ in workers)
    engine.dispose()


def _cli(*args: str, env: dict[str, str] | None = None):
    """Run the real ``planner`` command line in-process (no interpreter start-up)."""
    from typer.testing import CliRunner

    from planner_service.cli.main import _register_all, app

    if not app.registered_commands:
        _register_all()
    # `serve` and `worker` configure logging for the process: put it back, so later tests' records
    # do not go to this run's captured stream, nor at its level
    loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.access", "uvicorn.error")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    try:
        return CliRunner().invoke(app, list(args), env=env)
    finally:
        for lg, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate


@pytest.mark.skipif(not PG_URL, reason="PLANNER_TEST_DATABASE_URL is not set")
def test_postgres_unmigrated_schema_is_refused_until_db_upgrade():
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(PG_URL)
    name = f"{url.database}_unmigrated_{os.getpid()}"
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    fresh = url.set(database=name).render_as_string(hide_password=False)
    try:
        refused = _cli("serve", "--port", str(_free_port()), "--database-url", fresh)
        assert refused.exit_code == 1
        assert "planner db upgrade" in refused.output and "no planner schema" in refused.output
        worker = _cli("worker", "--max-jobs", "1", env={"DATABASE_URL": fresh})
        assert worker.exit_code == 1 and "planner db upgrade" in worker.output
        upgraded = _cli("db", "upgrade", "--database-url", fresh)
        assert upgraded.exit_code == 0, upgraded.output
        assert f"at revision {head_revision()}" in upgraded.output
        current = _cli("db", "current", "--database-url", fresh)
        assert current.output.count(head_revision()) == 2
        engine = make_engine(fresh)
        check_schema(engine)  # what serve and worker check on start
        engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_bad_database_url_is_a_usage_error():
    bad = _cli("db", "upgrade", "--database-url", "nosuchdb://x")
    assert bad.exit_code == 2 and "DATABASE_URL" in bad.output
    memory = _cli("worker", "--database-url", "sqlite://")
    assert memory.exit_code == 2 and "file" in memory.output
