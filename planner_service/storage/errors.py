"""Errors of stored resources: a missing row and a conflicting write (mapped to 404 and 409 in
``planner_service.api.errors``)."""

from __future__ import annotations

from cost_model.errors import PlannerError


class NotFound(PlannerError):
    code = "not_found"


class Conflict(PlannerError):
    code = "conflict"
