"""Errors of stored resources: a missing row and a conflicting write (mapped to 404 and 409 in
``planner_service.api.errors``)."""

from __future__ import annotations

from cost_model.errors import PlannerError


class NotFound(PlannerError):
    code = "not_found"


class Conflict(PlannerError):
    code = "conflict"


class Busy(PlannerError):
    """Over a limit that clears with time: a tenant's concurrency quota (``status`` 429) or the
    server's search capacity (503); ``retry_after_s`` becomes the ``Retry-After`` header."""

    code = "busy"

    def __init__(self, message: str, field: str | None = None, *, status: int = 429, retry_after_s: float = 1.0, code: str | None = None) -> None:
        super().__init__(message, field)
        self.status = status
        self.retry_after_s = retry_after_s
        if code is not None:
            self.code = code
