"""Per-app objects for the routes (built by the app factory, kept on ``app.state``)."""

from __future__ import annotations

from fastapi import Request

from planner_service.api.middleware import Metrics
from planner_service.service.plans import PlanService
from planner_service.storage.repository import Repository


def get_service(request: Request) -> PlanService:
    return request.app.state.service


def get_repository(request: Request) -> Repository:
    return request.app.state.repository


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics
