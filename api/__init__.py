"""The planning service: FastAPI app (`api.app.create_app`), SQLAlchemy models, Alembic migrations
(`api/migrations`, applied on start), bearer-token auth, and the runner-agent protocol (runs, leases,
profiles). Layer 4: imports model_specs, cluster_specs, cost_models and planner, never torch."""
