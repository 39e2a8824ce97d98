"""Observed runs and per-cluster calibrations: the ``observations`` table (what a launched run of
a plan measured, tenant-scoped, keyed by plan and cluster) and the ``calibrations`` table
(versioned fitted constants per tenant and cluster).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "observations",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("tenant", sa.String(100), nullable=False, server_default="default"),
        sa.Column("plan_id", sa.String(36), nullable=False),
        sa.Column("cluster_key", sa.String(200), nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("predicted", sa.JSON(), nullable=False),
        sa.Column("basis", sa.JSON(), nullable=False),
        sa.Column("calibration_version", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_observations"),
    )
    op.create_index("ix_observations_tenant", "observations", ["tenant"])
    op.create_index("ix_observations_plan_id", "observations", ["plan_id"])
    op.create_index("ix_observations_cluster_key", "observations", ["cluster_key"])
    op.create_index("ix_observations_tenant_cluster_key_created_at", "observations", ["tenant", "cluster_key", "created_at"])
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(100), nullable=False, server_default="default"),
        sa.Column("cluster_key", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("constants", sa.JSON(), nullable=False),
        sa.Column("fit", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_calibrations"),
        sa.UniqueConstraint("tenant", "cluster_key", "version", name="uq_calibrations_tenant_cluster_key_version"),
    )
    op.create_index("ix_calibrations_tenant", "calibrations", ["tenant"])


def downgrade() -> None:
    op.drop_table("calibrations")
    op.drop_index("ix_observations_tenant_cluster_key_created_at", "observations")
    op.drop_index("ix_observations_cluster_key", "observations")
    op.drop_index("ix_observations_plan_id", "observations")
    op.drop_index("ix_observations_tenant", "observations")
    op.drop_table("observations")
