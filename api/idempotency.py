"""Idempotency keys (`api.deps.IdempotencyKey`): a retried POST with the same key answers what the
same token stored the first time; keys are per token, so another token's row is never found."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import conflict

Row = TypeVar("Row")


def stored_under_key(session: Session, row_type: type[Row], token_id: Any, key: str | None, digest: str, what: str) -> Row | None:
    """The row of `row_type` (a table with `created_by`, `idempotency_key` and `request_sha256`) this
    token stored under `key`, None when there is none (or no key); 409 when the key was used for a
    request with another digest (`planning.request_sha256`). `what` names the row in the message."""
    if key is None:
        return None
    table: Any = row_type
    row = session.scalar(select(table).where(table.created_by == token_id, table.idempotency_key == key))
    if row is None:
        return None
    if row.request_sha256 != digest:
        raise conflict(f"Idempotency-Key {key!r} was used for a different request ({what} {row.id})", ["header", "idempotency-key"])
    return row
