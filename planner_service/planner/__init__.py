"""The planner: search for the best hybrid strategy and the placement of every rank.

Public entry point: :func:`plan`.  This package is the only code that imports OR-tools
(``planner_service.planner.solver``).
"""

from .search import PlanResult, SolverSettings, plan

__all__ = ["PlanResult", "SolverSettings", "plan"]
