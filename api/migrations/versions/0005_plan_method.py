"""A plan's training method (full, lora, qlora) becomes a column of its own, so that the plan list
shows it without loading any plan's JSON (lists select the summary columns only).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28 07:00:00.000000

A nullable column (no table rebuild on SQLite, no rewrite on PostgreSQL), filled for the plans
stored before it from their JSON (`inputs.training.method`) by the database's own JSON functions,
so the rows are never read into Python; a plan whose JSON names no method trained the full model.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

METHOD_OF_PLAN = {
    "sqlite": "json_extract(plan, '$.inputs.training.method')",
    "postgresql": "plan -> 'inputs' -> 'training' ->> 'method'",
}
"""The stored plan's `inputs.training.method` in each supported dialect's SQL."""


def upgrade() -> None:
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.add_column(sa.Column('method', sa.String(length=16), nullable=True))
    extract = METHOD_OF_PLAN[op.get_bind().dialect.name]
    op.execute(f"UPDATE plans SET method = COALESCE({extract}, 'full')")


def downgrade() -> None:
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_column('method')
