"""Per-app objects for the routes (built by the app factory, kept on ``app.state``).

Routes take them as ``Annotated`` aliases (``service: ServiceDep``), never as ``Depends(...)``
defaults: the alias says the type once and keeps the parameter list free of calls.

``RepoDep`` and ``ServiceDep`` are the calling tenant's view (api.auth): a route sees, changes
and de-duplicates against its tenant's rows only (an admin key reads across tenants).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from planner_service.api.auth import PrincipalDep
from planner_service.api.middleware import Metrics
from planner_service.service.plans import PlanService
from planner_service.storage.repository import Repository


def get_repository(request: Request, principal: PrincipalDep) -> Repository:
    repo: Repository = request.app.state.repository
    return repo.scoped(principal.tenant, read_all=principal.reads_all)


def get_service(request: Request, repo: Annotated[Repository, Depends(get_repository)]) -> PlanService:
    service: PlanService = request.app.state.service
    return service.for_repository(repo)


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


ServiceDep = Annotated[PlanService, Depends(get_service)]
RepoDep = Annotated[Repository, Depends(get_repository)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]

__all__ = ["MetricsDep", "RepoDep", "ServiceDep", "get_metrics", "get_repository", "get_service"]
