"""Initial schema: tokens, plans, team models and clusters, evaluations, agents, runs, run attempts,
profiles

Revision ID: 0001
Revises:
Create Date: 2026-11-23 03:31:07.147947
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('cluster', sa.String(length=64), nullable=True),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_table('agents',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('cluster', sa.String(length=64), nullable=False),
    sa.Column('hostname', sa.String(length=256), nullable=False),
    sa.Column('token_id', sa.Integer(), nullable=False),
    sa.Column('registered_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agents_cluster'), ['cluster'], unique=False)

    op.create_table('evaluations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.Integer(), nullable=True),
    sa.Column('model_name', sa.String(length=256), nullable=False),
    sa.Column('cluster_name', sa.String(length=256), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('job', JSON_TYPE, nullable=False),
    sa.Column('result', JSON_TYPE, nullable=False),
    sa.ForeignKeyConstraint(['created_by'], ['api_tokens.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('plans',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.Integer(), nullable=True),
    sa.Column('model_name', sa.String(length=256), nullable=False),
    sa.Column('cluster_name', sa.String(length=256), nullable=False),
    sa.Column('gpus', sa.BigInteger(), nullable=False),
    sa.Column('seq_len', sa.BigInteger(), nullable=False),
    sa.Column('global_batch', sa.BigInteger(), nullable=False),
    sa.Column('precision', sa.String(length=16), nullable=False),
    sa.Column('feasible', sa.Boolean(), nullable=False),
    sa.Column('step_s', sa.Float(), nullable=True),
    sa.Column('tokens_per_s', sa.Float(), nullable=True),
    sa.Column('mfu', sa.Float(), nullable=True),
    sa.Column('calibration', sa.String(length=256), nullable=False),
    sa.Column('idempotency_key', sa.String(length=128), nullable=True),
    sa.Column('request_sha256', sa.String(length=64), nullable=True),
    sa.Column('plan', JSON_TYPE, nullable=False),
    sa.ForeignKeyConstraint(['created_by'], ['api_tokens.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('idempotency_key')
    )
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.create_index('ix_plans_created_at', ['created_at'], unique=False)
        batch_op.create_index('ix_plans_model_cluster', ['model_name', 'cluster_name'], unique=False)
        batch_op.create_index('ix_plans_tokens_per_s', ['tokens_per_s'], unique=False)

    op.create_table('team_clusters',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.Integer(), nullable=True),
    sa.Column('spec', JSON_TYPE, nullable=False),
    sa.ForeignKeyConstraint(['created_by'], ['api_tokens.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('team_models',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.Integer(), nullable=True),
    sa.Column('spec', JSON_TYPE, nullable=False),
    sa.ForeignKeyConstraint(['created_by'], ['api_tokens.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=False),
    sa.Column('cluster', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('lease_seconds', sa.Integer(), nullable=False),
    sa.Column('launch', JSON_TYPE, nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('agent_id', sa.Integer(), nullable=True),
    sa.Column('lease_deadline', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('progress', JSON_TYPE, nullable=True),
    sa.Column('failure_reason', sa.Text(), nullable=True),
    sa.Column('exit_code', sa.BigInteger(), nullable=True),
    sa.Column('log_tail', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.Integer(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['agent_id'], ['agents.id'], ),
    sa.ForeignKeyConstraint(['created_by'], ['api_tokens.id'], ),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_cluster_status', ['cluster', 'status', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_plan_id'), ['plan_id'], unique=False)

    op.create_table('profiles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=False),
    sa.Column('cluster', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=128), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('step_s', sa.Float(), nullable=True),
    sa.Column('tokens_per_s', sa.Float(), nullable=True),
    sa.Column('mfu', sa.Float(), nullable=True),
    sa.Column('profile', JSON_TYPE, nullable=False),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id')
    )
    with op.batch_alter_table('profiles', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_profiles_cluster'), ['cluster'], unique=False)
        batch_op.create_index(batch_op.f('ix_profiles_plan_id'), ['plan_id'], unique=False)

    op.create_table('run_attempts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('agent_id', sa.Integer(), nullable=False),
    sa.Column('leased_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.ForeignKeyConstraint(['agent_id'], ['agents.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'attempt', name='uq_run_attempts_run_attempt')
    )


def downgrade() -> None:
    op.drop_table('run_attempts')
    with op.batch_alter_table('profiles', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_profiles_plan_id'))
        batch_op.drop_index(batch_op.f('ix_profiles_cluster'))

    op.drop_table('profiles')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_plan_id'))
        batch_op.drop_index('ix_runs_cluster_status')

    op.drop_table('runs')
    op.drop_table('team_models')
    op.drop_table('team_clusters')
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_index('ix_plans_tokens_per_s')
        batch_op.drop_index('ix_plans_model_cluster')
        batch_op.drop_index('ix_plans_created_at')

    op.drop_table('plans')
    op.drop_table('evaluations')
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agents_cluster'))

    op.drop_table('agents')
    op.drop_table('api_tokens')
