"""Service settings (pydantic-settings).

Read from the environment (and passed explicitly in tests): ``DATABASE_URL`` plus
``PLANNER_*`` variables.  Nothing here is global: :func:`planner_service.api.create_app`,
``planner worker`` and ``planner db upgrade`` each build one :class:`ServiceSettings` and pass it
down.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_database_url() -> str:
    """The per-user default: ``$XDG_DATA_HOME/planner/planner.db`` (``~/.local/share/planner/
    planner.db`` when unset), the XDG base directory specification's data directory, so every
    command finds the same database whatever the working directory."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return "sqlite:///" + str(Path(data_home).expanduser().resolve() / "planner" / "planner.db")


class ServiceSettings(BaseSettings):
    """Every knob of the HTTP service, the job worker and storage.

    Environment names: ``DATABASE_URL`` (or ``PLANNER_DATABASE_URL``) and ``PLANNER_<FIELD>`` for
    the rest, e.g. ``PLANNER_SOLVER_TIME_LIMIT_S=5``.
    """

    model_config = SettingsConfigDict(env_prefix="PLANNER_", populate_by_name=True, extra="ignore")

    database_url: str = Field(
        default_factory=default_database_url,
        validation_alias=AliasChoices("DATABASE_URL", "PLANNER_DATABASE_URL", "database_url"),
        description="SQLAlchemy URL: sqlite:///path.db or postgresql+psycopg://user@host:5432/db "
        "(default: planner/planner.db in the XDG data directory, ~/.local/share unless XDG_DATA_HOME is set)",
    )
    #: Search budget per plan in deterministic seconds, i.e. solver work rather than the clock (passed
    #: to the planner as SolverSettings.time_limit_s); a larger one may replace a stored plan not proved optimal.
    solver_time_limit_s: float = Field(default=2.0, gt=0, le=3600)
    #: CP-SAT worker threads per plan.
    solver_num_workers: int = Field(default=2, ge=1, le=64)
    #: A POST /v1/plans whose search has more candidate strategies than this runs as a job (202).
    sync_max_candidates: int = Field(default=100_000, ge=1)
    #: An operator graph with more operators than this is planned as a job (202), whatever its
    #: candidate count: building and solving its CP-SAT model takes seconds.
    sync_max_graph_ops: int = Field(default=1000, ge=1)
    #: After the first app of the process starts: collect once and freeze what is alive (imports,
    #: catalogs, pools) out of the garbage collector's full scans (gc.freeze).  A replan of a
    #: 98,304-rank plan allocates enough to run two or three full collections, each of which
    #: otherwise rescans every object the process ever imported.  Search processes freeze theirs
    #: after their imports too (``service.executor.tune_gc``).
    gc_freeze: bool = True
    #: Net container allocations between young-generation garbage collections in the server and
    #: search processes (``gc.set_threshold``'s first value; 0 leaves Python's 700).  After the
    #: freeze nothing holds full collections back: at 700 a 98,304-rank replan ran three or four
    #: full scans of its own ~10^5 live objects (~0.13 s); at 20,000 ~0.03 s.
    gc_young_threshold: int = Field(default=20_000, ge=0, le=10_000_000)
    #: Searches run in this many worker processes (or threads), apart from request handling.
    search_workers: int = Field(default=2, ge=1, le=64)
    #: ``process``: searches in a pool of processes (request threads and the GIL stay free);
    #: ``thread``: a thread pool in the server process.  An injected planner (tests) always uses threads.
    search_executor: Literal["process", "thread"] = "process"
    #: Synchronous searches admitted at once per server process; more get 503 with Retry-After.
    search_max_inflight: int = Field(default=8, ge=1, le=1000)
    #: Synchronous searches one tenant may run at once per server process; more get 429 with Retry-After.
    tenant_max_concurrent_searches: int = Field(default=4, ge=1, le=1000)
    #: Queued plus running jobs one tenant may have; a further job gets 429 with Retry-After.
    tenant_max_active_jobs: int = Field(default=50, ge=1)
    #: ONNX uploads received at once per server process; more get 503 with Retry-After before
    #: their body is read.
    max_concurrent_uploads: int = Field(default=4, ge=1, le=256)
    #: ``json``: one JSON object per log line (with the request id); ``text``: plain lines.
    log_format: Literal["json", "text"] = "json"
    #: Largest accepted request body; larger bodies get 413.
    max_body_bytes: int = Field(default=2_000_000, ge=1024)
    #: Largest accepted file upload (POST /v1/models/onnx); larger uploads get 413.
    max_upload_bytes: int = Field(default=256_000_000, ge=1024)
    #: A running job whose worker has not renewed its lease for this long is re-queued.
    job_lease_timeout_s: float = Field(default=30.0, gt=0)
    #: A job claimed this many times without finishing is failed instead of re-queued.
    job_max_attempts: int = Field(default=3, ge=1)
    #: How often an idle worker looks for queued jobs.
    worker_poll_interval_s: float = Field(default=0.5, gt=0)
    #: Run the job worker loop inside the API process.  ``None`` means: yes on SQLite, no on
    #: PostgreSQL (where ``planner worker`` processes run the jobs).
    inline_worker: bool | None = None
    #: Timeout (connect and read) of the POST to a job's callback_url.
    callback_timeout_s: float = Field(default=2.0, gt=0, le=30)
    #: Hosts a callback_url may name, comma-separated (exact names).  Empty: callbacks are off
    #: and a request with callback_url is a 422.
    callback_allowed_hosts: str = ""
    #: Allow callbacks to loopback, private, link-local and other non-public addresses
    #: (a receiver on the same private network).  Metadata addresses stay refused.
    callback_allow_private: bool = False
    #: Key of the ``X-Planner-Signature`` HMAC-SHA256 header on callbacks (empty: unsigned).
    callback_secret: str = ""
    #: ``enabled``: every /v1 route needs ``Authorization: Bearer <key>`` (``planner keys
    #: create``).  ``disabled``: no keys, everything in the ``default`` tenant with the admin role;
    #: ``planner serve`` refuses it on a non-loopback address.
    auth: Literal["enabled", "disabled"] = "enabled"
    #: Host header values this server answers for, comma-separated (``*``: any).  Guards a local
    #: instance against DNS rebinding; add the service's DNS name when deploying.
    allowed_hosts: str = "localhost,127.0.0.1,::1"
    #: Per-tenant request rate limit ("limits" notation, e.g. ``600/minute``; empty: none).
    rate_limit: str = "1200/minute"
    #: Upgrade the schema on start.  ``None`` means: yes on SQLite, no on PostgreSQL (there the
    #: server refuses to start on an old schema; run ``planner db upgrade``).
    auto_migrate: bool | None = None
    #: Database connection pool size (PostgreSQL).
    db_pool_size: int = Field(default=10, ge=1)
    db_max_overflow: int = Field(default=20, ge=0)

    @property
    def auth_enabled(self) -> bool:
        return self.auth == "enabled"

    @property
    def allowed_host_list(self) -> tuple[str, ...]:
        return tuple(h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip())

    @property
    def callback_host_list(self) -> tuple[str, ...]:
        return tuple(h.strip().lower().rstrip(".").strip("[]") for h in self.callback_allowed_hosts.split(",") if h.strip())

    def check_bind(self, host: str) -> None:
        """Refuse to serve with auth disabled on anything but a loopback address."""
        if self.auth_enabled:
            return
        if not is_loopback(host):
            raise ValueError(
                f"PLANNER_AUTH=disabled is only allowed on a loopback address (127.0.0.1, ::1, localhost), not {host!r}; "
                "create keys with `planner keys create` instead"
            )

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def run_inline_worker(self) -> bool:
        return self.is_sqlite if self.inline_worker is None else self.inline_worker

    @property
    def migrate_on_start(self) -> bool:
        return self.is_sqlite if self.auto_migrate is None else self.auto_migrate


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


__all__ = ["ServiceSettings", "is_loopback"]
