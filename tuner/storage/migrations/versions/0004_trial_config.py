"""Workloads without the search's settings: micro-batch, accumulation and activation checkpointing are a trial's
(``tuner.workload.TrialConfig``), not the workload's.

Stored workload dicts lose ``train.micro_batch``, ``train.grad_accum`` and ``train.activation_checkpointing``, and
each fingerprint is recomputed as ``Workload.fingerprint`` now computes it (those fields hashed at the values every
study stored: 1, 1, off). A workload stored with them at those values (every study's) keeps its fingerprint; one
stored with others gets the fingerprint of its workload, and workloads that now coincide are merged into the oldest
row (their studies point at it), so a resumed study finds its workload.

The fingerprint is computed here from the stored JSON (the rule frozen as of this revision, no import of
``tuner``): sha256 of the sorted-keys JSON of the dict without the model's name, with :data:`LEGACY` in ``train``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LEGACY: dict[str, Any] = {"micro_batch": 1, "grad_accum": 1, "activation_checkpointing": False}
JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
workloads = sa.table(
    "dstune_workloads", sa.column("id", sa.Integer), sa.column("fingerprint", sa.String), sa.column("workload", JSON)
)
studies = sa.table("dstune_studies", sa.column("id", sa.Integer), sa.column("workload_id", sa.Integer))


def without_legacy(data: dict[str, Any]) -> dict[str, Any]:
    """The stored dict without the search's settings in ``train``."""
    data = copy.deepcopy(data)
    data["train"] = {key: value for key, value in data.get("train", {}).items() if key not in LEGACY}
    return data


def fingerprint(data: dict[str, Any]) -> str:
    """``Workload.fingerprint`` of a stored dict (as of this revision)."""
    payload = copy.deepcopy(data)
    payload["model"].pop("name", None)
    payload["train"] = {**payload["train"], **LEGACY}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.select(workloads.c.id, workloads.c.workload).order_by(workloads.c.id)).all()
    keeper: dict[str, int] = {}  # new fingerprint -> the oldest row with it
    updates: list[tuple[int, str, dict[str, Any]]] = []
    for row_id, stored in rows:
        data = without_legacy(json.loads(stored) if isinstance(stored, str) else stored)
        new = fingerprint(data)
        if new in keeper:  # the same workload as an older row: its studies move there
            bind.execute(sa.update(studies).where(studies.c.workload_id == row_id).values(workload_id=keeper[new]))
            bind.execute(sa.delete(workloads).where(workloads.c.id == row_id))
            continue
        keeper[new] = row_id
        updates.append((row_id, new, data))
    for row_id, _, _ in updates:  # two passes: no momentary clash with another row's old fingerprint
        bind.execute(sa.update(workloads).where(workloads.c.id == row_id).values(fingerprint=f"migrating:{row_id}"))
    for row_id, new, data in updates:
        bind.execute(sa.update(workloads).where(workloads.c.id == row_id).values(fingerprint=new, workload=data))


def downgrade() -> None:
    """The stored dicts get the fields back, at the values studies stored; fingerprints stay (merged rows stay
    merged)."""
    bind = op.get_bind()
    for row_id, stored in bind.execute(sa.select(workloads.c.id, workloads.c.workload)).all():
        data = json.loads(stored) if isinstance(stored, str) else copy.deepcopy(stored)
        data["train"] = {**LEGACY, **data.get("train", {})}
        bind.execute(sa.update(workloads).where(workloads.c.id == row_id).values(workload=data))
