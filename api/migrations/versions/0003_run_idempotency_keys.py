"""Queueing a run honours an Idempotency-Key, scoped to its token like the plans' keys: runs gain
`idempotency_key` and `request_sha256`, unique on (created_by, idempotency_key).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 06:45:00.000000

SQLite adds the constraint by rebuilding the table in batch mode (`api.db.migrate` turns foreign-key
enforcement off around migrations and checks the keys before it commits).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

RUN_KEY = "uq_runs_created_by_idempotency_key"


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('idempotency_key', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('request_sha256', sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint(RUN_KEY, ['created_by', 'idempotency_key'])


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_constraint(RUN_KEY, type_='unique')
        batch_op.drop_column('request_sha256')
        batch_op.drop_column('idempotency_key')
