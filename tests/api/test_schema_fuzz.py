"""schemathesis over the served OpenAPI schema: a bounded number of generated requests per
operation (with a user token) must get no 5xx, only documented status codes, and bodies that
conform to the documented response schemas."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import checks  # noqa: E402

EXAMPLES_PER_OPERATION = int(os.environ.get("AUTOPAR_FUZZ_EXAMPLES", "20"))
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


def test_openapi_lists_every_endpoint(anon: Any) -> None:
    spec = anon.get("/openapi.json").json()
    expected = {
        ("post", "/v1/plans"), ("get", "/v1/plans"), ("get", "/v1/plans/{plan_id}"),
        ("get", "/v1/plans/{plan_id}/export/{format}"), ("post", "/v1/evaluate"), ("get", "/v1/models"),
        ("post", "/v1/models"), ("get", "/v1/clusters"), ("post", "/v1/clusters"), ("get", "/v1/gpus"),
        ("post", "/v1/plans/{plan_id}/runs"), ("post", "/v1/agents"), ("post", "/v1/runs/lease"),
        ("post", "/v1/runs/{run_id}/heartbeat"), ("put", "/v1/runs/{run_id}/profile"),
        ("post", "/v1/runs/{run_id}/finish"), ("post", "/v1/runs/{run_id}/cancel"), ("get", "/v1/runs"),
        ("get", "/v1/runs/{run_id}"), ("get", "/v1/plans/{plan_id}/profiles"), ("get", "/healthz"),
        ("get", "/metrics"),
    }
    served = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert expected <= served, expected - served
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


@pytest.mark.slow
def test_fuzz_no_server_error_and_responses_match_schema(server: Any, user_token: str, anon: Any) -> None:
    schema = schemathesis.openapi.from_dict(anon.get("/openapi.json").json())
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 20
    headers = {"Authorization": f"Bearer {user_token}"}
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    def fuzz(operation: Any) -> None:
        @settings(
            max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None, derandomize=True,
            phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def run(case: Any) -> None:
            response = case.call(base_url=server.url, headers=headers, timeout=120)
            statuses[response.status_code] += 1
            case.validate_response(response, checks=CHECKS)

        try:
            run()
        except Exception as exc:  # hypothesis re-raises the (shrunk) failing example's error
            failures.append(f"{operation.label}: {type(exc).__name__}: {str(exc)[:1500]}")

    for operation in operations:
        fuzz(operation)
    assert not failures, "\n\n".join(failures[:10])
    assert sum(statuses.values()) >= 2 * len(operations), statuses  # it did exercise the API
    assert statuses[200] + statuses[201] > 0 and statuses[422] > 0, statuses
    print(f"schemathesis: {sum(statuses.values())} requests over {len(operations)} operations: {dict(statuses)}")
