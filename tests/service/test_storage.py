"""Repository, migrations and the job queue, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select, text

from cost_model.errors import InvalidInput
from planner_service.storage.db import (
    SchemaNotReady,
    check_schema,
    head_revision,
    make_engine,
    upgrade,
)
from planner_service.storage.errors import Conflict, NotFound
from planner_service.storage.models import Base, JobRow, PlanRow
from planner_service.storage.repository import NewPlan, PlanFilters


def new_plan(h: str = "h1", tokens: float = 1000.0, model: str = "gpt3-125m", cluster: str = "c1",
             devices: tuple = ("A100-SXM4-80GB",), parent_id: str | None = None, status: str = "optimal") -> NewPlan:
    return NewPlan(
        request_hash=h,
        status=status,
        objective="throughput",
        model_name=model,
        model_params=125_000_000,
        cluster_name=cluster,
        device_types=devices,
        num_devices=8,
        step_time_s=131072 / tokens,
        tokens_per_s=tokens,
        mfu=0.4,
        strategy={"dp": 8},
        request={"model": {"preset": model}, "hash": h},
        result={"best": {"strategy": {"dp": 8}, "prediction": {"tokens_per_s": tokens}, "ranks": []}},
        parent_id=parent_id,
    )


def count_plans(repo) -> int:
    with repo.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(PlanRow)).scalar()


def test_migrations_match_the_orm_models(repo):
    with repo.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []
    check_schema(repo.engine)


def test_unmigrated_database_is_refused_with_a_clear_message(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(SchemaNotReady, match="planner db upgrade"):
        check_schema(engine)
    assert upgrade(engine) == head_revision()
    check_schema(engine)
    assert upgrade(engine) == head_revision()  # idempotent


def test_insert_or_fetch_returns_the_existing_plan(repo):
    first, created = repo.insert_plan(new_plan())
    assert created and first.revision == 0
    again, created2 = repo.insert_plan(new_plan())
    assert not created2 and again.id == first.id
    assert repo.find_plan_by_hash("h1").id == first.id
    assert count_plans(repo) == 1


def test_concurrent_identical_inserts_store_one_row(repo):
    """The unique constraint, not a check-then-insert, de-duplicates racing writers."""
    results, errors = [], []
    barrier = threading.Barrier(12)

    def insert() -> None:
        barrier.wait()
        try:
            results.append(repo.insert_plan(new_plan("race")))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=insert) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(created for _, created in results) == 1
    assert len({p.id for p, _ in results}) == 1
    assert count_plans(repo) == 1


def test_forced_plans_get_new_revisions_and_become_the_answer(repo):
    p0, _ = repo.insert_plan(new_plan())
    p1, created = repo.insert_plan(new_plan(tokens=2000.0), force=True)
    p2, _ = repo.insert_plan(new_plan(tokens=3000.0), force=True)
    assert created and (p0.revision, p1.revision, p2.revision) == (0, 1, 2)
    assert repo.find_plan_by_hash("h1").id == p2.id
    again, created = repo.insert_plan(new_plan())
    assert not created and again.id == p2.id


def test_concurrent_forced_inserts_all_succeed_with_distinct_revisions(repo):
    out = []
    barrier = threading.Barrier(6)

    def insert() -> None:
        barrier.wait()
        out.append(repo.insert_plan(new_plan("f"), force=True)[0])

    threads = [threading.Thread(target=insert) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.revision for p in out) == list(range(6))


def test_get_and_delete(repo):
    p, _ = repo.insert_plan(new_plan())
    child, _ = repo.insert_plan(new_plan("h2", parent_id=p.id), force=True)
    assert repo.get_plan(child.id).parent_id == p.id
    with pytest.raises(Conflict) as exc:
        repo.delete_plan(p.id)
    assert exc.value.field == "id"
    repo.delete_plan(child.id)
    repo.delete_plan(p.id)
    with pytest.raises(NotFound):
        repo.get_plan(p.id)
    with pytest.raises(NotFound):
        repo.delete_plan(p.id)


def test_replan_of_a_missing_parent_is_not_found(repo):
    with pytest.raises(NotFound) as exc:
        repo.insert_plan(new_plan("x", parent_id="missing"), force=True)
    assert exc.value.field == "parent_id"


def test_list_filters(repo):
    repo.insert_plan(new_plan("a", tokens=100.0, model="m1", cluster="c1", devices=("A100-SXM4-80GB",)))
    repo.insert_plan(new_plan("b", tokens=200.0, model="m2", cluster="c1", devices=("A100-SXM4-80GB", "H100-SXM5-80GB")))
    repo.insert_plan(new_plan("c", tokens=300.0, model="m2", cluster="c2", devices=("H100-SXM5-80GB",), status="feasible"))

    def names(**kw):
        items, _ = repo.list_plans(PlanFilters(**kw), sort="tokens_per_s")
        return [p.request_hash for p in items]

    assert names() == ["a", "b", "c"]
    assert names(model="m2") == ["b", "c"]
    assert names(cluster="c1") == ["a", "b"]
    assert names(device="H100-SXM5-80GB") == ["b", "c"]
    assert names(device="A100") == []  # exact device names only (the route resolves aliases)
    assert names(device="%") == []  # LIKE wildcards are escaped
    assert names(status="feasible") == ["c"]
    assert names(min_tokens_per_s=150.0) == ["b", "c"]
    future = datetime.now(UTC) + timedelta(hours=1)
    assert names(created_before=future) == ["a", "b", "c"]
    assert names(created_after=future) == []


def test_cursor_pagination_visits_every_plan_once_in_order(repo):
    for i in range(23):
        repo.insert_plan(new_plan(f"p{i:02d}", tokens=float(1 + i % 5)))  # ties in the sort column
    for sort in ("-created_at", "created_at", "tokens_per_s", "-tokens_per_s", "mfu", "-num_devices"):
        seen, cursor = [], None
        while True:
            items, cursor = repo.list_plans(sort=sort, limit=4, cursor=cursor)
            seen.extend(items)
            if cursor is None:
                break
        assert len(seen) == 23 and len({p.id for p in seen}) == 23, sort
        key = sort.lstrip("-")
        values = [(getattr(p, key), p.id) for p in seen]
        assert values == sorted(values, reverse=sort.startswith("-")), sort


@pytest.mark.parametrize("cursor", ["garbage", "eyJ4IjoxfQ", "", "e30", "eyJzIjoiLWNyZWF0ZWRfYXQiLCJ2Ijoibm90LWEtZGF0ZSIsImkiOiJ4In0"])
def test_bad_cursor_names_the_cursor(repo, cursor):
    repo.insert_plan(new_plan())
    if cursor == "":
        repo.list_plans(cursor=cursor)  # empty means the first page
        return
    with pytest.raises(InvalidInput) as exc:
        repo.list_plans(cursor=cursor)
    assert exc.value.field == "cursor"


def test_cursor_of_another_sort_is_refused(repo):
    for i in range(3):
        repo.insert_plan(new_plan(f"s{i}"))
    _, cursor = repo.list_plans(sort="tokens_per_s", limit=1)
    with pytest.raises(InvalidInput, match="sort") as exc:
        repo.list_plans(sort="-created_at", cursor=cursor)
    assert exc.value.field == "cursor"


# ------------------------------------------------------------------------------------- jobs


def test_jobs_are_claimed_once_in_order(repo):
    a = repo.create_job("plan", {"n": 1}, "ha")
    b = repo.create_job("plan", {"n": 2}, "hb")
    first = repo.claim_job("w1", 30)
    second = repo.claim_job("w2", 30)
    assert (first.id, second.id) == (a.id, b.id)
    assert first.status == "running" and first.attempts == 1 and first.worker_id == "w1"
    assert repo.claim_job("w3", 30) is None


def test_concurrent_claims_never_share_a_job(repo):
    jobs = {repo.create_job("plan", {"n": i}, f"h{i}").id for i in range(20)}
    claimed: list[tuple[str, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def claimer(name: str) -> None:
        barrier.wait()
        while True:
            job = repo.claim_job(name, 30)
            if job is None:
                return
            with lock:
                claimed.append((job.id, name))

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [j for j, _ in claimed]
    assert sorted(ids) == sorted(jobs) and len(set(ids)) == len(ids)
    assert all(repo.get_job(j).attempts == 1 for j in jobs)


def _expire_lease(repo, job_id: str) -> None:
    with repo.engine.begin() as conn:
        conn.execute(
            JobRow.__table__.update().where(JobRow.id == job_id).values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )


def test_expired_lease_is_requeued_and_the_old_worker_cannot_complete(repo):
    job = repo.create_job("plan", {"n": 1}, "h1")
    repo.claim_job("dead", 30)
    assert repo.claim_job("w2", 30) is None  # lease still valid
    _expire_lease(repo, job.id)
    again = repo.claim_job("w2", 30)
    assert again.id == job.id and again.attempts == 2 and again.worker_id == "w2"
    owned, _ = repo.renew_lease(job.id, "dead", 30)
    assert not owned
    assert repo.complete_job_with_plan(job.id, "dead", new_plan("h1"), force=False) is None
    assert count_plans(repo) == 0
    plan = repo.complete_job_with_plan(job.id, "w2", new_plan("h1"), force=False)
    done = repo.get_job(job.id)
    assert done.status == "succeeded" and done.plan_id == plan.id and done.progress == 1.0


def test_job_failed_after_max_attempts(repo):
    job = repo.create_job("plan", {"n": 1}, "h1")
    for i in range(2):
        repo.claim_job(f"w{i}", 30, max_attempts=2)
        _expire_lease(repo, job.id)
    assert repo.claim_job("w9", 30, max_attempts=2) is None
    failed = repo.get_job(job.id)
    assert failed.status == "failed" and failed.error["code"] == "worker_lost"


def test_job_completion_reuses_an_identical_plan(repo):
    existing, _ = repo.insert_plan(new_plan("same"))
    job = repo.create_job("plan", {"n": 1}, "same")
    repo.claim_job("w", 30)
    plan = repo.complete_job_with_plan(job.id, "w", new_plan("same"), force=False)
    assert plan.id == existing.id and repo.get_job(job.id).plan_id == existing.id
    assert count_plans(repo) == 1


def test_cancel(repo):
    queued = repo.create_job("plan", {}, "q")
    assert repo.cancel_job(queued.id).status == "cancelled"
    running = repo.create_job("plan", {}, "r")
    repo.claim_job("w", 30)
    flagged = repo.cancel_job(running.id)
    assert flagged.status == "running" and flagged.cancel_requested
    assert repo.renew_lease(running.id, "w", 30, 0.5) == (True, True)
    assert repo.mark_job_cancelled(running.id, "w")
    with pytest.raises(Conflict):
        repo.cancel_job(running.id)
    with pytest.raises(NotFound):
        repo.cancel_job("nope")


def test_progress_is_clamped_and_recorded(repo):
    job = repo.create_job("plan", {}, "p")
    repo.claim_job("w", 30)
    repo.renew_lease(job.id, "w", 30, 7.0)
    assert repo.get_job(job.id).progress == 1.0
    repo.renew_lease(job.id, "w", 30, 0.25)
    assert repo.get_job(job.id).progress == 0.25


# ------------------------------------------------------------------------- clusters etc.


def test_saved_clusters(repo):
    body = {"name": "x", "node_groups": [{"name": "g", "count": 1, "device": "A100"}]}
    saved = repo.save_cluster("lab", body)
    assert saved.body == body and repo.get_cluster("lab").body == body
    with pytest.raises(Conflict) as exc:
        repo.save_cluster("lab", body)
    assert exc.value.field == "name"
    changed = {**body, "name": "y"}
    assert repo.save_cluster("lab", changed, replace=True).body == changed
    repo.save_cluster("other", body)
    assert [c.name for c in repo.list_clusters()] == ["lab", "other"]
    repo.delete_cluster("lab")
    with pytest.raises(NotFound):
        repo.get_cluster("lab")
    with pytest.raises(NotFound):
        repo.delete_cluster("lab")


def test_models_and_profiles(repo):
    graph = {"nodes": [{"op": "matmul"}]}
    mid = repo.save_model("tiny", "onnx", graph)
    m = repo.get_model(mid)
    assert (m.name, m.format, m.graph) == ("tiny", "onnx", graph)
    assert [x.id for x in repo.list_models()] == [mid]
    with pytest.raises(InvalidInput):
        repo.save_model("bad", "pickle", graph)
    with pytest.raises(NotFound) as exc:
        repo.get_model("nope")
    assert exc.value.field == "model_id"
    p1 = repo.save_profile("A100-SXM4-80GB", {"measurements": []}, {"gemm_max_fraction": 0.8})
    repo.save_profile("local-cpu", {"measurements": []})
    assert repo.get_profile(p1).fitted == {"gemm_max_fraction": 0.8}
    assert [p.id for p in repo.list_profiles(device="A100-SXM4-80GB")] == [p1]
    assert len(repo.list_profiles()) == 2


def test_timestamps_are_utc(repo):
    before = datetime.now(UTC)
    p, _ = repo.insert_plan(new_plan())
    assert p.created_at.tzinfo is not None
    assert before - timedelta(seconds=5) <= p.created_at <= datetime.now(UTC) + timedelta(seconds=5)


def test_ping(repo):
    repo.ping()
    with repo.engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
