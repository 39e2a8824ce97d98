"""Initial schema: plans, jobs, saved clusters, uploaded models, operator profiles.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.String(36), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("objective", sa.String(32), nullable=False),
        sa.Column("model_name", sa.String(200), nullable=False),
        sa.Column("model_params", sa.BigInteger(), nullable=True),
        sa.Column("cluster_name", sa.String(200), nullable=False),
        sa.Column("device_types", sa.String(1000), nullable=False),
        sa.Column("num_devices", sa.Integer(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.Column("mfu", sa.Float(), nullable=False),
        sa.Column("strategy", sa.JSON(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["plans.id"], name="fk_plans_parent_id_plans"),
        sa.PrimaryKeyConstraint("id", name="pk_plans"),
        sa.UniqueConstraint("request_hash", "revision", name="uq_plans_request_hash_revision"),
    )
    for name, cols in (
        ("ix_plans_parent_id", ["parent_id"]),
        ("ix_plans_status", ["status"]),
        ("ix_plans_model_name", ["model_name"]),
        ("ix_plans_cluster_name", ["cluster_name"]),
        ("ix_plans_device_types", ["device_types"]),
        ("ix_plans_num_devices", ["num_devices"]),
        ("ix_plans_created_at_id", ["created_at", "id"]),
        ("ix_plans_tokens_per_s_id", ["tokens_per_s", "id"]),
        ("ix_plans_step_time_s_id", ["step_time_s", "id"]),
        ("ix_plans_mfu_id", ["mfu", "id"]),
    ):
        op.create_index(name, "plans", cols)

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("force", sa.Boolean(), nullable=False),
        sa.Column("parent_id", sa.String(36), nullable=True),
        sa.Column("callback_url", sa.Text(), nullable=True),
        sa.Column("plan_id", sa.String(36), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("lease_expires_at", TS, nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.CheckConstraint("status IN ('queued','running','succeeded','failed','cancelled')", name="ck_jobs_status"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_request_hash", "jobs", ["request_hash"])
    op.create_index("ix_jobs_status_created_at", "jobs", ["status", "created_at"])

    op.create_table(
        "clusters",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_clusters"),
        sa.UniqueConstraint("name", name="uq_clusters_name"),
    )

    op.create_table(
        "models",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("graph", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.CheckConstraint("format IN ('onnx','graph')", name="ck_models_format"),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
    )
    op.create_index("ix_models_name", "models", ["name"])

    op.create_table(
        "profiles",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("device", sa.String(200), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("fitted", sa.JSON(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_profiles"),
    )
    op.create_index("ix_profiles_device", "profiles", ["device"])


def downgrade() -> None:
    op.drop_table("profiles")
    op.drop_table("models")
    op.drop_table("clusters")
    op.drop_table("jobs")
    op.drop_table("plans")
