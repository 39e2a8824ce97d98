"""The one door to OR-tools: CP-SAT models, integer scaling and solver parameters.

The only module that imports ``ortools``.  Both planners build their models with
:class:`CpModel` (re-exported) and the types below; seconds and bytes become CP-SAT integers
through one :class:`IntScale`; a model is solved with :func:`solve` under :class:`SolverParams`
(time limit, workers, determinism), which returns a :class:`Solution`.

Scaling rule (both planners): times round to the nearest unit (each planner re-evaluates the
answer in floating point afterwards); memory rounds *up* and capacities *down*, so an
integer-feasible answer is feasible in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from ortools.sat.python import cp_model

CpModel = cp_model.CpModel
IntVar = cp_model.IntVar
LinearExpr = cp_model.LinearExprT
BoolVar = cp_model.BoolVarT

#: A solve never gets less than this (CP-SAT needs a moment to load the model).
MIN_TIME_LIMIT_S = 0.05
#: Slack under which a scaled memory amount is taken as a whole number of units (float noise).
MEMORY_ROUNDING_SLACK = 1e-9

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True)
class IntScale:
    """Seconds and bytes → CP-SAT integers: ``time_unit_s`` seconds and ``memory_unit_bytes``
    bytes (``cpu_memory_unit_bytes`` for the CPU parameter-server pool) per integer unit."""

    time_unit_s: float
    memory_unit_bytes: float = 1.0
    cpu_memory_unit_bytes: float = 1.0

    @staticmethod
    def for_reference(reference_s: float, time_resolution: float, memory_unit_bytes: float = 1.0,
                      cpu_memory_unit_bytes: float = 1.0) -> IntScale:
        """``reference_s`` (a reference step time, s) maps to ``time_resolution`` units."""
        return IntScale(time_unit_s=max(reference_s, 1e-9) / time_resolution, memory_unit_bytes=memory_unit_bytes,
                        cpu_memory_unit_bytes=cpu_memory_unit_bytes)

    def time(self, seconds: npt.ArrayLike) -> IntArray:
        """Seconds → units, to the nearest (element-wise)."""
        return np.rint(np.asarray(seconds, dtype=float) / self.time_unit_s).astype(np.int64)

    def time_int(self, seconds: float) -> int:
        """One time (s) → units, to the nearest."""
        return int(round(seconds / self.time_unit_s))

    def memory_up(self, amount_bytes: npt.ArrayLike) -> IntArray:
        """Bytes → units, rounded up (element-wise): what a plan needs."""
        return np.ceil(np.asarray(amount_bytes, dtype=float) / self.memory_unit_bytes - MEMORY_ROUNDING_SLACK).astype(np.int64)

    def memory_down(self, amount_bytes: float) -> int:
        """Bytes → units, rounded down: what a device holds."""
        return int(math.floor(amount_bytes / self.memory_unit_bytes))

    def cpu_memory_up(self, amount_bytes: npt.ArrayLike) -> IntArray:
        return np.ceil(np.asarray(amount_bytes, dtype=float) / self.cpu_memory_unit_bytes - MEMORY_ROUNDING_SLACK).astype(np.int64)

    def cpu_memory_down(self, amount_bytes: float) -> int:
        return int(math.floor(amount_bytes / self.cpu_memory_unit_bytes))


#: The seed every solve uses unless told otherwise (CP-SAT's default is 1; fixed here on purpose).
RANDOM_SEED = 1


@dataclass(frozen=True, kw_only=True)
class SolverParams:
    """How CP-SAT runs: wall-clock limit, search workers and, with ``deterministic``, the
    interleaved search (the same answer for the same model whatever the load of the host).

    ``deterministic_time_s`` bounds the solve by CP-SAT's deterministic time (a count of work,
    roughly seconds on a current core) instead of the clock: a solve stopped by it gives the
    same answer on any host and load.  ``time_limit_s`` then only guards against a host far
    slower than that; a solve it stops is not reproducible.  ``relative_gap_limit`` stops once
    the incumbent is proved within that fraction of the bound; ``random_seed`` fixes CP-SAT's
    randomisation."""

    time_limit_s: float
    num_workers: int = 1
    deterministic: bool = False
    deterministic_time_s: float | None = None
    relative_gap_limit: float | None = None
    random_seed: int = RANDOM_SEED
    #: Skip presolve's inclusion detection (costly on models with many similar constraints).
    skip_inclusion_presolve: bool = False


@dataclass(frozen=True, kw_only=True)
class Solution:
    """What a solve found: the status name and, when ``found``, the variables' values."""

    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN or MODEL_INVALID
    solver: cp_model.CpSolver

    @property
    def found(self) -> bool:
        return self.status in ("OPTIMAL", "FEASIBLE")

    @property
    def infeasible(self) -> bool:
        return self.status == "INFEASIBLE"

    @property
    def objective_value(self) -> float:
        return float(self.solver.objective_value)

    @property
    def best_bound(self) -> float:
        """The proved lower bound on the (minimised) objective."""
        return float(self.solver.best_objective_bound)

    @property
    def deterministic_time_s(self) -> float:
        """CP-SAT's deterministic time spent (work, not wall-clock)."""
        return float(self.solver.deterministic_time)

    def value(self, expr: Any) -> int:
        return int(self.solver.value(expr))


def configured_solver(params: SolverParams) -> cp_model.CpSolver:
    """A CP-SAT solver set up as ``params`` say."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(MIN_TIME_LIMIT_S, float(params.time_limit_s))
    solver.parameters.num_workers = max(1, int(params.num_workers))
    solver.parameters.random_seed = int(params.random_seed)
    if params.deterministic:
        solver.parameters.interleave_search = True
    if params.deterministic_time_s is not None:
        solver.parameters.max_deterministic_time = max(MIN_TIME_LIMIT_S, float(params.deterministic_time_s))
    if params.relative_gap_limit is not None:
        solver.parameters.relative_gap_limit = float(params.relative_gap_limit)
    if params.skip_inclusion_presolve:
        solver.parameters.presolve_inclusion_work_limit = 0
    return solver


def solve(model: cp_model.CpModel, params: SolverParams) -> Solution:
    """Solve ``model`` under ``params``."""
    solver = configured_solver(params)
    status = solver.solve(model)
    return Solution(status=solver.status_name(status), solver=solver)
