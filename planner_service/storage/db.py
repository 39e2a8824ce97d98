"""Engines and schema migrations.

``make_engine`` gives an engine configured for concurrent use:

* SQLite: WAL journal (readers never block the writer), ``busy_timeout`` so writers queue instead
  of failing, foreign keys on, and explicit ``BEGIN`` / ``BEGIN IMMEDIATE`` (pysqlite's own
  implicit transactions are disabled, as the SQLAlchemy docs recommend) so a write transaction
  takes the write lock up front and never dead-locks on a lock upgrade.  ``synchronous=NORMAL``
  in WAL mode loses nothing when the *process* is killed (committed pages are in the OS).
* PostgreSQL (psycopg 3): a connection pool with pre-ping.

Migrations live in ``storage/migrations`` inside the package, so ``planner db upgrade`` works
from an installed wheel; they run through a programmatic Alembic config (no alembic.ini needed).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
#: pg_advisory_lock key that serialises concurrent ``db upgrade`` runs on one PostgreSQL.
_MIGRATION_LOCK_KEY = 0x706C616E6E6572  # "planner"


class SchemaNotReady(RuntimeError):
    """The database schema is missing or older than this code: run ``planner db upgrade``."""


def make_engine(url: str, pool_size: int = 10, max_overflow: int = 20) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:"):
            raise ValueError("use a file for SQLite (sqlite:///path/planner.db); in-memory databases are per-connection")
        Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            hide_parameters=True,
            pool_size=pool_size,
            max_overflow=max_overflow,
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised via every test
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see "begin" below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection):
            immediate = conn.get_execution_options().get("sqlite_immediate", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    # hide_parameters: an error never writes request values (names, bodies) into the log.
    return create_engine(url, pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=True, hide_parameters=True)


@contextmanager
def write_connection(engine: Engine) -> Iterator[Connection]:
    """A connection inside a write transaction (``BEGIN IMMEDIATE`` on SQLite); commits on exit,
    rolls back on error."""
    with engine.connect() as conn:
        conn.execution_options(sqlite_immediate=True)
        with conn.begin():
            yield conn


def _alembic_config(connection: Connection | None = None):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(_alembic_config()).get_heads()
    if len(heads) != 1:  # pragma: no cover - a packaging mistake
        raise RuntimeError(f"expected one migration head, found {heads}")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Upgrade the schema to ``revision``; returns the revision now current."""
    from alembic import command

    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
            conn.commit()
        try:
            command.upgrade(_alembic_config(conn), revision)
            conn.commit()
        finally:
            if conn.dialect.name == "postgresql":
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                conn.commit()
    return current_revision(engine) or ""


def check_schema(engine: Engine) -> None:
    """Raise :class:`SchemaNotReady` with an actionable message unless the schema is at head."""
    head = head_revision()
    try:
        current = current_revision(engine)
    except Exception as exc:  # connection refused, bad credentials, ...
        raise SchemaNotReady(f"cannot reach the database {engine.url.render_as_string(hide_password=True)}: {exc}") from exc
    if current != head:
        where = "has no planner schema" if current is None else f"is at schema revision {current}"
        raise SchemaNotReady(
            f"the database {engine.url.render_as_string(hide_password=True)} {where}; this version needs "
            f"revision {head}. Run `planner db upgrade` (with the same DATABASE_URL) first."
        )


__all__ = ["MIGRATIONS_DIR", "SchemaNotReady", "check_schema", "current_revision", "head_revision", "make_engine", "upgrade", "write_connection"]
