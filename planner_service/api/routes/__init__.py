"""The API's routers, one module per resource.  To add a resource: create
``routes/<resource>.py`` with a ``router`` and add its module name to ``ROUTER_MODULES``."""

from __future__ import annotations

import importlib

from fastapi import APIRouter

ROUTER_MODULES = (
    "planner_service.api.routes.health",
    "planner_service.api.routes.catalog",
    "planner_service.api.routes.estimate",
    "planner_service.api.routes.plans",
    "planner_service.api.routes.observations",
    "planner_service.api.routes.jobs",
    "planner_service.api.routes.launch",
    "planner_service.api.routes.clusters",
    "planner_service.api.routes.profiles",
    "planner_service.api.routes.models",
    "planner_service.api.routes.web",
)


def all_routers() -> list[APIRouter]:
    return [importlib.import_module(name).router for name in ROUTER_MODULES]
