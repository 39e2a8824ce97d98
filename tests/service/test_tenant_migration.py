"""Migration 0002: rows written before tenants existed belong to the ``default`` tenant, and the
de-duplication and cluster-name constraints become per tenant."""

from __future__ import annotations

from sqlalchemy import text

from planner_service.storage.db import make_engine, upgrade
from planner_service.storage.repository import Repository


def test_existing_rows_get_the_default_tenant(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO clusters (name, body, created_at, updated_at) VALUES ('c1', '{}', '2026-01-01', '2026-01-01')"))
    assert upgrade(engine, "0002") == "0002"
    repo = Repository(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT tenant FROM clusters")).scalar() == "default"
    assert repo.scoped("default").get_cluster("c1").body == {}
    # the same name in another tenant is a separate row
    repo.scoped("team-b").save_cluster("c1", {"x": 1})
    assert repo.scoped("default").get_cluster("c1").body == {}
    engine.dispose()
