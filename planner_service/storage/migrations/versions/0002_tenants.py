"""Tenants and API keys: a ``tenant`` column on every owned table (existing rows go to the
``default`` tenant), de-duplication and saved-cluster names unique per tenant, and the
``api_keys`` table (only a salted HMAC of each key is stored).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
OWNED = ("plans", "jobs", "clusters", "models", "profiles")


def upgrade() -> None:
    for table in OWNED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("tenant", sa.String(100), nullable=False, server_default="default"))
    with op.batch_alter_table("plans") as batch:
        batch.drop_constraint("uq_plans_request_hash_revision", type_="unique")
        batch.create_unique_constraint("uq_plans_tenant_request_hash_revision", ["tenant", "request_hash", "revision"])
    with op.batch_alter_table("clusters") as batch:
        batch.drop_constraint("uq_clusters_name", type_="unique")
        batch.create_unique_constraint("uq_clusters_tenant_name", ["tenant", "name"])
    for table in OWNED:
        op.create_index(f"ix_{table}_tenant", table, ["tenant"])

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(16), nullable=False),
        sa.Column("tenant", sa.String(100), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("salt", sa.String(64), nullable=False),
        sa.Column("key_hash", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
        sa.CheckConstraint("role IN ('admin','member','reader')", name="ck_api_keys_role"),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
    )
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant"])


def downgrade() -> None:
    op.drop_table("api_keys")
    for table in OWNED:
        op.drop_index(f"ix_{table}_tenant", table)
    with op.batch_alter_table("clusters") as batch:
        batch.drop_constraint("uq_clusters_tenant_name", type_="unique")
        batch.create_unique_constraint("uq_clusters_name", ["name"])
    with op.batch_alter_table("plans") as batch:
        batch.drop_constraint("uq_plans_tenant_request_hash_revision", type_="unique")
        batch.create_unique_constraint("uq_plans_request_hash_revision", ["request_hash", "revision"])
    for table in OWNED:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("tenant")
