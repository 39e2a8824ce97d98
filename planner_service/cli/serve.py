"""``planner serve``, ``planner db upgrade|current``, ``planner worker``."""

from __future__ import annotations

import logging
import signal
import sys
import threading

import typer

from planner_service.settings import ServiceSettings


def _settings(database_url: str | None) -> ServiceSettings:
    try:
        return ServiceSettings(**({"database_url": database_url} if database_url else {}))
    except Exception as exc:  # pydantic ValidationError from a bad PLANNER_* variable
        typer.echo(f"error: invalid settings: {exc}", err=True)
        raise typer.Exit(2) from None


def _engine(settings: ServiceSettings):
    from sqlalchemy.exc import ArgumentError

    from planner_service.storage.db import make_engine

    try:
        return make_engine(settings.database_url, settings.db_pool_size, settings.db_max_overflow)
    except (ArgumentError, ValueError) as exc:
        typer.echo(f"error: DATABASE_URL {settings.database_url!r} is not usable: {exc}", err=True)
        raise typer.Exit(2) from None


DB_URL_OPTION = typer.Option(
    None, "--database-url", help="Overrides DATABASE_URL (default: $XDG_DATA_HOME/planner/planner.db, ~/.local/share/planner/planner.db)."
)


def _shown_url(url: str) -> str:
    """The database URL without its password, for the start-up line."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is reported by _engine
        return url


def register(app: typer.Typer) -> None:
    db = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
    app.add_typer(db, name="db")

    @app.command("serve")
    def serve(
        host: str = typer.Option("127.0.0.1", help="Interface to bind."),
        port: int = typer.Option(8000, min=0, max=65535, help="TCP port."),
        database_url: str | None = DB_URL_OPTION,
        log_level: str = typer.Option("info", help="uvicorn log level."),
        access_log: bool = typer.Option(True, help="Log every request."),
        workers: int = typer.Option(1, min=1, max=64, help="Server processes (each a stateless replica)."),
    ) -> None:
        """Run the HTTP API (and, on SQLite, the job worker in-process)."""
        import os

        import uvicorn
        from sqlalchemy.exc import OperationalError

        from planner_service.api import create_app
        from planner_service.storage.db import SchemaNotReady, check_schema, upgrade

        settings = _settings(database_url)
        try:
            settings.check_bind(host)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        engine = _engine(settings)  # validates the URL with a clear message
        typer.echo(f"planner: database {_shown_url(settings.database_url)} (set DATABASE_URL or --database-url to change)", err=True)
        logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            if settings.migrate_on_start:
                upgrade(engine)  # once, here, not in every server process
            else:
                check_schema(engine)
        except SchemaNotReady as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        except OperationalError as exc:
            typer.echo(f"error: cannot reach the database: {exc.orig}", err=True)
            raise typer.Exit(1) from None
        finally:
            engine.dispose()
        if workers == 1:
            application = create_app(settings.model_copy(update={"auto_migrate": False}))
            uvicorn.run(application, host=host, port=port, log_level=log_level, access_log=access_log)
            return
        # Several processes: uvicorn imports the factory in each; settings travel by environment.
        os.environ["DATABASE_URL"] = settings.database_url
        os.environ["PLANNER_AUTO_MIGRATE"] = "false"
        uvicorn.run(
            "planner_service.api.app:create_app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            access_log=access_log,
        )

    @db.command("upgrade")
    def db_upgrade(
        database_url: str | None = DB_URL_OPTION,
        revision: str = typer.Option("head", help="Target revision."),
    ) -> None:
        """Create or upgrade the schema to the latest revision."""
        from sqlalchemy.exc import OperationalError

        from planner_service.storage.db import upgrade

        settings = _settings(database_url)
        engine = _engine(settings)
        try:
            now = upgrade(engine, revision)
        except OperationalError as exc:
            typer.echo(f"error: cannot reach the database: {exc.orig}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"database {engine.url.render_as_string(hide_password=True)} is at revision {now}")

    @db.command("current")
    def db_current(database_url: str | None = DB_URL_OPTION) -> None:
        """Print the schema revision of the database and the one this code needs."""
        from planner_service.storage.db import current_revision, head_revision

        engine = _engine(_settings(database_url))
        typer.echo(f"current: {current_revision(engine) or 'none'}  head: {head_revision()}")

    @app.command("worker")
    def worker(
        database_url: str | None = DB_URL_OPTION,
        worker_id: str | None = typer.Option(None, help="Name in jobs.worker_id (default host:pid:random)."),
        max_jobs: int | None = typer.Option(None, min=1, help="Exit after this many jobs."),
        log_level: str = typer.Option("info"),
    ) -> None:
        """Run planning jobs from the database queue until SIGTERM/SIGINT."""
        from planner_service.service.plans import PlanService
        from planner_service.service.worker import JobWorker
        from planner_service.storage.db import SchemaNotReady, check_schema
        from planner_service.storage.repository import Repository

        logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        settings = _settings(database_url)
        engine = _engine(settings)
        try:
            check_schema(engine)
        except SchemaNotReady as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        repo = Repository(engine)
        job_worker = JobWorker(repo, PlanService(repo, settings), settings, worker_id=worker_id)
        stop = threading.Event()

        def _stop(signum, _frame) -> None:
            stop.set()
            job_worker.wakeup.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        typer.echo(f"worker {job_worker.worker_id} ready", err=True)
        sys.stderr.flush()
        ran = job_worker.run(stop, max_jobs=max_jobs)
        typer.echo(f"worker {job_worker.worker_id} stopped after {ran} job(s)", err=True)
        engine.dispose()


__all__ = ["register"]
