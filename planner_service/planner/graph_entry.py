"""Dispatch of operator-graph models to the op-level search (``graph_search``)."""

from __future__ import annotations

from planner_service.requests import PlanRequest


def plan_graph_request(request: PlanRequest, settings):
    from cost_model.errors import InvalidModel

    try:
        from .graph_search import plan_graph
    except ImportError as exc:  # pragma: no cover - the graph search ships with the package
        raise InvalidModel(f"operator-graph planning is unavailable: {exc}", field="model.graph") from None
    return plan_graph(
        request.model,
        request.training,
        request.cluster,
        request.constraints,
        request.top_k,
        max(settings.time_limit_s, settings.graph_time_limit_s),
        settings.num_workers,
    )
