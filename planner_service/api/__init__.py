"""The HTTP API: ``create_app(settings)`` builds a FastAPI app; routes per resource in
``routes/``; typed errors mapped to HTTP in ``errors``."""

from planner_service.api.app import create_app

__all__ = ["create_app"]
