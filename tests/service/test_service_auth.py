"""A real ``planner serve`` with auth on (SQLite and PostgreSQL): no key is 401, and identical
concurrent POSTs from two tenants give exactly one plan row per tenant (de-duplication per
tenant holds under concurrency)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import select

from helpers.requests import small_request
from planner_service.storage.db import make_engine
from planner_service.storage.models import PlanRow
from planner_service.storage.repository import Repository


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_concurrent_identical_posts_one_row_per_tenant_with_auth_on(db_url, tmp_path):
    engine = make_engine(db_url)
    repo = Repository(engine)
    key_a, _ = repo.create_api_key("team-a", "member")
    key_b, _ = repo.create_api_key("team-b", "member")
    port = _port()
    env = {**os.environ, "DATABASE_URL": db_url, "PLANNER_AUTH": "enabled", "PLANNER_RATE_LIMIT": "", "PLANNER_SOLVER_TIME_LIMIT_S": "1.0"}
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner_service.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-2000:]
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert httpx.get(base + "/v1/plans", timeout=10).status_code == 401
        body = small_request()

        def post(key: str) -> int:
            return httpx.post(base + "/v1/plans", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60).status_code

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(post, [key_a, key_b] * 6))
        assert sorted(set(codes)) == [200, 201] and codes.count(201) == 2, codes
        with engine.connect() as conn:
            rows = conn.execute(select(PlanRow.tenant, PlanRow.request_hash)).all()
        assert sorted(r.tenant for r in rows) == ["team-a", "team-b"]
        assert len({r.request_hash for r in rows}) == 1
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
        engine.dispose()
