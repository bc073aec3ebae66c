"""A queued run records what the service could not check about it: runs gain `notes` (a JSON list
of sentences, e.g. that the run's cluster is not registered, so that its GPUs could not be compared
with the ones the plan was priced for).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28 05:00:00.000000

A nullable column: no table rebuild on SQLite, no rewrite on PostgreSQL; runs queued before it
read as having no notes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('notes', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('notes')
