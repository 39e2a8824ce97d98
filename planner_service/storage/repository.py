"""The repository: the only code that writes the database.

Every public method is one short transaction.  Writes go through
:func:`planner_service.storage.db.write_connection` (``BEGIN IMMEDIATE`` on SQLite), so a
transaction either commits whole or leaves nothing behind.

De-duplication of plans is enforced by the database, not by a check-then-insert: the
``(request_hash, revision)`` unique constraint makes exactly one of any number of concurrent
identical inserts succeed; the others catch ``IntegrityError`` and fetch the winner.

Jobs use the table as a queue: :meth:`Repository.claim_job` takes the oldest claimable row with
``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL (concurrent workers skip each other's rows); on
SQLite the same statement runs inside ``BEGIN IMMEDIATE``, which serialises writers.

Tenants: a :class:`Repository` is either unscoped (``tenant=None``: the job worker's claims,
metrics, the CLI) or a tenant's view (:meth:`Repository.scoped`).  A tenant's view writes rows of
its tenant and reads, changes and deletes only those; de-duplication is per tenant.  With
``read_all`` (an admin key) reads by id and lists cover every tenant; writes stay in its own.
Ids and names are matched against their format before any query (storage.ids): a string that
cannot be an id is a 404 without a query.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, text, true, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from cost_model.errors import InvalidInput
from planner_service.storage.db import write_connection
from planner_service.storage.errors import Conflict, NotFound
from planner_service.storage.ids import is_name, is_uuid
from planner_service.storage.models import (
    DEFAULT_TENANT,
    ROLES,
    ApiKeyRow,
    ClusterRow,
    JobRow,
    ModelRow,
    PlanRow,
    ProfileRow,
    utcnow,
)
from planner_service.storage.rank_table import decode_rank_tables, encode_rank_tables

PLAN_SORTS = {
    "created_at": PlanRow.created_at,
    "tokens_per_s": PlanRow.tokens_per_s,
    "step_time_s": PlanRow.step_time_s,
    "mfu": PlanRow.mfu,
    "num_devices": PlanRow.num_devices,
}
MAX_PAGE = 200
_FORCED_INSERT_RETRIES = 20
_MAX_BIGINT = 2**63 - 1
KEY_PREFIX = "plk_"


def new_id() -> str:
    return str(uuid.uuid4())


def _iso(ts: datetime | None) -> str | None:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z") if ts else None


# --------------------------------------------------------------------------------------------
# Value objects returned by the repository (frozen; no ORM objects leak out).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanColumns:
    """The queryable columns of a plan row (what lists, filters and sorts use)."""

    request_hash: str
    status: str
    objective: str
    model_name: str
    model_params: int | None
    cluster_name: str
    device_types: tuple[str, ...]
    num_devices: int
    step_time_s: float
    tokens_per_s: float
    mfu: float
    strategy: dict


@dataclass(frozen=True)
class NewPlan(PlanColumns):
    """Everything a plan row holds, computed before the insert."""

    request: dict
    result: dict
    parent_id: str | None = None


@dataclass(frozen=True)
class PlanSummary(PlanColumns):
    """A stored plan's columns and identity (no request or result bodies)."""

    id: str
    revision: int
    parent_id: str | None
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "request_hash": self.request_hash,
            "revision": self.revision,
            "parent_id": self.parent_id,
            "created_at": _iso(self.created_at),
            "objective": self.objective,
            "model": {"name": self.model_name, "params": self.model_params},
            "cluster_name": self.cluster_name,
            "device_types": list(self.device_types),
            "num_devices": self.num_devices,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "strategy": self.strategy,
        }


@dataclass(frozen=True)
class StoredPlan(PlanSummary):
    request: dict = field(default_factory=dict)
    result: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StoredJob:
    id: str
    kind: str
    status: str
    progress: float
    request: dict
    request_hash: str
    force: bool
    parent_id: str | None
    callback_url: str | None
    plan_id: str | None
    error: dict | None
    attempts: int
    worker_id: str | None
    lease_expires_at: datetime | None
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    tenant: str = DEFAULT_TENANT

    @property
    def finished(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "progress": self.progress,
            "plan_id": self.plan_id,
            "parent_id": self.parent_id,
            "error": self.error,
            "attempts": self.attempts,
            "cancel_requested": self.cancel_requested,
            "callback_url": self.callback_url,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }


@dataclass(frozen=True)
class StoredCluster:
    name: str
    body: dict
    created_at: datetime
    updated_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cluster": self.body, "created_at": _iso(self.created_at), "updated_at": _iso(self.updated_at)}


@dataclass(frozen=True)
class StoredModel:
    id: str
    name: str
    format: str
    graph: dict
    created_at: datetime

    def to_dict(self, include_graph: bool = False) -> dict[str, Any]:
        out = {"id": self.id, "name": self.name, "format": self.format, "created_at": _iso(self.created_at)}
        if include_graph:
            out["graph"] = self.graph
        return out


@dataclass(frozen=True)
class StoredProfile:
    id: str
    device: str
    body: dict
    fitted: dict | None
    created_at: datetime

    def to_dict(self, include_body: bool = False) -> dict[str, Any]:
        out = {"id": self.id, "device": self.device, "fitted": self.fitted, "created_at": _iso(self.created_at)}
        if include_body:
            out["body"] = self.body
        return out


@dataclass(frozen=True)
class PlanFilters:
    model: str | None = None
    cluster: str | None = None
    device: str | None = None
    status: str | None = None
    min_tokens_per_s: float | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    parent_id: str | None = None
    request_hash: str | None = None


_SUMMARY_COLUMNS = (
    PlanRow.id,
    PlanRow.request_hash,
    PlanRow.revision,
    PlanRow.parent_id,
    PlanRow.status,
    PlanRow.objective,
    PlanRow.model_name,
    PlanRow.model_params,
    PlanRow.cluster_name,
    PlanRow.device_types,
    PlanRow.num_devices,
    PlanRow.step_time_s,
    PlanRow.tokens_per_s,
    PlanRow.mfu,
    PlanRow.strategy,
    PlanRow.created_at,
)


def _device_types(text_value: str) -> tuple[str, ...]:
    return tuple(d for d in text_value.split(",") if d)


def _summary_kwargs(row: Any) -> dict[str, Any]:
    return dict(
        id=row.id,
        request_hash=row.request_hash,
        revision=row.revision,
        parent_id=row.parent_id,
        status=row.status,
        objective=row.objective,
        model_name=row.model_name,
        model_params=row.model_params,
        cluster_name=row.cluster_name,
        device_types=_device_types(row.device_types),
        num_devices=row.num_devices,
        step_time_s=row.step_time_s,
        tokens_per_s=row.tokens_per_s,
        mfu=row.mfu,
        strategy=row.strategy,
        created_at=row.created_at,
    )


def _job(row: JobRow) -> StoredJob:
    return StoredJob(
        id=row.id,
        kind=row.kind,
        status=row.status,
        progress=row.progress,
        request=row.request,
        request_hash=row.request_hash,
        force=row.force,
        parent_id=row.parent_id,
        callback_url=row.callback_url,
        plan_id=row.plan_id,
        error=row.error,
        attempts=row.attempts,
        worker_id=row.worker_id,
        lease_expires_at=row.lease_expires_at,
        cancel_requested=row.cancel_requested,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        tenant=row.tenant,
    )


def _encode_cursor(sort: str, value: Any, row_id: str) -> str:
    if isinstance(value, datetime):
        value = value.astimezone(UTC).isoformat()
    raw = json.dumps({"s": sort, "v": value, "i": row_id}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str, sort: str) -> tuple[Any, str]:
    bad = InvalidInput("is not a cursor returned by this endpoint (use next_cursor unchanged)", field="cursor")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(data, dict) or set(data) != {"s", "v", "i"} or not is_uuid(data["i"]):
        raise bad
    if not isinstance(data["s"], str) or data["s"] != sort:
        raise InvalidInput(f"was issued for sort={data['s']!r}, not sort={sort!r}", field="cursor")
    key = sort.lstrip("-")
    value = data["v"]
    if key == "created_at":
        try:
            value = datetime.fromisoformat(value) if isinstance(value, str) and len(value) < 40 else None
        except ValueError:
            value = None
    elif key == "num_devices":
        value = value if isinstance(value, int) and not isinstance(value, bool) else None
    else:
        value = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300 else None
    if value is None:
        raise bad
    return value, data["i"]


class Repository:
    """All reads and writes of plans, jobs, saved clusters, uploaded models and profiles."""

    def __init__(self, engine: Engine, tenant: str | None = None, read_all: bool = False) -> None:
        self.engine = engine
        self.tenant = tenant
        self.read_all = read_all

    def scoped(self, tenant: str, read_all: bool = False) -> Repository:
        """The view of ``tenant`` (``read_all``: reads across tenants, an admin's)."""
        return Repository(self.engine, tenant=tenant, read_all=read_all)

    @property
    def owner(self) -> str:
        """The tenant new rows belong to."""
        return self.tenant or DEFAULT_TENANT

    def _readable(self, column: Any) -> Any:
        """WHERE clause: the rows this view may read."""
        return true() if self.tenant is None or self.read_all else column == self.tenant

    def _own(self, column: Any) -> Any:
        """WHERE clause: the rows this view may change, delete or de-duplicate against."""
        return true() if self.tenant is None else column == self.tenant

    # ------------------------------------------------------------------ health
    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    # ------------------------------------------------------------------ plans
    def _insert_plan(self, conn: Connection, new: NewPlan, revision: int) -> str:
        plan_id = new_id()
        conn.execute(
            PlanRow.__table__.insert().values(
                id=plan_id,
                tenant=self.owner,
                request_hash=new.request_hash,
                revision=revision,
                parent_id=new.parent_id,
                status=new.status,
                objective=new.objective,
                model_name=new.model_name[:200],
                model_params=new.model_params if new.model_params is None or abs(new.model_params) <= _MAX_BIGINT else None,
                cluster_name=new.cluster_name[:200],
                device_types=_device_column(new.device_types),
                num_devices=new.num_devices,
                step_time_s=new.step_time_s,
                tokens_per_s=new.tokens_per_s,
                mfu=new.mfu,
                strategy=new.strategy,
                request=new.request,
                # a large rank table as columns (storage.rank_table): ~100 KB instead of ~15 MB of JSON
                result=encode_rank_tables(new.result),
                created_at=utcnow(),
            )
        )
        return plan_id

    def _insert_forced(self, conn: Connection, new: NewPlan) -> str:
        top = conn.execute(
            select(func.max(PlanRow.revision)).where(PlanRow.request_hash == new.request_hash, PlanRow.tenant == self.owner)
        ).scalar()
        return self._insert_plan(conn, new, 0 if top is None else top + 1)

    def insert_plan(self, new: NewPlan, force: bool = False) -> tuple[StoredPlan, bool]:
        """Store a plan.  Returns ``(plan, created)``.

        Not forced: insert revision 0; if the unique constraint fires, another request with the
        same hash won, and its plan (the newest for the hash) is returned with ``created=False``.
        Forced (``force``, replans): insert ``max(revision) + 1``, retrying when a concurrent
        forced insert took the same revision.
        """
        if not force:
            try:
                with write_connection(self.engine) as conn:
                    plan_id = self._insert_plan(conn, new, 0)
                return self._inserted(plan_id, new), True
            except IntegrityError:
                existing = self.find_plan_by_hash(new.request_hash)
                if existing is None:  # the winner was deleted in between: store ours as a new revision
                    return self.insert_plan(new, force=True)
                return existing, False
        for _ in range(_FORCED_INSERT_RETRIES):
            try:
                with write_connection(self.engine) as conn:
                    if new.parent_id is not None:
                        self._require_plan(conn, new.parent_id, "parent_id")
                    plan_id = self._insert_forced(conn, new)
                return self._inserted(plan_id, new), True
            except IntegrityError:
                continue
        raise Conflict("too many concurrent forced plans for the same request; retry", field="force")

    def _inserted(self, plan_id: str, new: NewPlan) -> StoredPlan:
        """The plan just stored as ``plan_id``: its columns read back, its request and result
        the ones written (reading a 98,304-rank plan's bodies back cost as much as writing them)."""
        columns = [c for c in PlanRow.__table__.c if c.name not in ("request", "result")]
        with self.engine.connect() as conn:
            row = conn.execute(select(*columns).where(PlanRow.id == plan_id)).first()
        if row is None:  # deleted in between
            raise NotFound(f"plan {plan_id!r} does not exist", field="id")
        return StoredPlan(**_summary_kwargs(row), request=new.request, result=new.result)

    def _require_plan(self, conn: Connection, plan_id: str, field_name: str) -> None:
        if not is_uuid(plan_id) or conn.execute(select(PlanRow.id).where(PlanRow.id == plan_id, self._own(PlanRow.tenant))).first() is None:
            raise NotFound(f"plan {plan_id!r} does not exist", field=field_name)

    def find_plan_by_hash(self, request_hash: str) -> StoredPlan | None:
        """The newest plan stored for ``request_hash`` (latest revision), or None."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(PlanRow)
                .where(PlanRow.request_hash == request_hash, PlanRow.tenant == self.owner)
                .order_by(PlanRow.created_at.desc(), PlanRow.revision.desc())
                .limit(1)
            ).first()
        return self._stored(row) if row is not None else None

    def find_newest_ref(self, request_hash: str) -> tuple[str, int] | None:
        """(id, revision) of the plan :meth:`find_plan_by_hash` returns, without loading its
        request and result (a 98,304-rank plan's JSON takes ~0.4 s to decode)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(PlanRow.id, PlanRow.revision)
                .where(PlanRow.request_hash == request_hash, PlanRow.tenant == self.owner)
                .order_by(PlanRow.created_at.desc(), PlanRow.revision.desc())
                .limit(1)
            ).first()
        return (str(row.id), int(row.revision)) if row is not None else None

    @staticmethod
    def _stored(row: Any) -> StoredPlan:
        return StoredPlan(**_summary_kwargs(row), request=row.request, result=decode_rank_tables(row.result))

    def plan_readable(self, plan_id: str) -> bool:
        """Whether the caller may read plan ``plan_id`` (it exists and is theirs or shared)."""
        if not is_uuid(plan_id):
            return False
        with self.engine.connect() as conn:
            return conn.execute(select(PlanRow.id).where(PlanRow.id == plan_id, self._readable(PlanRow.tenant))).first() is not None

    def get_plan(self, plan_id: str) -> StoredPlan:
        if not is_uuid(plan_id):
            raise NotFound(f"plan {plan_id[:80]!r} does not exist", field="id")
        with self.engine.connect() as conn:
            row = conn.execute(select(PlanRow.__table__).where(PlanRow.id == plan_id, self._readable(PlanRow.tenant))).first()
        if row is None:
            raise NotFound(f"plan {plan_id!r} does not exist", field="id")
        return self._stored(row)

    def list_plans(
        self,
        filters: PlanFilters = PlanFilters(),
        sort: str = "-created_at",
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[PlanSummary], str | None]:
        """One page of plan summaries plus the cursor of the next page (None on the last page).

        Keyset pagination on ``(sort column, id)``: stable under concurrent inserts, O(limit)
        per page whatever the offset.
        """
        key = sort.lstrip("-")
        if key not in PLAN_SORTS or sort.count("-") > 1:
            choices = ", ".join(f"{k}, -{k}" for k in PLAN_SORTS)
            raise InvalidInput(f"must be one of {choices}; got {sort!r}", field="sort")
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput(f"must be between 1 and {MAX_PAGE}, got {limit}", field="limit")
        descending = sort.startswith("-")
        col = PLAN_SORTS[key]
        q = select(*_SUMMARY_COLUMNS).where(self._readable(PlanRow.tenant))
        f = filters
        if f.model is not None:
            q = q.where(PlanRow.model_name == f.model)
        if f.cluster is not None:
            q = q.where(PlanRow.cluster_name == f.cluster)
        if f.device is not None:
            pattern = "%," + f.device.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ",%"
            q = q.where(PlanRow.device_types.like(pattern, escape="\\"))
        if f.status is not None:
            q = q.where(PlanRow.status == f.status)
        if f.min_tokens_per_s is not None:
            q = q.where(PlanRow.tokens_per_s >= f.min_tokens_per_s)
        if f.created_after is not None:
            q = q.where(PlanRow.created_at > f.created_after)
        if f.created_before is not None:
            q = q.where(PlanRow.created_at < f.created_before)
        if f.parent_id is not None:
            q = q.where(PlanRow.parent_id == f.parent_id)
        if f.request_hash is not None:
            q = q.where(PlanRow.request_hash == f.request_hash)
        if cursor:
            value, last_id = _decode_cursor(cursor, sort)
            if descending:
                q = q.where(or_(col < value, and_(col == value, PlanRow.id < last_id)))
            else:
                q = q.where(or_(col > value, and_(col == value, PlanRow.id > last_id)))
        order = (col.desc(), PlanRow.id.desc()) if descending else (col.asc(), PlanRow.id.asc())
        q = q.order_by(*order).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        items = [PlanSummary(**_summary_kwargs(r)) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = items[-1]
            next_cursor = _encode_cursor(sort, getattr(last, key), last.id)
        return items, next_cursor

    def delete_plan(self, plan_id: str) -> None:
        """Delete a plan.  A plan that replans point to cannot be deleted (409) until they are."""
        with write_connection(self.engine) as conn:
            self._require_plan(conn, plan_id, "id")
            children = conn.execute(select(func.count()).select_from(PlanRow).where(PlanRow.parent_id == plan_id)).scalar()
            if children:
                raise Conflict(
                    f"plan {plan_id!r} has {children} replan(s) that refer to it as parent_id; delete those first",
                    field="id",
                )
            conn.execute(delete(PlanRow).where(PlanRow.id == plan_id))

    def count_plans_by_status(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(PlanRow.status, func.count()).where(self._readable(PlanRow.tenant)).group_by(PlanRow.status)).all()
        return {status: n for status, n in rows}

    # ------------------------------------------------------------------ jobs
    def create_job(
        self,
        kind: str,
        request: dict,
        request_hash: str,
        force: bool = False,
        parent_id: str | None = None,
        callback_url: str | None = None,
    ) -> StoredJob:
        job_id = new_id()
        with write_connection(self.engine) as conn:
            conn.execute(
                JobRow.__table__.insert().values(
                    id=job_id,
                    tenant=self.owner,
                    kind=kind,
                    status="queued",
                    progress=0.0,
                    request=request,
                    request_hash=request_hash,
                    force=force,
                    parent_id=parent_id,
                    callback_url=callback_url,
                    attempts=0,
                    cancel_requested=False,
                    created_at=utcnow(),
                )
            )
        return self.get_job(job_id)

    def get_job(self, job_id: str) -> StoredJob:
        if not is_uuid(job_id):
            raise NotFound(f"job {job_id[:80]!r} does not exist", field="id")
        with self.engine.connect() as conn:
            row = conn.execute(select(JobRow.__table__).where(JobRow.id == job_id, self._readable(JobRow.tenant))).first()
        if row is None:
            raise NotFound(f"job {job_id!r} does not exist", field="id")
        return _job(row)

    def find_active_job(self, request_hash: str) -> StoredJob | None:
        """A queued or running, non-forced job for the same request (to avoid planning it twice)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(JobRow.__table__)
                .where(
                    JobRow.request_hash == request_hash,
                    JobRow.tenant == self.owner,
                    JobRow.status.in_(("queued", "running")),
                    JobRow.force.is_(False),
                    JobRow.kind == "plan",
                    JobRow.cancel_requested.is_(False),
                )
                .order_by(JobRow.created_at)
                .limit(1)
            ).first()
        return _job(row) if row is not None else None

    def count_active_jobs(self) -> int:
        """Queued and running jobs of this view's tenant (its job quota)."""
        with self.engine.connect() as conn:
            n = conn.execute(
                select(func.count()).select_from(JobRow.__table__).where(JobRow.tenant == self.owner, JobRow.status.in_(("queued", "running")))
            ).scalar_one()
        return int(n)

    def claim_job(self, worker_id: str, lease_s: float, max_attempts: int = 3) -> StoredJob | None:
        """Claim the oldest queued job, or a running one whose lease expired (its worker died).

        ``FOR UPDATE SKIP LOCKED`` on PostgreSQL; on SQLite the write transaction is
        ``BEGIN IMMEDIATE``, so claims are serialised.  Claiming increments ``attempts``.
        An expired job that already had ``max_attempts`` claims is failed instead; an expired job
        whose cancel was requested is cancelled.
        """
        while True:
            now = utcnow()
            with write_connection(self.engine) as conn:
                row = conn.execute(
                    select(JobRow.__table__)
                    .where(
                        or_(
                            JobRow.status == "queued",
                            and_(JobRow.status == "running", JobRow.lease_expires_at < now),
                        )
                    )
                    .order_by(JobRow.created_at, JobRow.id)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                ).first()
                if row is None:
                    return None
                expired = row.status == "running"
                if expired and row.cancel_requested:
                    conn.execute(
                        update(JobRow).where(JobRow.id == row.id).values(status="cancelled", finished_at=now, lease_expires_at=None)
                    )
                    continue
                if expired and row.attempts >= max_attempts:
                    conn.execute(
                        update(JobRow)
                        .where(JobRow.id == row.id)
                        .values(
                            status="failed",
                            finished_at=now,
                            lease_expires_at=None,
                            error={
                                "code": "worker_lost",
                                "message": f"the worker running this job stopped renewing its lease {row.attempts} times",
                                "field": None,
                            },
                        )
                    )
                    continue
                conn.execute(
                    update(JobRow)
                    .where(JobRow.id == row.id)
                    .values(
                        status="running",
                        worker_id=worker_id,
                        attempts=row.attempts + 1,
                        lease_expires_at=now + timedelta(seconds=lease_s),
                        started_at=now,
                        progress=0.0,
                    )
                )
                job_id = row.id
            return self.get_job(job_id)

    def renew_lease(self, job_id: str, worker_id: str, lease_s: float, progress: float | None = None) -> tuple[bool, bool]:
        """Extend the lease (and record progress).  Returns ``(still_owned, cancel_requested)``."""
        values: dict[str, Any] = {"lease_expires_at": utcnow() + timedelta(seconds=lease_s)}
        if progress is not None:
            values["progress"] = max(0.0, min(1.0, float(progress)))
        with write_connection(self.engine) as conn:
            res = conn.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.worker_id == worker_id, JobRow.status == "running")
                .values(**values)
            )
            owned = res.rowcount == 1
            cancel = bool(conn.execute(select(JobRow.cancel_requested).where(JobRow.id == job_id)).scalar())
        return owned, cancel

    def _finish(self, conn: Connection, job_id: str, worker_id: str, **values: Any) -> bool:
        res = conn.execute(
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.worker_id == worker_id, JobRow.status == "running")
            .values(finished_at=utcnow(), lease_expires_at=None, **values)
        )
        return res.rowcount == 1

    def complete_job_with_plan(self, job_id: str, worker_id: str, new: NewPlan, force: bool) -> StoredPlan | None:
        """Store the job's plan and mark the job succeeded in ONE transaction, only while this
        worker still owns the job.  Returns the plan (possibly an existing identical one), or
        None when the job was no longer this worker's (lease lost, cancelled)."""
        for _ in range(_FORCED_INSERT_RETRIES):
            try:
                with write_connection(self.engine) as conn:
                    owned = conn.execute(
                        select(JobRow.id).where(JobRow.id == job_id, JobRow.worker_id == worker_id, JobRow.status == "running")
                    ).first()
                    if owned is None:
                        return None
                    if new.parent_id is not None:
                        self._require_plan(conn, new.parent_id, "parent_id")
                    plan_id = self._insert_forced(conn, new) if force else self._insert_plan(conn, new, 0)
                    self._finish(conn, job_id, worker_id, status="succeeded", progress=1.0, plan_id=plan_id)
                return self._inserted(plan_id, new)
            except IntegrityError:
                if force:
                    continue
                existing = self.find_plan_by_hash(new.request_hash)
                if existing is None:
                    force = True
                    continue
                with write_connection(self.engine) as conn:
                    if not self._finish(conn, job_id, worker_id, status="succeeded", progress=1.0, plan_id=existing.id):
                        return None
                return existing
        raise Conflict("too many concurrent forced plans for the same request; retry", field="force")

    def fail_job(self, job_id: str, worker_id: str, error: dict) -> bool:
        with write_connection(self.engine) as conn:
            return self._finish(conn, job_id, worker_id, status="failed", error=error)

    def mark_job_cancelled(self, job_id: str, worker_id: str) -> bool:
        with write_connection(self.engine) as conn:
            return self._finish(conn, job_id, worker_id, status="cancelled")

    def cancel_job(self, job_id: str) -> StoredJob:
        """Cancel: a queued job is cancelled at once; a running one is flagged and its worker
        stops at its next check.  Cancelling a finished job is a 409."""
        if not is_uuid(job_id):
            raise NotFound(f"job {job_id[:80]!r} does not exist", field="id")
        with write_connection(self.engine) as conn:
            row = conn.execute(select(JobRow.status).where(JobRow.id == job_id, self._own(JobRow.tenant))).first()
            if row is None:
                raise NotFound(f"job {job_id!r} does not exist", field="id")
            if row.status == "queued":
                conn.execute(update(JobRow).where(JobRow.id == job_id).values(status="cancelled", cancel_requested=True, finished_at=utcnow()))
            elif row.status == "running":
                conn.execute(update(JobRow).where(JobRow.id == job_id).values(cancel_requested=True))
            else:
                raise Conflict(f"job {job_id!r} already {row.status}; nothing to cancel", field="id")
        return self.get_job(job_id)

    def count_jobs_by_status(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(JobRow.status, func.count()).where(self._readable(JobRow.tenant)).group_by(JobRow.status)).all()
        return {status: n for status, n in rows}

    # ------------------------------------------------------------------ saved clusters
    def save_cluster(self, name: str, body: dict, replace: bool = False) -> StoredCluster:
        """Save a cluster under ``name``.  An existing name is a 409 unless ``replace``."""
        now = utcnow()
        try:
            with write_connection(self.engine) as conn:
                if replace:
                    res = conn.execute(
                        update(ClusterRow).where(ClusterRow.name == name, ClusterRow.tenant == self.owner).values(body=body, updated_at=now)
                    )
                    if res.rowcount == 1:
                        return self.get_cluster(name, conn)
                conn.execute(ClusterRow.__table__.insert().values(tenant=self.owner, name=name, body=body, created_at=now, updated_at=now))
        except IntegrityError:
            raise Conflict(f"a cluster named {name!r} already exists", field="name") from None
        return self.get_cluster(name)

    def get_cluster(self, name: str, conn: Connection | None = None) -> StoredCluster:
        if not is_name(name):
            raise NotFound(f"no saved cluster named {name[:100]!r}", field="name")
        # Names are per tenant: a name always means this view's own cluster (an admin too).
        q = select(ClusterRow.__table__).where(ClusterRow.name == name, ClusterRow.tenant == self.owner)
        if conn is not None:
            row = conn.execute(q).first()
        else:
            with self.engine.connect() as c:
                row = c.execute(q).first()
        if row is None:
            raise NotFound(f"no saved cluster named {name!r}", field="name")
        return StoredCluster(name=row.name, body=row.body, created_at=row.created_at, updated_at=row.updated_at)

    def list_clusters(self) -> list[StoredCluster]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(ClusterRow.__table__).where(self._readable(ClusterRow.tenant)).order_by(ClusterRow.name, ClusterRow.tenant)).all()
        return [StoredCluster(name=r.name, body=r.body, created_at=r.created_at, updated_at=r.updated_at) for r in rows]

    def delete_cluster(self, name: str) -> None:
        if not is_name(name):
            raise NotFound(f"no saved cluster named {name[:100]!r}", field="name")
        with write_connection(self.engine) as conn:
            if conn.execute(delete(ClusterRow).where(ClusterRow.name == name, ClusterRow.tenant == self.owner)).rowcount == 0:
                raise NotFound(f"no saved cluster named {name!r}", field="name")

    # ------------------------------------------------------------------ uploaded models
    def save_model(self, name: str, format: str, graph: dict) -> str:
        if format not in ("onnx", "graph"):
            raise InvalidInput(f"must be 'onnx' or 'graph', got {format!r}", field="format")
        model_id = new_id()
        with write_connection(self.engine) as conn:
            conn.execute(
                ModelRow.__table__.insert().values(id=model_id, tenant=self.owner, name=name[:200], format=format, graph=graph, created_at=utcnow())
            )
        return model_id

    def get_model(self, model_id: str) -> StoredModel:
        if not is_uuid(model_id):
            raise NotFound(f"model {model_id[:80]!r} does not exist", field="model_id")
        with self.engine.connect() as conn:
            row = conn.execute(select(ModelRow.__table__).where(ModelRow.id == model_id, self._readable(ModelRow.tenant))).first()
        if row is None:
            raise NotFound(f"model {model_id!r} does not exist", field="model_id")
        return StoredModel(id=row.id, name=row.name, format=row.format, graph=row.graph, created_at=row.created_at)

    def list_models(self) -> list[StoredModel]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(ModelRow.id, ModelRow.name, ModelRow.format, ModelRow.created_at)
                .where(self._readable(ModelRow.tenant))
                .order_by(ModelRow.created_at.desc())
            ).all()
        return [StoredModel(id=r.id, name=r.name, format=r.format, graph={}, created_at=r.created_at) for r in rows]

    # ------------------------------------------------------------------ operator profiles
    def save_profile(self, device: str, body: dict, fitted: dict | None = None) -> str:
        profile_id = new_id()
        with write_connection(self.engine) as conn:
            conn.execute(
                ProfileRow.__table__.insert().values(
                    id=profile_id, tenant=self.owner, device=device[:200], body=body, fitted=fitted, created_at=utcnow()
                )
            )
        return profile_id

    def get_profile(self, profile_id: str) -> StoredProfile:
        if not is_uuid(profile_id):
            raise NotFound(f"profile {profile_id[:80]!r} does not exist", field="profile_id")
        with self.engine.connect() as conn:
            row = conn.execute(select(ProfileRow.__table__).where(ProfileRow.id == profile_id, self._readable(ProfileRow.tenant))).first()
        if row is None:
            raise NotFound(f"profile {profile_id!r} does not exist", field="profile_id")
        return StoredProfile(id=row.id, device=row.device, body=row.body, fitted=row.fitted, created_at=row.created_at)

    def list_profiles(self, device: str | None = None) -> list[StoredProfile]:
        q = select(ProfileRow.__table__).where(self._readable(ProfileRow.tenant)).order_by(ProfileRow.created_at.desc())
        if device is not None:
            q = q.where(ProfileRow.device == device)
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        return [StoredProfile(id=r.id, device=r.device, body=r.body, fitted=r.fitted, created_at=r.created_at) for r in rows]

    # ------------------------------------------------------------------ API keys
    def create_api_key(self, tenant: str, role: str, name: str | None = None) -> tuple[str, StoredApiKey]:
        """A new key for ``tenant``: returns ``(key, record)``.  The key is shown once; only
        the HMAC-SHA256 of its secret under a random salt is stored."""
        if role not in ROLES:
            raise InvalidInput(f"must be one of {', '.join(ROLES)}, got {role!r}", field="role")
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        now = utcnow()
        with write_connection(self.engine) as conn:
            conn.execute(
                ApiKeyRow.__table__.insert().values(
                    id=key_id, tenant=tenant, role=role, salt=salt, key_hash=_key_hash(salt, secret), name=name, created_at=now
                )
            )
        return f"{KEY_PREFIX}{key_id}_{secret}", StoredApiKey(id=key_id, tenant=tenant, role=role, name=name, created_at=now, revoked_at=None)

    def verify_api_key(self, key: str) -> StoredApiKey | None:
        """The live key record for a presented key, or None (unknown, revoked, malformed).
        The comparison of the HMACs is constant-time."""
        if not key.startswith(KEY_PREFIX) or len(key) > 200:
            return None
        key_id, sep, secret = key[len(KEY_PREFIX):].partition("_")
        if not sep or len(key_id) != 16 or not all(c in "0123456789abcdef" for c in key_id):
            return None
        with self.engine.connect() as conn:
            row = conn.execute(select(ApiKeyRow.__table__).where(ApiKeyRow.id == key_id)).first()
        if row is None or row.revoked_at is not None:
            return None
        if not hmac.compare_digest(row.key_hash, _key_hash(row.salt, secret)):
            return None
        return StoredApiKey(id=row.id, tenant=row.tenant, role=row.role, name=row.name, created_at=row.created_at, revoked_at=row.revoked_at)

    def list_api_keys(self) -> list[StoredApiKey]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(ApiKeyRow.__table__).order_by(ApiKeyRow.tenant, ApiKeyRow.created_at)).all()
        return [StoredApiKey(id=r.id, tenant=r.tenant, role=r.role, name=r.name, created_at=r.created_at, revoked_at=r.revoked_at) for r in rows]

    def revoke_api_key(self, key_id: str) -> None:
        with write_connection(self.engine) as conn:
            res = conn.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None)).values(revoked_at=utcnow()))
        if res.rowcount != 1:
            raise NotFound(f"no live API key {key_id[:40]!r}", field="id")


def _key_hash(salt: str, secret: str) -> str:
    return hmac.new(salt.encode(), secret.encode("utf-8", "replace"), hashlib.sha256).hexdigest()


def _device_column(device_types: tuple[str, ...]) -> str:
    """",A,B," for LIKE '%,X,%' filters, cut at a whole name to fit the column."""
    out = ","
    for d in device_types:
        if len(out) + len(d) + 1 > 1000:
            break
        out += d + ","
    return out


@dataclass(frozen=True)
class StoredApiKey:
    id: str
    tenant: str
    role: str
    name: str | None
    created_at: datetime
    revoked_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "role": self.role, "name": self.name, "created_at": _iso(self.created_at), "revoked_at": _iso(self.revoked_at)}


__all__ = [
    "KEY_PREFIX",
    "StoredApiKey",
    "MAX_PAGE",
    "NewPlan",
    "PLAN_SORTS",
    "PlanFilters",
    "PlanSummary",
    "Repository",
    "StoredCluster",
    "StoredJob",
    "StoredModel",
    "StoredPlan",
    "StoredProfile",
]
