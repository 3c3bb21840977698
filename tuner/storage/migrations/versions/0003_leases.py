"""Leases: a running job or trial is held by its worker (process) only while that worker heartbeats.

Jobs: ``lease_expires_at`` is renewed by the worker's heartbeat (``heartbeat_at``); once it has passed, the worker is
taken for dead and the next worker takes the job over (``attempts`` counts the claims) or fails it with the reason.
Trials: ``dstune_trial_leases`` names the holder running a trial (``host:pid:start/token``) and its renewed lease, so a
resuming study fails only the trials nobody holds, not those of another live process on the same study. Trials
already running have no lease row (and are treated as before: stale on resume).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("dstune_jobs", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("dstune_jobs", sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("dstune_jobs", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_dstune_jobs_status_lease_expires_at", "dstune_jobs", ["status", "lease_expires_at"])
    op.create_table(
        "dstune_trial_leases",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["dstune_trials.id"], name="fk_dstune_trial_leases_trial_id_dstune_trials", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("trial_id", name="pk_dstune_trial_leases"),
    )


def downgrade() -> None:
    op.drop_table("dstune_trial_leases")
    op.drop_index("ix_dstune_jobs_status_lease_expires_at", table_name="dstune_jobs")
    with op.batch_alter_table("dstune_jobs") as batch:
        batch.drop_column("attempts")
        batch.drop_column("heartbeat_at")
        batch.drop_column("lease_expires_at")
