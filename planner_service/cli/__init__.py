"""The ``planner`` command line: one module per command group, registered by ``main``."""

from planner_service.cli.main import main

__all__ = ["main"]
