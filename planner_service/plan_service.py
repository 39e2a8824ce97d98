"""The plan service: what the HTTP routes and the job worker do, without HTTP.

* Canonical request and its hash (identity of a plan request).
* Synchronous planning with de-duplication (insert-or-fetch in the repository).
* Jobs for large or ``async`` searches.
* Replanning after a cluster change, preferring among near-best plans the one that moves the
  fewest ranks, and the diff against the parent plan.
* Estimates.

No global state: one :class:`PlanService` per app / worker process, built from settings and a
repository.  The planner function is injectable (tests use a slow or failing one); production
uses :func:`planner_service.planner.plan`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from cost_model.errors import InvalidInput, NotFound, PlannerError, UnknownName
from planner_service.requests import PlanRequest, parse_cluster, parse_estimate_request, parse_plan_request
from planner_service.settings import ServiceSettings
from planner_service.storage.repository import NewPlan, Repository, StoredJob, StoredPlan

log = logging.getLogger("planner.service")

#: Keys of a plan request that do not change the answer (excluded from the request hash).
NON_IDENTITY_KEYS = ("async", "force", "callback_url")
#: A replan keeps the candidate that moves the fewest ranks among those within this fraction of
#: the best candidate's throughput.
REPLAN_TOLERANCE = 0.02
#: A replan asks the planner for at least this many alternatives to choose among.
REPLAN_MIN_TOP_K = 8

PlanFn = Callable[..., Any]
ProgressFn = Callable[[float], None]
CancelFn = Callable[[], bool]


class JobCancelled(Exception):
    """Raised inside a job when its cancel was requested."""


@dataclass(frozen=True)
class Outcome:
    """What a POST produced: ``created`` (201), ``existing`` (200) or ``job`` (202)."""

    kind: str
    plan: StoredPlan | None = None
    job: StoredJob | None = None


# --------------------------------------------------------------------------------------------
# JSON hygiene and canonical form
# --------------------------------------------------------------------------------------------


def to_json_safe(value: Any) -> Any:
    """Plain JSON types only: numpy scalars → Python, tuples → lists, NaN/±inf → None (neither
    PostgreSQL's json type nor strict JSON parsers accept them)."""
    # Exact built-in types first: a plan holds ~10^5 values (a rank entry per GPU), and the
    # generic checks below (``isinstance(…, Mapping)``) cost several times more per value.
    kind = type(value)
    if kind is dict:
        return {k if type(k) is str else str(k): to_json_safe(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [to_json_safe(v) for v in value]
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    tolist = getattr(value, "tolist", None)  # numpy scalar or array
    if callable(tolist):
        return to_json_safe(tolist())
    if hasattr(value, "to_dict"):
        return to_json_safe(value.to_dict())
    return str(value)


def _canonical_model(model: Any) -> Any:
    if isinstance(model, Mapping) and isinstance(model.get("preset"), str):
        return {**model, "preset": model["preset"].lower()}
    return model


def canonical_request(body: Mapping[str, Any], req: PlanRequest) -> dict[str, Any]:
    """The request as it is planned: the model as given (preset names lower-cased), training,
    cluster and constraints with every default filled in (a saved cluster's name replaced by its
    body), objective, top_k, profile_id.  ``async``, ``force`` and ``callback_url`` are not part
    of it.  It parses back to the same :class:`PlanRequest` and hash."""
    return to_json_safe(
        {
            "model": _canonical_model(body["model"]),
            "training": req.training.to_dict(),
            "cluster": req.cluster.to_dict(),
            "constraints": req.constraints.to_dict(),
            "objective": req.objective,
            "top_k": req.top_k,
            "profile_id": req.profile_id,
        }
    )


def request_hash(canonical: Mapping[str, Any]) -> str:
    """SHA-256 of the sorted-key, whitespace-free JSON of the canonical request."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Result helpers
# --------------------------------------------------------------------------------------------


def plan_status(solver_status: Any) -> str:
    """Plan status from the solver's: ``optimal`` when the search proved its answer optimal,
    otherwise ``feasible`` (e.g. the time limit stopped the solver with a good plan)."""
    s = str(solver_status or "").lower()
    return "optimal" if s in ("optimal", "exhaustive", "proved_optimal") else "feasible"


def _rank_places(ranks: Any) -> dict[int, tuple[Any, Any]]:
    """rank → (host, gpu) from a plan's ``ranks`` list."""
    out: dict[int, tuple[Any, Any]] = {}
    if not isinstance(ranks, list):
        return out
    for i, r in enumerate(ranks):
        if not isinstance(r, Mapping):
            continue
        rank = r.get("rank", i)
        host = r.get("host", r.get("hostname"))
        gpu = r.get("gpu", r.get("local_rank", r.get("device_index")))
        out[int(rank)] = (host, gpu)
    return out


def ranks_moved(old_ranks: Any, new_ranks: Any) -> int:
    """Ranks whose (host, gpu) changed; a rank present in only one plan counts as moved."""
    return _moved(_rank_places(old_ranks), _rank_places(new_ranks))


def _moved(old: Mapping[int, tuple[Any, Any]], new: Mapping[int, tuple[Any, Any]]) -> int:
    return sum(1 for r in old.keys() | new.keys() if old.get(r) != new.get(r))


def _tokens_per_s(candidate: Mapping[str, Any]) -> float:
    v = (candidate.get("prediction") or {}).get("tokens_per_s")
    return float(v) if isinstance(v, (int, float)) else 0.0


def _candidate_score(candidate: Mapping[str, Any], objective: str) -> float:
    """Higher is better.  Throughput and time-to-train: tokens/s.  Cost: tokens per GPU-second
    (a price-independent proxy; the planner already ranked by price)."""
    tps = _tokens_per_s(candidate)
    if objective == "cost":
        n = len(candidate.get("ranks") or []) or (candidate.get("prediction") or {}).get("num_devices") or 1
        return tps / n
    return tps


def choose_stable(
    result: Mapping[str, Any],
    parent_best: Mapping[str, Any],
    objective: str,
    ranks_of: Callable[[int], list] | None = None,
) -> tuple[dict, list[dict], int]:
    """Among the best candidate and its alternatives, those within :data:`REPLAN_TOLERANCE` of
    the best score; of those, the one that moves the fewest ranks relative to ``parent_best``
    (ties: higher score, then the planner's order).  Returns (chosen, the others, how many were
    within tolerance).

    A candidate may come without ``ranks`` (the planner leaves them out of alternatives a
    replan may not need): ``ranks_of(i)`` gives those of candidate i (0: the best, then the
    alternatives) and is called only for the candidates within tolerance, which get them added."""
    candidates = [result["best"], *list(result.get("alternatives") or [])]
    top = max(_candidate_score(c, objective) for c in candidates)
    near = [
        (i, c)
        for i, c in enumerate(candidates)
        if _candidate_score(c, objective) >= top * (1.0 - REPLAN_TOLERANCE)
    ]
    if ranks_of is not None:
        for i, c in near:
            if "ranks" not in c:
                c["ranks"] = ranks_of(i)
    parent_places = _rank_places(parent_best.get("ranks"))
    i_best, chosen = min(
        near, key=lambda ic: (_moved(parent_places, _rank_places(ic[1].get("ranks"))), -_candidate_score(ic[1], objective), ic[0])
    )
    others = [c for i, c in enumerate(candidates) if i != i_best]
    return chosen, others, len(near)


def plan_diff(parent: StoredPlan, chosen: Mapping[str, Any], selected_from: int, chosen_index_is_best: bool) -> dict[str, Any]:
    old_best = parent.result.get("best") or {}
    old_s = old_best.get("strategy") or {}
    new_s = chosen.get("strategy") or {}
    changes = {
        k: {"from": old_s.get(k), "to": new_s.get(k)} for k in sorted(set(old_s) | set(new_s)) if old_s.get(k) != new_s.get(k)
    }
    before = _tokens_per_s(old_best)
    after = _tokens_per_s(chosen)
    old_pred = old_best.get("prediction") or {}
    new_pred = chosen.get("prediction") or {}
    return {
        "parent_id": parent.id,
        "strategy_changed": bool(changes),
        "strategy_changes": changes,
        "ranks_moved": ranks_moved(old_best.get("ranks"), chosen.get("ranks")),
        "ranks_before": len(old_best.get("ranks") or []),
        "ranks_after": len(chosen.get("ranks") or []),
        "tokens_per_s_before": before,
        "tokens_per_s_after": after,
        "tokens_per_s_change": after - before,
        "tokens_per_s_change_fraction": (after - before) / before if before else None,
        "step_time_s_before": old_pred.get("step_time_s"),
        "step_time_s_after": new_pred.get("step_time_s"),
        "candidates_within_tolerance": selected_from,
        "tolerance_fraction": REPLAN_TOLERANCE,
        "selected": "best" if chosen_index_is_best else "fewest_ranks_moved",
    }


def _model_params(model: Any) -> int | None:
    for attr in ("total_params", "num_params", "params"):
        v = getattr(model, attr, None)
        if callable(v):
            try:
                v = v()
            except Exception:  # noqa: BLE001 - informative field only
                v = None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return None


def plan_to_api(p: StoredPlan) -> dict[str, Any]:
    """The plan JSON of contract v1."""
    r = p.result
    q = p.request
    out = {
        "id": p.id,
        "status": p.status,
        "request_hash": p.request_hash,
        "revision": p.revision,
        "created_at": p.to_dict()["created_at"],
        "parent_id": p.parent_id,
        "model": {"name": p.model_name, "params": p.model_params, "spec": q.get("model")},
        "cluster": q.get("cluster"),
        "training": q.get("training"),
        "constraints": q.get("constraints"),
        "objective": p.objective,
        "top_k": q.get("top_k"),
        "profile_id": q.get("profile_id"),
        "summary": {
            "device_types": list(p.device_types),
            "num_devices": p.num_devices,
            "step_time_s": p.step_time_s,
            "tokens_per_s": p.tokens_per_s,
            "mfu": p.mfu,
        },
        "best": r.get("best"),
        "alternatives": r.get("alternatives", []),
        "search": r.get("search"),
        "explanation": r.get("explanation"),
        "warnings": r.get("warnings", []),
    }
    if "diff" in r:
        out["diff"] = r["diff"]
    return out


# --------------------------------------------------------------------------------------------
# Replan cluster edits
# --------------------------------------------------------------------------------------------


def apply_cluster_changes(base: Mapping[str, Any], unavailable: list[Any] | None, added: list[Any] | None) -> dict[str, Any]:
    """A cluster dict with ``added`` nodes appended to their groups and ``unavailable`` hosts
    marked down.  Errors name the offending list entry."""
    cluster = copy.deepcopy(dict(base))
    groups = cluster.get("node_groups")
    if not isinstance(groups, list):
        raise InvalidInput("must be a non-empty list of node groups", field="cluster.node_groups")
    by_name: dict[str, dict] = {}
    hosts: dict[str, str] = {}
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise InvalidInput("must be an object", field=f"cluster.node_groups[{i}]")
        name = g.get("name", f"group{i}")
        g["name"] = name
        count = g.get("count")
        if not g.get("hostnames") and isinstance(count, int):
            g["hostnames"] = [f"{name}-{k}" for k in range(count)]
        by_name[name] = g
        for h in g.get("hostnames") or []:
            hosts[h] = name
    nodes = cluster.get("nodes") or [{"hostname": h, "group": grp, "available": True} for h, grp in hosts.items()]
    if not isinstance(nodes, list):
        raise InvalidInput("must be a list", field="cluster.nodes")
    for i, n in enumerate(added or []):
        path = f"added_nodes[{i}]"
        if not isinstance(n, Mapping):
            raise InvalidInput("must be an object {hostname, group}", field=path)
        host, group = n.get("hostname"), n.get("group")
        if not isinstance(host, str) or not host:
            raise InvalidInput("must be a non-empty string", field=f"{path}.hostname")
        if host in hosts:
            raise InvalidInput(f"host {host!r} is already in the cluster", field=f"{path}.hostname")
        if not isinstance(group, str) or group not in by_name:
            raise InvalidInput(
                f"no node group {group!r}; groups: {', '.join(sorted(by_name))}", field=f"{path}.group"
            )
        g = by_name[group]
        g["hostnames"] = [*g["hostnames"], host]
        g["count"] = len(g["hostnames"])
        hosts[host] = group
        nodes.append({"hostname": host, "group": group, "available": True})
    down = set()
    for i, h in enumerate(unavailable or []):
        if not isinstance(h, str) or h not in hosts:
            raise InvalidInput(f"host {h!r} is not in the cluster", field=f"unavailable_nodes[{i}]")
        down.add(h)
    for n in nodes:
        if isinstance(n, dict) and n.get("hostname") in down:
            n["available"] = False
    cluster["nodes"] = nodes
    return cluster


def sticky_host_order(cluster: Mapping[str, Any], parent_ranks: Any) -> dict[str, Any]:
    """Reorder each node group's hostnames so that a replan places ranks where they were.

    The planner fills a pool's available nodes in hostname order, so listing the parent's hosts
    first, in the order its ranks used them, keeps an unchanged strategy on the same GPUs; a
    host that went down has its slot taken by a spare (an available host the parent did not
    use), so only the ranks of the lost node move.  Without a spare, the parent's last host
    moves into the hole rather than every later host shifting up one slot (which would move
    every rank after the lost node): the new plan runs on fewer GPUs, and the ranks it drops
    are the tail's.
    """
    out = copy.deepcopy(dict(cluster))
    order: list[str] = []
    seen: set[str] = set()
    for r in sorted((r for r in parent_ranks or [] if isinstance(r, Mapping)), key=lambda r: r.get("rank", 0)):
        h = r.get("host")
        if isinstance(h, str) and h not in seen:
            seen.add(h)
            order.append(h)
    down = {n.get("hostname") for n in out.get("nodes") or [] if isinstance(n, Mapping) and n.get("available") is False}
    for g in out.get("node_groups") or []:
        names = list(g.get("hostnames") or [])
        members = set(names)
        used = [h for h in order if h in members]
        spares = [h for h in names if h not in seen and h not in down]
        slots: list[str | None] = [(spares.pop(0) if spares else None) if h in down else h for h in used]
        while None in slots:
            hole = slots.index(None)
            while slots and slots[-1] is None:
                slots.pop()
            if hole < len(slots):
                slots[hole] = slots.pop()
        new = [h for h in slots if h is not None]
        g["hostnames"] = new + [h for h in names if h not in set(new)]
    return out


# --------------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------------


def _default_plan_fn() -> PlanFn:
    from planner_service.planner import plan

    return plan


def _default_search_size(req: PlanRequest) -> int | None:
    try:
        from planner_service.planner.search import search_size
    except ImportError:  # a planner without a size estimate: always synchronous
        return None
    try:
        return int(search_size(req))
    except PlannerError:
        raise  # a bad request: the same error the planner would give
    except Exception:  # noqa: BLE001 - a failing estimate must not fail the request
        log.warning("search_size failed; planning synchronously", exc_info=True)
        return None


class PlanService:
    def __init__(
        self,
        repo: Repository,
        settings: ServiceSettings,
        plan_fn: PlanFn | None = None,
        search_size_fn: Callable[[PlanRequest], int | None] | None = None,
        on_job_created: Callable[[], None] | None = None,
    ) -> None:
        self.repo = repo
        self.settings = settings
        self._plan_fn = plan_fn
        self._search_size_fn = search_size_fn or _default_search_size
        self._on_job_created = on_job_created

    # ---------------------------------------------------------------- resolvers
    def _resolve_cluster(self, name: str) -> Mapping[str, Any]:
        try:
            return self.repo.get_cluster(name).body
        except NotFound:
            names = [c.name for c in self.repo.list_clusters()]
            raise UnknownName(
                f"no saved cluster named {name!r}; saved clusters: {', '.join(names) or 'none'}", field="cluster"
            ) from None

    def _resolve_model(self, model_id: Any) -> Mapping[str, Any]:
        if not isinstance(model_id, str):
            raise InvalidInput("must be a model id string", field="model.model_id")
        try:
            return self.repo.get_model(model_id).graph
        except NotFound:
            raise UnknownName(f"no uploaded model with id {model_id!r}", field="model.model_id") from None

    def load_profile(self, profile_id: str | None) -> dict[str, Any] | None:
        """The stored profile document (with its id and stored fit) for cost_model."""
        if profile_id is None:
            return None
        try:
            p = self.repo.get_profile(profile_id)
        except NotFound:
            raise UnknownName(f"no profile with id {profile_id!r}", field="profile_id") from None
        doc = {**p.body, "id": p.id}
        if p.fitted:
            doc["fit"] = p.fitted
        return doc

    def parse(self, body: Mapping[str, Any]) -> PlanRequest:
        """Parse a plan request (saved clusters and uploaded models resolved)."""
        return parse_plan_request(body, resolve_model=self._resolve_model, resolve_cluster=self._resolve_cluster)

    def with_profile(self, req: PlanRequest) -> PlanRequest:
        """With ``profile_id``: the node groups of the profiled device get the profile's
        calibrated device, which the planner then costs them with."""
        if req.profile_id is None:
            return req
        from cost_model.estimate import apply_profile_to_cluster

        doc = self.load_profile(req.profile_id)
        return replace(req, cluster=apply_profile_to_cluster(req.cluster, doc, field="profile_id"))

    # ---------------------------------------------------------------- planning
    def solver_settings(self) -> Any:
        from planner_service.planner import SolverSettings

        return SolverSettings(time_limit_s=self.settings.solver_time_limit_s, num_workers=self.settings.solver_num_workers)

    def _run_planner(self, req: PlanRequest, progress: ProgressFn | None, should_cancel: CancelFn | None) -> Any:
        fn = self._plan_fn or _default_plan_fn()
        return fn(req, self.solver_settings(), progress=progress, should_cancel=should_cancel)

    def compute(
        self,
        canonical: dict[str, Any],
        parent: StoredPlan | None = None,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
    ) -> NewPlan:
        """Plan ``canonical`` (a canonical request) and build the row to store.  With ``parent``
        (a replan) the planner is asked for more alternatives and the most stable near-best
        candidate is kept, with a diff against the parent."""
        req = self.with_profile(self.parse(canonical))
        if parent is not None:
            req = replace(req, top_k=max(req.top_k, REPLAN_MIN_TOP_K))
        result = self._run_planner(req, progress, should_cancel)
        if should_cancel is not None and should_cancel():
            raise JobCancelled()
        # A replan asks for more alternatives than it keeps: their ranks (one entry per GPU) are
        # placed only for those the fewest-moves rule compares and those stored.
        entry_ranks = getattr(result, "entry_ranks", None) if parent is not None else None
        d = to_json_safe(result.to_dict(alternative_ranks=False) if entry_ranks else result.to_dict())
        stored_result = {k: d.get(k) for k in ("best", "alternatives", "search", "explanation", "warnings")}
        stored_result["alternatives"] = stored_result["alternatives"] or []
        stored_result["warnings"] = stored_result["warnings"] or []
        if parent is not None:

            def ranks_of(i: int) -> list:
                return to_json_safe(entry_ranks(i))

            chosen, others, near = choose_stable(d, parent.result.get("best") or {}, req.objective, ranks_of if entry_ranks else None)
            stored_result["best"] = chosen
            stored_result["alternatives"] = others[: canonical.get("top_k", 3)]
            if entry_ranks:
                index = {id(c): i for i, c in enumerate([d["best"], *d["alternatives"]])}
                for c in stored_result["alternatives"]:
                    if "ranks" not in c:
                        c["ranks"] = ranks_of(index[id(c)])
            stored_result["diff"] = plan_diff(parent, chosen, near, chosen is d["best"])
            if stored_result["alternatives"] and chosen.get("stages") and "prediction" in chosen:
                from planner_service.planner.explain import explain

                gpn = min(g.gpus_per_node for g in req.cluster.node_groups)
                stored_result["explanation"] = explain(chosen, stored_result["alternatives"], gpn)
        best = stored_result["best"] or {}
        pred = best.get("prediction") or {}
        device_types = tuple(getattr(result, "device_types", None) or req.cluster.device_types)
        num_devices = getattr(result, "num_devices", None) or len(best.get("ranks") or []) or req.cluster.total_gpus
        return NewPlan(
            request_hash=request_hash(canonical),
            status=plan_status((stored_result.get("search") or {}).get("solver_status")),
            objective=req.objective,
            model_name=str(getattr(req.model, "name", None) or "model"),
            model_params=_model_params(req.model),
            cluster_name=req.cluster.name,
            device_types=device_types,
            num_devices=int(num_devices),
            step_time_s=float(pred.get("step_time_s") or 0.0),
            tokens_per_s=float(pred.get("tokens_per_s") or 0.0),
            mfu=float(pred.get("mfu") or 0.0),
            strategy=best.get("strategy") or {},
            request=canonical,
            result=stored_result,
            parent_id=parent.id if parent is not None else None,
        )

    def _wants_job(self, body: Mapping[str, Any], req: PlanRequest) -> bool:
        if body.get("async"):
            return True
        size = self._search_size_fn(req)
        return size is not None and size > self.settings.sync_max_candidates

    def _enqueue(self, kind: str, canonical: dict, force: bool, parent_id: str | None, callback_url: str | None) -> StoredJob:
        job = self.repo.create_job(kind, canonical, request_hash(canonical), force=force, parent_id=parent_id, callback_url=callback_url)
        if self._on_job_created is not None:
            self._on_job_created()
        return job

    def create_plan(self, body: Mapping[str, Any]) -> Outcome:
        """POST /v1/plans."""
        req = self.parse(body)
        canonical = canonical_request(body, req)
        self.with_profile(req)  # validates profile_id before anything is stored or queued
        h = request_hash(canonical)
        force = bool(body.get("force"))
        if not force:
            existing = self.repo.find_plan_by_hash(h)
            if existing is not None:
                return Outcome("existing", plan=existing)
        if self._wants_job(body, req):
            if not force:
                active = self.repo.find_active_job(h)
                if active is not None:
                    return Outcome("job", job=active)
            return Outcome("job", job=self._enqueue("plan", canonical, force, None, body.get("callback_url")))
        new = self.compute(canonical)
        stored, created = self.repo.insert_plan(new, force=force)
        return Outcome("created" if created else "existing", plan=stored)

    def replan(self, plan_id: str, body: Mapping[str, Any]) -> Outcome:
        """POST /v1/plans/{id}/replan: the parent's request on a changed cluster."""
        parent = self.repo.get_plan(plan_id)
        if body.get("cluster") is not None:
            base = parse_cluster(body["cluster"], self._resolve_cluster).to_dict()
        else:
            base = parent.request["cluster"]
        cluster = apply_cluster_changes(base, body.get("unavailable_nodes"), body.get("added_nodes"))
        cluster = sticky_host_order(cluster, (parent.result.get("best") or {}).get("ranks"))
        new_body = {**parent.request, "cluster": cluster}
        req = self.parse(new_body)
        canonical = canonical_request(new_body, req)
        self.with_profile(req)
        if self._wants_job(body, req):
            return Outcome("job", job=self._enqueue("replan", canonical, True, parent.id, body.get("callback_url")))
        new = self.compute(canonical, parent=parent)
        stored, _ = self.repo.insert_plan(new, force=True)
        return Outcome("created", plan=stored)

    def compute_for_job(self, job: StoredJob, progress: ProgressFn | None, should_cancel: CancelFn | None) -> NewPlan:
        parent = self.repo.get_plan(job.parent_id) if job.parent_id else None
        return self.compute(job.request, parent=parent, progress=progress, should_cancel=should_cancel)

    # ---------------------------------------------------------------- estimate
    def estimate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        from cost_model import estimate

        req = parse_estimate_request(body, resolve_model=self._resolve_model, resolve_cluster=self._resolve_cluster)
        profile = self.load_profile(req.profile_id)
        est = estimate(req.model, req.training, req.cluster, req.strategy, profile=profile)
        return to_json_safe(est.to_dict())


__all__ = [
    "JobCancelled",
    "Outcome",
    "PlanService",
    "apply_cluster_changes",
    "canonical_request",
    "choose_stable",
    "plan_diff",
    "plan_status",
    "plan_to_api",
    "ranks_moved",
    "request_hash",
    "to_json_safe",
]
