"""Database and client fixtures shared by every test (service, API, CLI, web).

Every database test runs on SQLite and, when ``PLANNER_TEST_DATABASE_URL`` is set (``.ci/run``
sets it to a fresh database on the local PostgreSQL), on PostgreSQL too.  SQLite tests copy a
migrated template file; PostgreSQL tests migrate once per session and empty the tables before
each test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text

from helpers.requests import PG_URL, TABLES

# Every app a test builds (and every server it starts) runs with auth off, the TestClient's Host
# allowed and no rate limit, unless the test says otherwise: tests/api/test_tenants.py,
# tests/api/test_schemathesis.py, tests/service/test_service_auth.py and
# tests/service/test_processes.py run with keys.
os.environ.setdefault("PLANNER_AUTH", "disabled")
os.environ.setdefault("PLANNER_ALLOWED_HOSTS", "testserver,localhost,127.0.0.1,::1")
os.environ.setdefault("PLANNER_RATE_LIMIT", "")
# Searches of in-process test apps run in the executor's thread pool (a process pool would start
# a fresh interpreter per app); the real servers of tests/service/test_processes.py and
# tests/api/test_limits.py use the default process pool.
os.environ.setdefault("PLANNER_SEARCH_EXECUTOR", "thread")
from planner_service.settings import ServiceSettings
from planner_service.storage.db import make_engine, upgrade
from planner_service.storage.repository import Repository


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("template") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    return str(path)


@pytest.fixture(scope="session")
def pg_migrated() -> str | None:
    if not PG_URL:
        return None
    engine = make_engine(PG_URL)
    upgrade(engine)
    engine.dispose()
    return PG_URL


def _empty_pg(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(TABLES)}"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path, sqlite_template, pg_migrated) -> str:
    """A migrated, empty database of each kind."""
    if request.param == "sqlite":
        target = tmp_path / "planner.db"
        shutil.copyfile(sqlite_template, target)
        return f"sqlite:///{target}"
    if not pg_migrated:
        pytest.skip("PLANNER_TEST_DATABASE_URL is not set")
    _empty_pg(pg_migrated)
    return pg_migrated


@pytest.fixture
def repo(db_url) -> Iterator[Repository]:
    engine = make_engine(db_url)
    yield Repository(engine)
    engine.dispose()


@pytest.fixture
def settings_for(db_url) -> Callable[..., ServiceSettings]:
    def make(**kw: Any) -> ServiceSettings:
        base = {"database_url": db_url, "auto_migrate": False, "worker_poll_interval_s": 0.05, "job_lease_timeout_s": 5.0}
        base.update(kw)
        return ServiceSettings(**base)

    return make


@pytest.fixture
def make_client(settings_for) -> Iterator[Callable[..., Any]]:
    """Factory: ``make_client(plan_fn=..., start_worker=..., **settings)`` → a started TestClient."""
    from fastapi.testclient import TestClient

    from planner_service.api import create_app

    opened: list[Any] = []

    def make(plan_fn=None, start_worker: bool | None = True, search_size_fn=None, **kw: Any):
        app = create_app(settings_for(**kw), plan_fn=plan_fn, start_worker=start_worker, search_size_fn=search_size_fn)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in reversed(opened):
        client.__exit__(None, None, None)


@pytest.fixture(scope="session")
def cli():
    """The ``planner`` Typer app with every command registered (as ``planner`` runs it)."""
    from planner_service.cli.main import _register_all, app

    if not any(getattr(c, "name", None) == "launch" for c in app.registered_commands):
        _register_all()
    return app


@pytest.fixture
def client(make_client):
    return make_client()
