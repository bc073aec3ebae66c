"""A team cluster's measured kernel profile (`autopar profile`), stored per cluster: the table
`cluster_atlases` (one row per cluster, replaced by the next upload).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28 08:00:00.000000

A new table only: nothing stored before it changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    op.create_table(
        'cluster_atlases',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('cluster', sa.String(length=64), nullable=False),
        sa.Column('gpu', sa.String(length=64), nullable=False),
        sa.Column('device', sa.String(length=256), nullable=False),
        sa.Column('measured_at', sa.String(length=64), nullable=False),
        sa.Column('digest', sa.String(length=16), nullable=False),
        sa.Column('points', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_by', sa.Integer(), nullable=True),
        sa.Column('atlas', JSON_TYPE, nullable=False),
        sa.ForeignKeyConstraint(['created_by'], ['api_tokens.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('cluster'),
    )


def downgrade() -> None:
    op.drop_table('cluster_atlases')
