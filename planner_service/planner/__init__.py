"""The planner: search for the best hybrid strategy and the placement of every rank.

Public entry point: :func:`plan` (``planner.dispatch``).  ``planner.cpsat`` is the only module
that imports OR-tools.
"""

from planner_service.planner.dispatch import plan, search_size
from planner_service.planner.request import SearchCancelled, SolverSettings
from planner_service.planner.result import PlanResult

__all__ = ["PlanResult", "SearchCancelled", "SolverSettings", "plan", "search_size"]
