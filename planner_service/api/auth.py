"""Tenants, API keys and per-tenant rate limits at the HTTP edge.

Every ``/v1`` route depends on :func:`authenticate`:

* ``Authorization: Bearer <key>`` (keys from ``planner keys create``) → the key's tenant and role;
  no header or an unknown/revoked key is 401 with ``WWW-Authenticate: Bearer``;
* the role must allow the request: ``reader`` may only read (GET, HEAD and ``POST
  /v1/estimate``, which stores nothing), ``member`` may also write its tenant's resources,
  ``admin`` may in addition read every tenant's resources; otherwise 403;
* the tenant's request rate (``PLANNER_RATE_LIMIT``, the ``limits`` library's moving window,
  counted per server process) → 429 with ``Retry-After``.

With ``PLANNER_AUTH=disabled`` every request is the ``default`` tenant's admin (``planner
serve`` allows that only on a loopback address).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from limits import parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from starlette.exceptions import HTTPException

from planner_service.settings import ServiceSettings
from planner_service.storage.models import DEFAULT_TENANT
from planner_service.storage.repository import Repository

ROLE_RANK = {"reader": 0, "member": 1, "admin": 2}
#: POST routes that store nothing (a reader may call them).
READ_ONLY_POSTS = frozenset({"/v1/estimate"})

_bearer = HTTPBearer(auto_error=False, description="An API key from `planner keys create` (PLANNER_AUTH=enabled)")


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Who is calling: the tenant, the role and the key id (None with auth disabled)."""

    tenant: str
    role: str
    key_id: str | None = None

    @property
    def reads_all(self) -> bool:
        return self.role == "admin"


class RateLimiter:
    """Per-tenant request rate (one per app; counts in this process)."""

    def __init__(self, rate: str) -> None:
        self.item = parse(rate) if rate.strip() else None
        self.limiter = MovingWindowRateLimiter(MemoryStorage())

    def check(self, tenant: str) -> None:
        if self.item is None or self.limiter.hit(self.item, "tenant", tenant):
            return
        reset_s = self.limiter.get_window_stats(self.item, "tenant", tenant).reset_time - time.time()
        retry = str(max(1, math.ceil(reset_s)))
        raise HTTPException(429, f"rate limit of {self.item} per tenant exceeded; retry after {retry} s", headers={"Retry-After": retry})


def required_role(request: Request) -> str:
    if request.method in ("GET", "HEAD", "OPTIONS") or (request.method == "POST" and request.url.path in READ_ONLY_POSTS):
        return "reader"
    return "member"


def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    settings: ServiceSettings = request.app.state.settings
    if not settings.auth_enabled:
        principal = Principal(tenant=DEFAULT_TENANT, role="admin")
    else:
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise HTTPException(401, "an API key is required: send Authorization: Bearer <key>", headers={"WWW-Authenticate": "Bearer"})
        repo: Repository = request.app.state.repository
        record = repo.verify_api_key(credentials.credentials)
        if record is None:
            raise HTTPException(401, "the API key is not valid (unknown or revoked)", headers={"WWW-Authenticate": "Bearer"})
        principal = Principal(tenant=record.tenant, role=record.role, key_id=record.id)
    need = required_role(request)
    if ROLE_RANK.get(principal.role, -1) < ROLE_RANK[need]:
        raise HTTPException(403, f"the role {principal.role!r} may not {request.method} {request.url.path}; it needs {need!r} or above")
    request.app.state.rate_limiter.check(principal.tenant)
    return principal


PrincipalDep = Annotated[Principal, Depends(authenticate)]

__all__ = ["Principal", "PrincipalDep", "RateLimiter", "authenticate", "required_role"]
