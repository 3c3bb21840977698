"""Job leases: a running job is held by its worker only while the worker heartbeats.

``lease_expires_at`` is renewed by the worker's heartbeat (``heartbeat_at``); once it has passed, the worker is taken
for dead and the next worker takes the job over (``attempts`` counts the claims) or fails it with the reason. Jobs
already running keep a NULL lease: nothing takes them over.

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


def downgrade() -> None:
    op.drop_index("ix_dstune_jobs_status_lease_expires_at", table_name="dstune_jobs")
    with op.batch_alter_table("dstune_jobs") as batch:
        batch.drop_column("attempts")
        batch.drop_column("heartbeat_at")
        batch.drop_column("lease_expires_at")
