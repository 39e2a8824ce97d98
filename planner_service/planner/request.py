"""Request parsing: v1 JSON bodies → frozen domain objects.

One validation path for the HTTP API, the CLI and batch files.  Every error is a typed
:class:`cost_model.errors.PlannerError` naming the field.  Pydantic models in
``planner_service.api.schemas`` only describe shapes for OpenAPI; the rules live here and in
``cost_model``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cost_model.cluster import Cluster, cluster_from_dict
from cost_model.devices import catalog_id
from cost_model.errors import InvalidInput, InvalidStrategy, PlannerError
from cost_model.frameworks import canonical_recompute_modules
from cost_model.strategy import INT_FIELDS, RECOMPUTE, SPLIT_FLAGS, Strategy, strategy_from_dict
from cost_model.training import Training, training_from_dict
from cost_model.transformer.spec import model_from_dict

OBJECTIVES = ("throughput", "cost", "time_to_train")
TIGHT_MEMORY = ("rank_after_safe", "by_objective", "reject", "reject_unlikely")
#: Headroom of operator-graph plans when the request gives none.
GRAPH_DEFAULT_HEADROOM = 0.1
PINNABLE = INT_FIELDS + ("sequence_parallel", "recompute", "recompute_num_layers", "recompute_method", "recompute_modules", "zero_stage",
                         "dp_shard", "etp", "layers_per_stage") + SPLIT_FLAGS

#: Top-level fields of a plan request: what is planned, and (``RUN_OPTIONS``) how the service runs it.
PLAN_FIELDS = ("model", "training", "cluster", "constraints", "objective", "top_k", "profile_id")
#: ``POST /v1/plans`` options that say how the service stores or queues the plan, not what it is.
RUN_OPTIONS = ("async", "force", "callback_url")
ESTIMATE_FIELDS = ("model", "training", "cluster", "strategy", "profile_id")
#: What the service itself writes into the canonical request it stores (and parses again): the
#: version of the cluster's calibration from observed runs that the plan was costed at.
STORED_FIELDS = ("calibration_version",)
#: The fields a plan request may carry through the service (``PlanService.parse``), not elsewhere.
SERVICE_FIELDS = RUN_OPTIONS + STORED_FIELDS

ModelResolver = Callable[[str], Mapping[str, Any]]
ClusterResolver = Callable[[str], Mapping[str, Any]]


@dataclass(frozen=True)
class Constraints:
    pinned: Mapping[str, Any] = field(default_factory=dict)
    max_tp: int | None = None
    max_pp: int | None = None
    #: Fraction of each device's memory kept free.  None: none for transformer models (the
    #: predicted peak's p10–p90 interval is the margin, :mod:`cost_model.transformer.memory`),
    #: ``GRAPH_DEFAULT_HEADROOM`` for operator graphs (their peaks carry no interval).
    memory_headroom_fraction: float | None = None
    allowed_device_types: tuple[str, ...] | None = None
    max_devices: int | None = None
    #: Candidates whose p90 peak exceeds usable memory: ``rank_after_safe`` (kept, flagged,
    #: after every safe one; with none safe, those whose predicted peak exceeds usable memory
    #: after those whose predicted peak is within it; with none of those, the one that needs the
    #: least memory the first alternative), ``by_objective`` (kept, flagged, ranked
    #: by the objective alone), ``reject`` (only safe plans) or ``reject_unlikely`` (only those
    #: whose predicted peak is within usable memory).
    tight_memory: str = "rank_after_safe"

    def headroom(self, graph: bool = False) -> float:
        """The headroom in force for a transformer (``graph=False``) or operator-graph model."""
        if self.memory_headroom_fraction is not None:
            return self.memory_headroom_fraction
        return GRAPH_DEFAULT_HEADROOM if graph else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **dict(self.pinned),
            "max_tp": self.max_tp,
            "max_pp": self.max_pp,
            "memory_headroom_fraction": self.memory_headroom_fraction,
            "allowed_device_types": list(self.allowed_device_types) if self.allowed_device_types else None,
            "max_devices": self.max_devices,
            **({"tight_memory": self.tight_memory} if self.tight_memory != "rank_after_safe" else {}),
        }


@dataclass(frozen=True)
class PlanRequest:
    model: Any  # TransformerSpec or GraphSpec
    training: Training
    cluster: Cluster
    constraints: Constraints = field(default_factory=Constraints)
    objective: str = "throughput"
    top_k: int = 3
    profile_id: str | None = None
    #: Widen the answers' step-time intervals over the single-source constants' priors
    #: (``cost_model.estimate.with_single_source_spread``); off when the cluster's own
    #: calibration from observed runs gives the interval (``service.observed.calibrated_request``).
    spread_single_source: bool = True


@dataclass(frozen=True)
class EstimateRequest:
    model: Any
    training: Training
    cluster: Cluster
    strategy: Strategy
    profile_id: str | None = None


def unknown_field_message(name: str, plan: bool) -> str:
    """What a top-level field a plan (``plan``) or estimate request does not have is told — by
    the parser here and by the HTTP schema's refusal (``api.errors``) alike."""
    if plan and name == "strategy":
        return 'is not a field of a plan request: a plan pins strategy fields under constraints (e.g. {"constraints": {"tp": 8, "pp": 4}})'
    if plan and name in RUN_OPTIONS:
        return "is an option of POST /v1/plans (how the service stores or queues a plan); a plan made here is neither stored nor queued"
    return f"is not a known field; a {'plan' if plan else 'estimate'} request has {', '.join(PLAN_FIELDS if plan else ESTIMATE_FIELDS)}"


def _known_fields_only(body: Mapping[str, Any], known: tuple[str, ...], plan: bool) -> None:
    """Refuse a top-level field the request does not have, naming it: a field the parser does not
    read would otherwise be dropped without a word (a ``strategy`` copied from an estimate into a
    plan request would leave every knob it pins to the search)."""
    for key in body:
        if key not in known:
            raise InvalidInput(unknown_field_message(str(key), plan), field=str(key))


def _require(body: Mapping[str, Any], key: str) -> Any:
    if key not in body:
        raise InvalidInput("is required", field=key)
    return body[key]


def parse_model(value: Any, resolve_model: ModelResolver | None = None) -> Any:
    if isinstance(value, Mapping) and "model_id" in value:
        if resolve_model is None:
            raise InvalidInput("stored models (model_id) are only available through the service", field="model.model_id")
        stored = resolve_model(value["model_id"])
        return model_from_dict({"graph": stored, **({"name": value["name"]} if "name" in value else {})})
    return model_from_dict(value, "model")


def parse_cluster(value: Any, resolve_cluster: ClusterResolver | None = None) -> Cluster:
    if isinstance(value, str):
        if resolve_cluster is None:
            raise InvalidInput("saved clusters are only available through the service", field="cluster")
        return cluster_from_dict(resolve_cluster(value), "cluster", strict=False)  # saved: refused fields are checked on saving
    return cluster_from_dict(value, "cluster")


def parse_constraints(value: Any) -> Constraints:
    if value is None:
        return Constraints()
    if not isinstance(value, Mapping):
        raise InvalidInput("must be an object", field="constraints")
    known = set(PINNABLE) | {"max_tp", "max_pp", "memory_headroom_fraction", "allowed_device_types", "max_devices", "tight_memory"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise InvalidInput(f"unknown constraint {unknown[0]!r}; allowed: {', '.join(sorted(known))}", field=f"constraints.{unknown[0]}")
    pins_in = {k: value[k] for k in PINNABLE if k in value and value[k] is not None}
    # Reuse the strategy parser for types and ranges of pinned fields.
    parsed = strategy_from_dict(pins_in, "constraints")
    pins = dict(pins_in)
    if "recompute_method" in pins:  # one spelling (normalize_recompute_method): uniform groups of 2 or more layers alone
        if pins.get("recompute", "full") != "full":
            raise InvalidStrategy(f"recompute_method {pins['recompute_method']} is a full recompute's method (pinned recompute {pins['recompute']!r})",
                                  field="constraints.recompute_method")
        pins["recompute"] = "full"
        for key in ("recompute_method", "recompute_num_layers"):  # as strategy_from_dict normalised them; unset ones left out
            pins.pop(key, None)
            if getattr(parsed, key):
                pins[key] = getattr(parsed, key)
    if "layers_per_stage" in pins:
        pins["layers_per_stage"] = tuple(pins["layers_per_stage"])
    if "recompute_modules" in pins:  # one spelling: Megatron-Core's order, the default alone as ()
        pins["recompute_modules"] = canonical_recompute_modules(tuple(pins["recompute_modules"]))
    out: dict[str, Any] = {"pinned": pins}
    for key in ("max_tp", "max_pp", "max_devices"):
        v = value.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInput(f"must be a positive integer, got {v!r}", field=f"constraints.{key}")
            out[key] = v
    h = value.get("memory_headroom_fraction")
    if h is not None:
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h <= 0.9:
            raise InvalidInput(f"must be a number in [0, 0.9], got {h!r}", field="constraints.memory_headroom_fraction")
        out["memory_headroom_fraction"] = float(h)
    tm = value.get("tight_memory")
    if tm is not None:
        if tm not in TIGHT_MEMORY:
            raise InvalidInput(f"must be one of {', '.join(TIGHT_MEMORY)}, got {tm!r}", field="constraints.tight_memory")
        out["tight_memory"] = tm
    a = value.get("allowed_device_types")
    if a is not None:
        if not isinstance(a, list) or not a or not all(isinstance(x, str) for x in a):
            raise InvalidInput("must be a non-empty list of device names", field="constraints.allowed_device_types")
        # a catalog device by any of its names (cost_model.devices.catalog_id); an inline device's name as given
        out["allowed_device_types"] = tuple(dict.fromkeys(catalog_id(x) or x for x in a))
    return Constraints(**out)


def parse_plan_request(
    body: Mapping[str, Any],
    resolve_model: ModelResolver | None = None,
    resolve_cluster: ClusterResolver | None = None,
    service_fields: tuple[str, ...] = (),
) -> PlanRequest:
    """A plan request; ``service_fields``: those of :data:`SERVICE_FIELDS` the caller (the
    service) reads itself and the body may therefore carry."""
    if not isinstance(body, Mapping):
        raise InvalidInput("the request body must be a JSON object", field="body")
    _known_fields_only(body, PLAN_FIELDS + service_fields, plan=True)
    model = parse_model(_require(body, "model"), resolve_model)
    training = training_from_dict(_require(body, "training"))
    cluster = parse_cluster(_require(body, "cluster"), resolve_cluster)
    constraints = parse_constraints(body.get("constraints"))
    objective = body.get("objective", "throughput")
    if objective not in OBJECTIVES:
        raise InvalidInput(f"must be one of {', '.join(OBJECTIVES)}, got {objective!r}", field="objective")
    if objective == "time_to_train" and training.total_tokens is None:
        raise InvalidInput("objective time_to_train needs training.total_tokens", field="training.total_tokens")
    if objective == "cost" and any(g.price_per_gpu_hour is None for g in cluster.node_groups):
        raise InvalidInput(
            "objective cost needs price_per_gpu_hour on every node group", field="cluster.node_groups"
        )
    top_k = body.get("top_k", 3)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= 50:
        raise InvalidInput(f"must be an integer in [0, 50], got {top_k!r}", field="top_k")
    if constraints.allowed_device_types:
        known = {g.device.name for g in cluster.node_groups}
        bad = [d for d in constraints.allowed_device_types if d not in known]
        if bad:
            raise InvalidInput(
                f"device type {bad[0]!r} is not in the cluster (has {', '.join(sorted(known))})",
                field="constraints.allowed_device_types",
            )
    profile_id = body.get("profile_id")
    if profile_id is not None and not isinstance(profile_id, str):
        raise InvalidInput("must be a string", field="profile_id")
    return PlanRequest(model, training, cluster, constraints, objective, top_k, profile_id)


def parse_estimate_request(
    body: Mapping[str, Any],
    resolve_model: ModelResolver | None = None,
    resolve_cluster: ClusterResolver | None = None,
) -> EstimateRequest:
    if not isinstance(body, Mapping):
        raise InvalidInput("the request body must be a JSON object", field="body")
    _known_fields_only(body, ESTIMATE_FIELDS, plan=False)
    model = parse_model(_require(body, "model"), resolve_model)
    training = training_from_dict(_require(body, "training"))
    cluster = parse_cluster(_require(body, "cluster"), resolve_cluster)
    strategy = strategy_from_dict(_require(body, "strategy"))
    profile_id = body.get("profile_id")
    if profile_id is not None and not isinstance(profile_id, str):
        raise InvalidInput("must be a string", field="profile_id")
    return EstimateRequest(model, training, cluster, strategy, profile_id)


__all__ = [
    "ESTIMATE_FIELDS",
    "OBJECTIVES",
    "PLAN_FIELDS",
    "RECOMPUTE",
    "RUN_OPTIONS",
    "SERVICE_FIELDS",
    "Constraints",
    "EstimateRequest",
    "PlanRequest",
    "parse_constraints",
    "parse_estimate_request",
    "parse_plan_request",
    "unknown_field_message",
]


# ---- how the search may run ---------------------------------------------------------------


@dataclass(frozen=True)
class SolverSettings:
    time_limit_s: float = 2.0
    num_workers: int = 2
    max_refinements: int = 200


class SearchCancelled(PlannerError):
    code = "cancelled"
