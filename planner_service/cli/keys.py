"""``planner keys create|list|revoke``: API keys of tenants (stored in the service database).

``create`` prints the key once; the database keeps only a salted HMAC of it, so a lost key is
revoked and replaced, never recovered.
"""

from __future__ import annotations

import json

import typer

from planner_service.cli.serve import DB_URL_OPTION, _engine, _settings


def _repository(database_url: str | None):
    from planner_service.storage.db import SchemaNotReady, check_schema
    from planner_service.storage.repository import Repository

    engine = _engine(_settings(database_url))
    try:
        check_schema(engine)
    except SchemaNotReady as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    return Repository(engine)


def register(app: typer.Typer) -> None:
    keys = typer.Typer(help="API keys: every /v1 request sends Authorization: Bearer <key>.", no_args_is_help=True)
    app.add_typer(keys, name="keys")

    @keys.command("create")
    def create(
        tenant: str = typer.Option(..., help="Tenant the key acts for (lower-case letters, digits, '.', '_', '-')."),
        role: str = typer.Option("member", help="admin (reads every tenant), member (reads and writes its tenant) or reader (reads only)."),
        name: str | None = typer.Option(None, help="A note on what the key is for."),
        database_url: str | None = DB_URL_OPTION,
    ) -> None:
        """Create a key and print it (once: only its hash is stored)."""
        from planner_service.storage.ids import is_tenant
        from planner_service.storage.models import ROLES

        if not is_tenant(tenant):
            typer.echo("error: --tenant must be 1-100 lower-case letters, digits, '.', '_', '-'", err=True)
            raise typer.Exit(2)
        if role not in ROLES:
            typer.echo(f"error: --role must be one of {', '.join(ROLES)}", err=True)
            raise typer.Exit(2)
        key, record = _repository(database_url).create_api_key(tenant, role, name)
        typer.echo(f"created key {record.id} for tenant {tenant!r} with role {role!r}; it is shown only now:", err=True)
        typer.echo(key)

    @keys.command("list")
    def list_keys(database_url: str | None = DB_URL_OPTION) -> None:
        """Every key's id, tenant, role and dates (never the key)."""
        for record in _repository(database_url).list_api_keys():
            typer.echo(json.dumps(record.to_dict()))

    @keys.command("revoke")
    def revoke(key_id: str = typer.Argument(..., help="The key id (the part after plk_ and before the next _)."), database_url: str | None = DB_URL_OPTION) -> None:
        """Revoke a key: requests with it get 401 from then on."""
        from planner_service.storage.errors import NotFound

        try:
            _repository(database_url).revoke_api_key(key_id)
        except NotFound as exc:
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"revoked {key_id}")


__all__ = ["register"]
