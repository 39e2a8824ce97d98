"""Per-app objects for the routes (built by the app factory, kept on ``app.state``).

Routes take them as ``Annotated`` aliases (``service: ServiceDep``), never as ``Depends(...)``
defaults: the alias says the type once and keeps the parameter list free of calls.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from planner_service.api.middleware import Metrics
from planner_service.service.plans import PlanService
from planner_service.storage.repository import Repository


def get_service(request: Request) -> PlanService:
    service: PlanService = request.app.state.service
    return service


def get_repository(request: Request) -> Repository:
    repo: Repository = request.app.state.repository
    return repo


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


ServiceDep = Annotated[PlanService, Depends(get_service)]
RepoDep = Annotated[Repository, Depends(get_repository)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]

__all__ = ["MetricsDep", "RepoDep", "ServiceDep", "get_metrics", "get_repository", "get_service"]
