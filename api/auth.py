"""Bearer tokens: `apt_` + 32 random bytes (urlsafe base64), stored as their sha256 hex digest.

The secret is shown once, by `create_token`; the database keeps the digest and the first characters
(`prefix`, to tell tokens apart in lists). Revocation sets `revoked_at` and takes effect on the next
request (every request looks its token up). Roles: `user` (plans, specs, evaluations, queue runs
and cancel its own, read everything), `admin` (a user that may also cancel any user's run) and
`agent` (bound to one cluster: register agents, and as those agents lease, heartbeat, upload
profiles, finish; read that cluster's runs).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Literal, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.models import ApiToken, utcnow

TOKEN_PREFIX = "apt_"
CLUSTER_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
Role = Literal["user", "admin", "agent"]
ROLES: tuple[Role, ...] = get_args(Role)


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id, name, role and (agents) cluster."""

    token_id: int
    name: str
    role: Role
    cluster: str | None

    @property
    def is_agent(self) -> bool:
        return self.role == "agent"

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def create_token(session: Session, name: str, role: Role = "user", cluster: str | None = None) -> tuple[ApiToken, str]:
    """Store a new token; returns the row and the secret (the only time it is seen)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if role == "agent":
        if not cluster:
            raise ValueError("an agent token needs --cluster (the cluster it leases runs for)")
        if not CLUSTER_NAME_RE.match(cluster):
            raise ValueError(f"cluster {cluster!r} must match {CLUSTER_NAME_RE.pattern}")
    elif cluster:
        raise ValueError("only agent tokens are bound to a cluster")
    if not name or len(name) > 128:
        raise ValueError("name must be 1-128 characters")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, role=role, cluster=cluster, token_hash=hash_token(secret), prefix=secret[:10])
    session.add(row)
    session.flush()
    return row, secret


def revoke_token(session: Session, token_id: int) -> ApiToken | None:
    row = session.get(ApiToken, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def principal_for(session: Session, secret: str) -> Principal | None:
    """The live (not revoked) token with this secret, or None."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 128:
        return None
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    if row is None or row.revoked_at is not None:
        return None
    return Principal(token_id=row.id, name=row.name, role=row.role, cluster=row.cluster)  # type: ignore[arg-type]
