"""Initial schema: workloads, studies, trials, calibration, jobs.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of tuner.storage's column types: migrations must not change when the models do.
JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    op.create_table(
        "dstune_workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("model_family", sa.String(64), nullable=False),
        sa.Column("model_name", sa.String(255), nullable=False),
        sa.Column("n_params", sa.BigInteger(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(16), nullable=False),
        sa.Column("gpu_memory", sa.BigInteger(), nullable=False),
        sa.Column("workload", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_dstune_workloads"),
        sa.UniqueConstraint("fingerprint", name="uq_dstune_workloads_fingerprint"),
    )
    op.create_table(
        "dstune_studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("sampler", sa.String(64), nullable=False),
        sa.Column("objectives", JSON, nullable=False),
        sa.Column("settings", JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("optuna_study_name", sa.String(512), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["dstune_workloads.id"],
            name="fk_dstune_studies_workload_id_dstune_workloads",
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_dstune_studies"),
        sa.UniqueConstraint("name", name="uq_dstune_studies_name"),
    )
    op.create_index("ix_dstune_studies_workload_id", "dstune_studies", ["workload_id"])
    op.create_table(
        "dstune_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("config_key", sa.String(128), nullable=False),
        sa.Column("ds_config", JSON, nullable=False),
        sa.Column("activation_checkpointing", sa.Boolean(), nullable=False),
        sa.Column("params", JSON, nullable=True),
        sa.Column("estimate", JSON, nullable=True),
        sa.Column("estimated_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("prune_reason", sa.Text(), nullable=True),
        sa.Column("constraint", sa.Double(), nullable=True),
        sa.Column("measurement", JSON, nullable=True),
        sa.Column("tokens_per_s", sa.Double(), nullable=True),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("hardware", sa.String(128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["study_id"], ["dstune_studies.id"], name="fk_dstune_trials_study_id_dstune_studies", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_dstune_trials"),
        sa.UniqueConstraint("study_id", "config_key", name="uq_dstune_trials_study_id_config_key"),
    )
    op.create_index("ix_dstune_trials_study_id_number", "dstune_trials", ["study_id", "number"])
    op.create_index("ix_dstune_trials_study_id_status", "dstune_trials", ["study_id", "status"])
    op.create_table(
        "dstune_calibration",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hardware", sa.String(128), nullable=False),
        sa.Column("model_family", sa.String(64), nullable=False),
        sa.Column("margin", sa.Double(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("stats", JSON, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_dstune_calibration"),
        sa.UniqueConstraint("hardware", "model_family", name="uq_dstune_calibration_hardware_model_family"),
    )
    op.create_table(
        "dstune_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_name", sa.String(255), nullable=False),
        sa.Column("request", JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("progress", JSON, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_dstune_jobs"),
    )
    op.create_index("ix_dstune_jobs_study_name", "dstune_jobs", ["study_name"])
    op.create_index("ix_dstune_jobs_status_created_at", "dstune_jobs", ["status", "created_at"])


def downgrade() -> None:
    op.drop_table("dstune_jobs")
    op.drop_table("dstune_calibration")
    op.drop_table("dstune_trials")
    op.drop_table("dstune_studies")
    op.drop_table("dstune_workloads")
