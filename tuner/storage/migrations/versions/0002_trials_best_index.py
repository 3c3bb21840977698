"""Index trials by (study, status, tokens/s): the best ok trial of a study is an index range scan.

``/v1/recommend`` and ``best_trial`` ask for a study's ok trials ordered by tokens/s; with the old (study_id, status)
index the database read every ok trial's row to sort them. The new index covers the old one's queries (same leading
columns), so the old one is dropped.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_dstune_trials_study_id_status_tokens_per_s", "dstune_trials", ["study_id", "status", "tokens_per_s"]
    )
    op.drop_index("ix_dstune_trials_study_id_status", table_name="dstune_trials")


def downgrade() -> None:
    op.create_index("ix_dstune_trials_study_id_status", "dstune_trials", ["study_id", "status"])
    op.drop_index("ix_dstune_trials_study_id_status_tokens_per_s", table_name="dstune_trials")
