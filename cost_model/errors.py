"""Typed domain errors.

Every error carries a machine-readable ``code``, the request ``field`` it is about (a dotted
path such as ``strategy.tp`` or ``model.transformer.hidden_size``) and a human ``message`` that
names the rule and the numbers.  The HTTP layer maps the classes to status codes in one place
(``planner_service.api.errors``); the CLI prints them.  Nothing here knows about HTTP.
"""

from __future__ import annotations

from typing import Any


class PlannerError(Exception):
    """Base class of every error the planner reports to a user."""

    code = "planner_error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "field": self.field}

    def __str__(self) -> str:  # pragma: no cover - trivial
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidInput(PlannerError):
    """The request is well-formed JSON but a value breaks a rule (HTTP 422)."""

    code = "invalid_input"


class InvalidModel(InvalidInput):
    code = "invalid_model"


class InvalidCluster(InvalidInput):
    code = "invalid_cluster"


class InvalidTraining(InvalidInput):
    code = "invalid_training"


class InvalidStrategy(InvalidInput):
    code = "invalid_strategy"


class InvalidProfile(InvalidInput):
    code = "invalid_profile"


class InvalidGraph(InvalidModel):
    code = "invalid_graph"


class UnknownName(InvalidInput):
    """A catalog name (device, preset, saved cluster, model id) that does not exist."""

    code = "unknown_name"


class NoFeasiblePlan(PlannerError):
    """The search space is empty under the constraints: the message says what is short."""

    code = "no_feasible_plan"
