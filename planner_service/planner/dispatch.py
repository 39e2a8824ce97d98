"""The planner's entry point: one request in, one :class:`PlanResult` out, for either model family.

A transformer spec goes to the layer-level search (``planner.transformer.search``), an operator
graph to the op-level search (``planner.graph.search``).  Both take the parsed request and the
solver settings and return the same result type (``planner.result``).
"""

from __future__ import annotations

from collections.abc import Callable

from cost_model.graph.ir import GraphSpec
from cost_model.transformer.spec import TransformerSpec
from planner_service.planner.graph.search import search_graph
from planner_service.planner.request import PlanRequest, SolverSettings
from planner_service.planner.result import PlanResult
from planner_service.planner.transformer.search import (
    search_transformer,
    transformer_search_size,
)

#: Candidate strategies an operator graph's search weighs per op (the graph search enumerates
#: about this many layouts per operator); used only to decide sync vs async.
GRAPH_CANDIDATES_PER_OP = 8


def plan(
    request: PlanRequest,
    settings: SolverSettings | None = None,
    progress: Callable[[float], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> PlanResult:
    """Search for the best plan of ``request`` (raises a typed :class:`PlannerError`)."""
    settings = settings or SolverSettings()
    if isinstance(request.model, TransformerSpec):
        return search_transformer(request, settings, progress, should_cancel)
    if not isinstance(request.model, GraphSpec):
        raise TypeError(f"no planner for a {type(request.model).__name__}")
    return search_graph(request, settings)


def search_size(request: PlanRequest) -> int:
    """Number of candidates the search would weigh (cheap; decides sync vs async)."""
    if isinstance(request.model, TransformerSpec):
        return transformer_search_size(request)
    if not isinstance(request.model, GraphSpec):
        raise TypeError(f"no planner for a {type(request.model).__name__}")
    return len(request.model.ops) * GRAPH_CANDIDATES_PER_OP
