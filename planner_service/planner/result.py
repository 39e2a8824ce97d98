"""The planner's answer, one type for both model families.

Both searches (``planner.transformer.search`` and ``planner.graph.search``) return a
:class:`PlanResult`: the best :class:`Evaluated` candidate and the alternatives, each with its
strategy, the node group of every stage, the cost model's prediction and the objective the search
ranked it by; the search statistics; warnings; and the cluster the ranks refer to.  Its
:meth:`PlanResult.to_dict` is the plan JSON of contract v1 — every entry with ``strategy``,
``prediction``, ``stages`` and ``ranks``, an ``explanation`` of the same shape for both families —
so the service, the exporters, the page and replan treat both alike.

A model family adds its own keys by subclassing :class:`Evaluated` (the operator graph adds its
op shardings and parameter servers: ``planner.graph.describe``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cost_model.cluster import Cluster
from cost_model.result import Estimate
from cost_model.spec import ModelSpec
from cost_model.strategy import Strategy
from cost_model.topology import MEGATRON_NESTING
from planner_service.planner.explain import explain
from planner_service.planner.nesting import boundary_report, explain_nesting
from planner_service.planner.placement import place_ranks, rank_columns, stage_entries


@dataclass(frozen=True, kw_only=True)
class Evaluated:
    """One fully evaluated plan candidate (exact prediction from the cost model)."""

    strategy: Strategy
    stage_groups: tuple[str, ...]  # the node group (pool) of each pipeline stage
    prediction: Estimate
    objective: float  # what the search minimised (step time in s, or USD per million tokens)

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.device for s in self.prediction.stages))

    def strategy_entry(self) -> dict[str, Any]:
        """Contract ``strategy``."""
        return self.strategy.to_dict()

    def stage_entries(self, cluster: Cluster) -> list[dict[str, Any]]:
        """Contract ``stages``: layer range, device type, hosts and GPUs, time and memory."""
        return stage_entries(cluster, self.strategy, self.stage_groups, self.prediction)

    def rank_entries(self, cluster: Cluster) -> list[dict[str, Any]]:
        """Contract ``ranks``: host and GPU of every global rank."""
        return place_ranks(cluster, self.strategy, self.stage_groups)

    def rank_columns(self, cluster: Cluster) -> dict[str, Any] | None:
        """:meth:`rank_entries` as columns (``placement.rank_columns``), where placement gives them."""
        return rank_columns(cluster, self.strategy, self.stage_groups)

    def with_stages(self, cluster: Cluster, entry: Mapping[str, Any]) -> dict[str, Any]:
        """``entry`` (this candidate's :meth:`to_entry` without stages) with its ``stages``, in
        the place :meth:`to_entry` puts them."""
        out = {k: entry[k] for k in ("strategy", "prediction")}
        out["stages"] = self.stage_entries(cluster)
        out.update((k, v) for k, v in entry.items() if k not in out)
        return out

    def extra_entries(self) -> dict[str, Any]:
        """Keys a model family adds to the entry (none for transformers)."""
        return {}

    def explanation_details(self) -> dict[str, Any]:
        """Keys a model family adds to the explanation of this entry as the best plan (none for
        transformers)."""
        return {}

    def to_entry(self, cluster: Cluster, with_ranks: bool = True, with_stages: bool = True) -> dict[str, Any]:
        """The contract entry; ``with_stages=False`` leaves ``stages`` out (:meth:`with_stages`
        adds them in their place)."""
        out: dict[str, Any] = {"strategy": self.strategy_entry(), "prediction": self.prediction.to_dict()}
        if with_stages:
            out["stages"] = self.stage_entries(cluster)
        boundaries = boundary_report(cluster, self.strategy, self.stage_groups)
        if boundaries is not None:
            out["topology"] = {"nesting": list(self.strategy.nesting or MEGATRON_NESTING), "boundaries": boundaries}
        if with_ranks:
            out["ranks"] = self.rank_entries(cluster)
        out.update(self.extra_entries())
        return out


def gpus_per_node(cluster: Cluster) -> int:
    """GPUs per node the explanation compares tensor parallelism with (the smallest GPU node;
    CPU parameter-server nodes do not count)."""
    gpu = [g.gpus_per_node for g in cluster.node_groups if g.device.kind != "cpu"]
    return min(gpu or [g.gpus_per_node for g in cluster.node_groups])


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    best: Evaluated
    alternatives: Sequence[Evaluated]
    search: dict[str, Any]  # statistics: candidates, pruned, solver_status, wall_time_s, ...
    warnings: list[str]
    cluster: Cluster  # the cluster the ranks refer to (the transformer search normalises it)
    model: ModelSpec
    objective: str
    extra: dict[str, Any] = field(default_factory=dict)
    #: What the search noticed on the way (left-out node groups, pins that leave nothing, ...).
    notes: list[str] = field(default_factory=list)
    #: On a cluster with a topology: the best layout under each nesting order
    #: (``planner.nesting.nesting_comparison``), for the explanation.
    nesting: list[dict[str, Any]] = field(default_factory=list)

    @property
    def best_tokens_per_s(self) -> float:
        return self.best.prediction.tokens_per_s

    @property
    def best_step_time_s(self) -> float:
        return self.best.prediction.step_time_s

    @property
    def best_mfu(self) -> float:
        return self.best.prediction.mfu

    @property
    def device_types(self) -> tuple[str, ...]:
        return self.best.device_types

    @property
    def num_devices(self) -> int:
        return self.best.prediction.num_devices

    def entries(self) -> list[Evaluated]:
        """The best, then the alternatives in order (the order of :meth:`to_dict`)."""
        return [self.best, *self.alternatives]

    def entry_ranks(self, index: int) -> list[dict[str, Any]]:
        """The ``ranks`` of entry ``index`` of :meth:`to_dict` (0: the best, then the
        alternatives in order)."""
        return self.entries()[index].rank_entries(self.cluster)

    def entry_rank_columns(self, index: int) -> dict[str, Any] | None:
        """The ``ranks`` of entry ``index`` as columns (None where placement gives no columns:
        use :meth:`entry_ranks`)."""
        return self.entries()[index].rank_columns(self.cluster)

    def objective_report(self) -> dict[str, Any]:
        """The objective the search minimised and the best plan's value of it."""
        p = self.best.prediction
        out: dict[str, Any] = {"name": self.objective}
        if self.objective == "cost":
            out.update(value=self.best.objective, unit="USD per million tokens")
        elif self.objective == "time_to_train" and self.extra.get("total_tokens"):
            out.update(value=self.extra["total_tokens"] / p.tokens_per_s, unit="s")
        else:
            out.update(value=p.step_time_s, unit="s per step")
        return out

    def explain(self, best: dict[str, Any], alternatives: Sequence[dict[str, Any]], best_index: int = 0) -> dict[str, Any]:
        """The explanation of the plan entry ``best`` (entry ``best_index`` of :meth:`to_dict`)
        over ``alternatives``: bottleneck, headroom, why each alternative lost, the model
        family's details and the search's notes."""
        details = self.entries()[best_index].explanation_details()
        out = {**explain(best, alternatives, gpus_per_node(self.cluster)), **details, "notes": list(self.notes)}
        placement = explain_nesting(self.nesting) if best_index == 0 else None
        if placement:
            out["placement"] = placement
        return out

    def entry_with_stages(self, index: int, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Entry ``index`` of :meth:`to_dict` built with ``stages=False`` (``entry``), with its
        ``stages`` added."""
        return self.entries()[index].with_stages(self.cluster, entry)

    def to_dict(self, alternative_ranks: bool = True, best_ranks: bool = True, stages: bool = True) -> dict[str, Any]:
        """The result as plan JSON.  ``alternative_ranks=False`` leaves ``ranks`` out of the
        alternatives (a replan adds them, with :meth:`entry_ranks`, to the ones it needs);
        ``best_ranks=False`` out of the best entry (the service adds them as columns).
        ``stages=False`` leaves every entry's ``stages`` out, and with them the explanation
        (``None``; it compares the stages' devices): a replan builds both, with
        :meth:`entry_with_stages` and :meth:`explain`, for the entries it keeps only (98,304
        ranks' stages cost ~15 ms per candidate, and a replan weighs twice as many as it keeps)."""
        best = self.best.to_entry(self.cluster, best_ranks, stages)
        alternatives = [a.to_entry(self.cluster, alternative_ranks, stages) for a in self.alternatives]
        return {
            "objective_value": self.objective_report(),
            "best": best,
            "alternatives": alternatives,
            "search": dict(self.search),
            "explanation": self.explain(best, alternatives) if stages else None,
            "warnings": list(self.warnings),
        }
