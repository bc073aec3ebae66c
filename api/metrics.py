"""Prometheus metrics (text exposition format at GET /metrics), one registry per app.

Request metrics are labelled by the route template (`/v1/plans/{plan_id}`), never the raw path, so
the label set stays bounded. Run counts by status are read from the database at scrape time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from api.models import RunRow

METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
"""HTTP methods that get their own label; any other method (made up by a client) is "other"."""


class RunStatusCollector(Collector):
    def __init__(self, session_factory: Callable[[], Any]):
        self._session_factory = session_factory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fam = GaugeMetricFamily("autopar_runs", "runs by status", labels=["status"])
        try:
            with self._session_factory() as session:
                rows = session.execute(select(RunRow.status, func.count()).group_by(RunRow.status)).all()
        except Exception:  # a scrape must not fail because the database is briefly unavailable
            rows = []
        for status, n in rows:
            fam.add_metric([status], n)
        yield fam


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "autopar_http_requests", "HTTP requests", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "autopar_http_request_duration_seconds", "HTTP request latency in seconds", ["method", "route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=self.registry,
        )
        self.plans = Counter("autopar_plans_created", "plans stored", ["feasible"], registry=self.registry)
        self.search_seconds = Histogram(
            "autopar_planner_search_seconds", "seconds one planner search took",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300), registry=self.registry,
        )
        self.planner_pending = Gauge("autopar_planner_pending", "searches queued or running", registry=self.registry)
        self.planner_rejected = Counter(
            "autopar_planner_rejected", "plan requests refused because the planner was saturated",
            registry=self.registry,
        )
        self.planner_errors = Counter(
            "autopar_planner_errors", "searches or evaluations that raised on their input", registry=self.registry
        )
        self.planner_over_budget = Counter(
            "autopar_planner_over_budget", "planner jobs stopped at their time budget (nothing stored)",
            registry=self.registry,
        )
        self.planner_cancelled = Counter(
            "autopar_planner_cancelled", "planner jobs cancelled because their client disconnected",
            registry=self.registry,
        )
        self.planner_refused = Counter(
            "autopar_planner_refused", "plan requests refused before the search by their work budget",
            registry=self.registry,
        )
        self.planner_worker_restarts = Counter(
            "autopar_planner_worker_restarts", "planner worker processes killed and replaced", registry=self.registry
        )
        self.planner_queue_seconds = Histogram(
            "autopar_planner_queue_seconds", "seconds a planner job waited for a worker",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=self.registry,
        )
        self.leases = Counter("autopar_leases", "runs leased to agents", registry=self.registry)
        self.lease_expirations = Counter(
            "autopar_lease_expirations", "leases that passed their deadline", ["outcome"], registry=self.registry
        )
        self.profiles = Counter("autopar_profiles_stored", "profiles stored", registry=self.registry)

    def watch_runs(self, session_factory: Callable[[], Any]) -> None:
        self.registry.register(RunStatusCollector(session_factory))

    def observe(self, method: str, route: str, status: int, started: float) -> None:
        """Labels come from closed sets: the HTTP methods of the API, the route templates (anything
        unmatched is "other"), and the status class for codes outside the standard range."""
        method = method if method in METHODS else "other"
        code = str(status) if 100 <= status <= 599 else "other"
        self.requests.labels(method, route, code).inc()
        self.latency.labels(method, route).observe(time.perf_counter() - started)
