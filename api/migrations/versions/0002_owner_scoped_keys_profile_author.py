"""Idempotency keys of plans are unique per token (created_by, idempotency_key), no longer across
all users; profiles record the agent that uploaded them (the lease holder of their attempt),
filled in for existing rows from run_attempts.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25 06:00:00.000000

SQLite cannot drop a constraint in place: batch mode rebuilds the table (api.db.migrate turns
SQLite's foreign-key enforcement off around the migration and checks the keys before it commits).
0001 left the old constraint unnamed; the naming convention below gives it the name SQLite's
reflection will find, PostgreSQL's own name is read from the database.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

OWNER_KEY = "uq_plans_created_by_idempotency_key"
GLOBAL_KEY = "uq_plans_idempotency_key"
NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}
PROFILE_AUTHOR_FK = "fk_profiles_agent_id_agents"


def _global_key_name() -> str:
    """The name of 0001's unique constraint on plans.idempotency_key on this database."""
    for constraint in sa.inspect(op.get_bind()).get_unique_constraints("plans"):
        if constraint["column_names"] == ["idempotency_key"] and constraint["name"]:
            return str(constraint["name"])
    return GLOBAL_KEY  # SQLite: unnamed in the table's DDL; NAMING names it on reflection


def upgrade() -> None:
    old = _global_key_name()
    with op.batch_alter_table('plans', schema=None, naming_convention=NAMING) as batch_op:
        batch_op.drop_constraint(old, type_='unique')
        batch_op.create_unique_constraint(OWNER_KEY, ['created_by', 'idempotency_key'])

    with op.batch_alter_table('profiles', schema=None) as batch_op:
        batch_op.add_column(sa.Column('agent_id', sa.Integer(), nullable=True))
        batch_op.create_foreign_key(PROFILE_AUTHOR_FK, 'agents', ['agent_id'], ['id'])
    op.execute(
        "UPDATE profiles SET agent_id = (SELECT run_attempts.agent_id FROM run_attempts "
        "WHERE run_attempts.run_id = profiles.run_id AND run_attempts.attempt = profiles.attempt)"
    )


def downgrade() -> None:
    """Fails if two tokens stored plans under the same key (the global constraint cannot hold)."""
    with op.batch_alter_table('profiles', schema=None) as batch_op:
        batch_op.drop_constraint(PROFILE_AUTHOR_FK, type_='foreignkey')
        batch_op.drop_column('agent_id')

    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_constraint(OWNER_KEY, type_='unique')
        batch_op.create_unique_constraint(GLOBAL_KEY, ['idempotency_key'])
