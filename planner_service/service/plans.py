"""The plan service: what the HTTP routes and the job worker do, without HTTP.

* Canonical request and its hash (``service.identity``).
* Synchronous planning with de-duplication (insert-or-fetch in the repository).
* Jobs for large or ``async`` searches.
* Replanning after a cluster change (``service.replan``: preferring among near-best plans the one that moves the
  fewest ranks, and the diff against the parent plan).
* Estimates.

No global state: one :class:`PlanService` per app / worker process, built from settings and a
repository.  The planner function is injectable (tests use a slow or failing one); production
uses :func:`planner_service.planner.plan`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from cost_model.cluster_calibration import Z80
from cost_model.errors import InvalidInput, PlannerError, UnknownName
from cost_model.graph.ir import GraphSpec
from cost_model.spec import ModelSpec
from cost_model.transformer.spec import TransformerSpec
from planner_service.exporters.preflight import candidate_warnings
from planner_service.planner.request import (
    SERVICE_FIELDS,
    PlanRequest,
    parse_cluster,
    parse_estimate_request,
    parse_plan_request,
)
from planner_service.planner.result import Evaluated, PlanResult
from planner_service.service.executor import SearchExecutor
from planner_service.service.identity import (
    canonical_request,
    request_hash,
    to_json_safe,
)
from planner_service.service.observed import (
    ObservationService,
    calibrated_interval,
    calibrated_request,
)
from planner_service.service.replan import (
    REPLAN_MIN_TOP_K,
    apply_cluster_changes,
    choose_stable,
    pin_topology_domains,
    plan_diff,
    ranks_moved,
    sticky_host_order,
)
from planner_service.settings import ServiceSettings
from planner_service.storage.errors import Busy, NotFound
from planner_service.storage.observations import StoredCalibration
from planner_service.storage.rank_table import COMPACT_MIN_RANKS, RankTable, plain_rank_tables
from planner_service.storage.repository import (
    NewPlan,
    Repository,
    StoredJob,
    StoredPlan,
)

log = logging.getLogger("planner.service")


PlanFn = Callable[..., PlanResult]
ProgressFn = Callable[[float], None]
CancelFn = Callable[[], bool]


class JobCancelled(Exception):
    """Raised inside a job when its cancel was requested."""


@dataclass(frozen=True, kw_only=True)
class PreparedRequest:
    """A plan request parsed once: the domain request (saved cluster and uploaded model
    resolved, the profile applied to its cluster), its canonical form and that form's hash.
    Everything downstream (de-duplication, the job queue, the planner, the stored row) reads
    this; nothing parses the body again."""

    request: PlanRequest
    canonical: dict[str, Any]
    request_hash: str
    #: The cluster calibration the request is costed with (``service.observed``; None: public).
    calibration: StoredCalibration | None = None


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a plan request runs; not part of its identity (``NON_IDENTITY_KEYS``)."""

    force: bool = False
    run_async: bool = False
    callback_url: str | None = None


@dataclass(frozen=True, kw_only=True)
class ClusterChanges:
    """What changed in a parent plan's cluster (POST /v1/plans/{id}/replan): ``cluster``
    replaces it (an object or a saved cluster's name), then ``added_nodes`` ({hostname,
    group}) join their groups and ``unavailable_nodes`` are marked down."""

    unavailable_nodes: tuple[str, ...] = ()
    added_nodes: tuple[Mapping[str, Any], ...] = ()
    cluster: Mapping[str, Any] | str | None = None


@dataclass(frozen=True)
class Outcome:
    """What a POST produced: ``created`` (201), ``existing`` (200) or ``job`` (202)."""

    kind: str
    plan: StoredPlan | None = None
    job: StoredJob | None = None


# --------------------------------------------------------------------------------------------
# Result helpers
# --------------------------------------------------------------------------------------------


def plan_status(solver_status: Any) -> str:
    """Plan status from the solver's: ``optimal`` when the search proved its answer optimal,
    otherwise ``feasible`` (e.g. the time limit stopped the solver with a good plan)."""
    s = str(solver_status or "").lower()
    return "optimal" if s in ("optimal", "exhaustive", "proved_optimal") else "feasible"


def _model_summary(model: ModelSpec) -> dict[str, Any]:
    """What the plan's ``model`` reports beside name and params: the active parameters of a
    mixture of experts and the multi-token-prediction parameters of a transformer."""
    out: dict[str, Any] = {}
    active, total = int(model.active_params()), int(model.total_params())
    if active != total:
        out["active_params"] = active
    if isinstance(model, TransformerSpec) and model.mtp_layers:
        out["mtp_params"] = int(model.mtp_params())
    return out


#: Above this many ranks a stored plan keeps the rank table of its best entry only.
LARGE_PLAN_RANKS = 8192


def plan_to_api(p: StoredPlan, newest: StoredPlan | tuple[str, int] | None = None, rank_tables: bool = False) -> dict[str, Any]:
    """The plan JSON of contract v1.  ``newest``: the latest plan stored for the same request
    hash, or its (id, revision) (``superseded_by`` names it when it is another, newer one).
    ``rank_tables``: a large rank table stays a :class:`~planner_service.storage.rank_table.RankTable`
    (for :func:`~planner_service.storage.rank_table.dumps_with_tables`, which writes the same
    JSON from its columns); otherwise every ``ranks`` is a plain list of dicts."""
    out = _plan_json(p, plan_id=p.id, revision=p.revision, created_at=p.to_dict()["created_at"])
    ref = (newest.id, newest.revision) if isinstance(newest, StoredPlan) else newest
    out["superseded_by"] = ref[0] if ref is not None and ref[0] != p.id and ref[1] > p.revision else None
    return out if rank_tables else _plain_ranks(out)


def unstored_plan_to_api(p: NewPlan) -> dict[str, Any]:
    """The same plan JSON for a plan that was not stored (``planner plan --json``): ``id``,
    ``revision`` and ``created_at`` are null, everything else as ``POST /v1/plans`` returns it."""
    out = _plan_json(p, plan_id=None, revision=None, created_at=None)
    out["superseded_by"] = None
    return _plain_ranks(out)


def _plain_ranks(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with the rank tables of ``best`` and the alternatives as plain lists."""
    for key in ("best", "alternatives"):
        if out.get(key) is not None:
            out[key] = plain_rank_tables(out[key])
    return out


def _plan_json(p: StoredPlan | NewPlan, *, plan_id: str | None, revision: int | None, created_at: str | None) -> dict[str, Any]:
    r = p.result
    q = p.request
    out = {
        "id": plan_id,
        "status": p.status,
        "request_hash": p.request_hash,
        "revision": revision,
        "created_at": created_at,
        "parent_id": p.parent_id,
        "model": {"name": p.model_name, "params": p.model_params, **(r.get("model_summary") or {}), "spec": q.get("model")},
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
        "calibration": r.get("calibration") or {"cluster": p.cluster_name, "version": 0, "source": "public"},
        "observed": None,  # GET /v1/plans/{id} fills it from the plan's observed runs
    }
    out["supersedes"] = r.get("supersedes")
    if "diff" in r:
        out["diff"] = r["diff"]
    return out


# --------------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------------


def _default_plan_fn() -> PlanFn:
    from planner_service.planner import plan

    return plan


def _default_search_size(req: PlanRequest) -> int | None:
    try:
        from planner_service.planner.dispatch import search_size
    except ImportError:  # a planner without a size estimate: always synchronous
        return None
    try:
        return int(search_size(req))
    except PlannerError:
        raise  # a bad request: the same error the planner would give
    except Exception:  # noqa: BLE001 - a failing estimate must not fail the request
        log.warning("search_size failed; planning synchronously", exc_info=True)
        return None


#: Strategy fields a kept-layout replan holds at the parent's values; dp (and with it the
#: micro-batch count that keeps the global batch) and the layer split are searched again.
KEPT_LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "sequence_parallel", "recompute", "zero_stage")


def kept_layout_request(req: PlanRequest, parent: StoredPlan) -> PlanRequest | None:
    """The replan request restricted to the parent's layout, as Megatron users do after losing a
    node: tp/pp/cp/ep (and the micro-batch, recompute and ZeRO settings) kept, dp re-chosen for
    what the changed cluster holds (the global batch is kept through the micro-batch count),
    or the same dp on spare nodes the parent left idle.  None where there is no such layout
    (an operator-graph model, a parent without a strategy, or pins the layout contradicts)."""
    if isinstance(req.model, GraphSpec):
        return None
    s = (parent.result.get("best") or {}).get("strategy")
    if not isinstance(s, Mapping):
        return None
    keep = {k: s[k] for k in KEPT_LAYOUT_FIELDS if s.get(k) is not None}
    pinned = dict(req.constraints.pinned)
    if any(k in pinned and pinned[k] != v for k, v in keep.items()):
        return None
    return replace(req, constraints=replace(req.constraints, pinned={**pinned, **keep}))


def replan_request(req: PlanRequest) -> PlanRequest:
    """A replan's request: at least :data:`REPLAN_MIN_TOP_K` alternatives to choose among."""
    return replace(req, top_k=max(req.top_k, REPLAN_MIN_TOP_K))


def _with_search_mode(row: NewPlan, mode: Mapping[str, Any]) -> NewPlan:
    result = dict(row.result)
    result["search"] = {**(result.get("search") or {}), **mode}
    return replace(row, result=result)


def plan_row(
    prepared: PreparedRequest, req: PlanRequest, result: PlanResult, budget_s: float, parent: StoredPlan | None = None
) -> NewPlan:
    """The row to store for ``result``, the planner's answer to ``req`` (``prepared``'s request,
    with a replan's larger top_k): the stored plan JSON, with the preflight warnings over the
    candidate kept as best, the model summary and the budget the search ran under."""
    canonical = prepared.canonical
    stored_result, chosen = PlanService._stored_result(result, canonical, req, parent)
    # Preflight (mixed versions or devices inside a group) over the ranks of the candidate kept as best.
    stored_result["warnings"] = [*stored_result["warnings"], *candidate_warnings(req.cluster, stored_result["best"])]
    PlanService._record_calibration(stored_result, prepared, chosen)
    pred = chosen.prediction
    model: ModelSpec = req.model
    stored_result["model_summary"] = _model_summary(model)
    # The budget it ran under: a larger one may replace a plan not proved optimal.
    stored_result["search"] = {**(stored_result.get("search") or {}), "budget_s": budget_s}
    return NewPlan(
        request_hash=prepared.request_hash,
        status=plan_status(result.search.get("solver_status")),
        objective=req.objective,
        model_name=model.name or "model",
        model_params=int(model.total_params()),
        cluster_name=req.cluster.name,
        device_types=chosen.device_types,
        num_devices=pred.num_devices,
        step_time_s=float(pred.step_time_s),
        tokens_per_s=float(pred.tokens_per_s),
        mfu=float(pred.mfu),
        strategy=stored_result["best"]["strategy"],
        request=canonical,
        result=stored_result,
        parent_id=parent.id if parent is not None else None,
    )


class PlanService:
    def __init__(
        self,
        repo: Repository,
        settings: ServiceSettings,
        plan_fn: PlanFn | None = None,
        search_size_fn: Callable[[PlanRequest], int | None] | None = None,
        on_job_created: Callable[[], None] | None = None,
        executor: SearchExecutor | None = None,
    ) -> None:
        self.repo = repo
        self.settings = settings
        self._plan_fn = plan_fn
        self._search_size_fn = search_size_fn or _default_search_size
        self._on_job_created = on_job_created
        #: Where searches run (the API's bounded pool); None: inline (``planner worker``).
        self.executor = executor

    def for_repository(self, repo: Repository) -> PlanService:
        """This service over ``repo`` (a tenant's view of the same database)."""
        scoped = copy.copy(self)
        scoped.repo = repo
        return scoped

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
        return parse_plan_request(body, resolve_model=self._resolve_model, resolve_cluster=self._resolve_cluster, service_fields=SERVICE_FIELDS)

    def with_profile(self, req: PlanRequest) -> PlanRequest:
        """With ``profile_id``: the node groups of the profiled device get the profile's
        calibrated device, which the planner then costs them with."""
        if req.profile_id is None:
            return req
        from cost_model.estimate import apply_profile_to_cluster

        doc = self.load_profile(req.profile_id)
        return replace(req, cluster=apply_profile_to_cluster(req.cluster, doc, field="profile_id"))

    def prepare(self, body: Mapping[str, Any]) -> PreparedRequest:
        """Parse a plan request body once: the request, its canonical form (from the request as
        given: the profile is not part of it) and hash, and the profile applied (which validates
        ``profile_id`` before anything is stored or queued)."""
        return self._identified(body, *self._parse_for_plan(body))

    def _parse_for_plan(self, body: Mapping[str, Any]) -> tuple[PlanRequest, PlanRequest, StoredCalibration | None]:
        """(the request as given, the request as planned: profile and calibration applied, the
        calibration): :meth:`prepare` without the canonical form and hash."""
        req = self.parse(body)
        # The cluster's latest calibration from observed runs (if any) is part of what is planned.
        calibration = self.observed().calibration_for(req.cluster.name)
        return req, calibrated_request(self.with_profile(req), calibration), calibration

    @staticmethod
    def _identified(body: Mapping[str, Any], req: PlanRequest, planned: PlanRequest,
                    calibration: StoredCalibration | None) -> PreparedRequest:
        """The prepared request of :meth:`_parse_for_plan`'s parts: the canonical form (of the
        request as given, with the calibration version) and its hash."""
        canonical = canonical_request(body, req)
        if calibration is not None:
            canonical["calibration_version"] = calibration.version
        return PreparedRequest(request=planned, canonical=canonical, request_hash=request_hash(canonical), calibration=calibration)

    def prepare_canonical(self, canonical: dict[str, Any], hash_: str | None = None) -> PreparedRequest:
        """A stored canonical request (a job's) made ready to plan: parsed, profile and the
        calibration version it names applied."""
        req = self.with_profile(self.parse(canonical))
        version = canonical.get("calibration_version")
        calibration = self.observed().calibration_for(req.cluster.name, int(version)) if isinstance(version, int) else None
        return PreparedRequest(request=calibrated_request(req, calibration), canonical=canonical,
                               request_hash=hash_ or request_hash(canonical), calibration=calibration)

    def observed(self) -> ObservationService:
        """Observations and cluster calibrations of this service's tenant."""
        return ObservationService(self)

    # ---------------------------------------------------------------- planning
    def solver_settings(self) -> Any:
        from planner_service.planner import SolverSettings

        return SolverSettings(time_limit_s=self.settings.solver_time_limit_s, num_workers=self.settings.solver_num_workers)

    def _run_planner(self, req: PlanRequest, progress: ProgressFn | None, should_cancel: CancelFn | None) -> PlanResult:
        return self._start_planner(req, progress, should_cancel)()

    def _start_planner(self, req: PlanRequest, progress: ProgressFn | None, should_cancel: CancelFn | None) -> Callable[[], PlanResult]:
        """The search of ``req`` started in the executor's pool; the function returned waits for
        its result.  Without an executor the search runs inline when the function is called."""
        executor = self.executor
        if executor is not None:
            started = executor.start(self._plan_fn, req, self.solver_settings(), progress, should_cancel)
            return lambda: executor.finish(started, progress, should_cancel)
        fn = self._plan_fn or _default_plan_fn()
        return lambda: fn(req, self.solver_settings(), progress=progress, should_cancel=should_cancel)

    def _start_kept_layout(self, req: PlanRequest, parent: StoredPlan, progress: ProgressFn | None = None,
                           should_cancel: CancelFn | None = None) -> tuple[PlanRequest, Callable[[], PlanResult]] | None:
        """A replan's search restricted to the parent's layout (``req`` with the replan's top_k),
        started; None where there is no such layout."""
        kept = kept_layout_request(req, parent)
        return None if kept is None else (kept, self._start_planner(kept, progress, should_cancel))

    def _admitted(self) -> contextlib.AbstractContextManager[None]:
        """One synchronous search slot of this tenant and of the server (raises ``Busy``, a
        429/503, when none is free); nothing to hold without an executor."""
        return contextlib.nullcontext() if self.executor is None else self.executor.admit(self.repo.owner)

    def _compute_now(self, prepared: PreparedRequest, parent: StoredPlan | None = None) -> NewPlan:
        """A synchronous search, admitted against the tenant's and the server's search quota."""
        with self._admitted():
            return self.compute(prepared, parent=parent)

    def search_now(self, req: PlanRequest) -> PlanResult:
        """A synchronous search that stores nothing (a plan's suggestion), admitted against the
        same quota as a stored plan's."""
        with self._admitted():
            return self._run_planner(req, None, None)

    def compute(
        self,
        prepared: PreparedRequest,
        parent: StoredPlan | None = None,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        kept_search: tuple[PlanRequest, Callable[[], PlanResult]] | None = None,
    ) -> NewPlan:
        """Plan ``prepared`` and build the row to store.  With ``parent`` (a replan) the planner
        is asked for more alternatives and the most stable near-best candidate is kept, with a
        diff against the parent.  The preflight check runs over the candidate kept as best.
        ``kept_search``: the replan's kept-layout search, already started
        (:meth:`_start_kept_layout` of ``prepared.request`` with :func:`replan_request`)."""
        req = prepared.request
        mode: dict[str, Any] | None = None
        if parent is not None:
            req = replan_request(req)
            started = kept_search or self._start_kept_layout(req, parent, progress, should_cancel)
            if started is not None:
                kept, wait = started
                try:
                    result = wait()
                except PlannerError as e:  # the layout cannot survive the change: full search
                    mode = {"mode": "full_search", "kept_layout_failed": str(e)}
                else:
                    if should_cancel is not None and should_cancel():
                        raise JobCancelled()
                    row = plan_row(prepared, kept, result, self.solver_settings().time_limit_s, parent)
                    return _with_search_mode(row, {"mode": "kept_layout", "kept": dict(kept.constraints.pinned)})
            else:
                mode = {"mode": "full_search"}
        result = self._run_planner(req, progress, should_cancel)
        if should_cancel is not None and should_cancel():
            raise JobCancelled()
        row = plan_row(prepared, req, result, self.solver_settings().time_limit_s, parent)
        return _with_search_mode(row, mode) if mode is not None else row

    @staticmethod
    def _record_calibration(stored: dict[str, Any], prepared: PreparedRequest, chosen: Evaluated) -> None:
        """Record the calibration version the plan was costed with; under a cluster calibration
        the step-time intervals are the cluster fit's (``cost_model.cluster_calibration``)."""
        cal = prepared.calibration
        if cal is None:
            stored["calibration"] = {"cluster": prepared.request.cluster.name, "version": 0, "source": "public"}
            return
        stored["calibration"] = {"cluster": cal.cluster_key, "version": cal.version, "source": "cluster", "constants": dict(cal.constants)}
        best = stored["best"]
        step = float(best["prediction"]["step_time_s"])
        try:
            _lo, _hi, sd = calibrated_interval(prepared.request, cal, chosen.strategy, tuple(chosen.stage_groups) or None, step)
        except PlannerError:
            return
        regime = f"cluster:{cal.cluster_key}@v{cal.version}"
        for cand in [best, *stored.get("alternatives", [])]:
            p = cand.get("prediction") or {}
            if isinstance(p.get("step_time_s"), (int, float)):
                p["step_time_s_p10"], p["step_time_s_p90"] = (float(p["step_time_s"]) * f for f in (math.exp(-Z80 * sd), math.exp(Z80 * sd)))
                p["interval_regime"] = regime

    @staticmethod
    def _stored_result(
        result: PlanResult, canonical: Mapping[str, Any], req: PlanRequest, parent: StoredPlan | None
    ) -> tuple[dict[str, Any], Evaluated]:
        """The plan JSON to store and the candidate it is about.  A replan asks for more
        alternatives than it keeps: their ranks (one entry per GPU) are placed only for those the
        fewest-moves rule compares and those stored, and their stages only for those stored; it
        keeps the most stable near-best candidate, with a diff against the parent and the
        explanation redone around it."""
        # A plan of more than LARGE_PLAN_RANKS ranks stores the rank table of its best entry only
        # (each alternative's would be another table of that size; nothing reads them).  From
        # COMPACT_MIN_RANKS ranks a table is a RankTable built from placement's columns.
        large = result.num_devices > LARGE_PLAN_RANKS
        compact = result.num_devices >= COMPACT_MIN_RANKS
        d = to_json_safe(result.to_dict(alternative_ranks=parent is None and not large and not compact, best_ranks=not compact,
                                        stages=parent is None))

        def ranks_of(i: int) -> Any:
            columns = result.entry_rank_columns(i) if compact else None
            if columns is not None:
                return RankTable(tuple(columns), columns, len(columns["rank"]))
            rows = list(to_json_safe(result.entry_ranks(i)))
            return (RankTable.from_rows(rows) or rows) if compact else rows

        entries = [d["best"], *d["alternatives"]]
        if compact:
            d["best"]["ranks"] = ranks_of(0)
            if parent is None and not large:
                for i, c in enumerate(d["alternatives"], start=1):
                    c["ranks"] = ranks_of(i)
        stored: dict[str, Any] = {k: d[k] for k in ("best", "alternatives", "search", "explanation", "warnings")}
        if parent is None:
            return stored, result.best

        chosen, others, near = choose_stable(d, parent.result.get("best") or {}, req.objective, ranks_of)
        alternatives = others[: canonical.get("top_k", 3)]
        index = {id(c): i for i, c in enumerate(entries)}
        for c in alternatives:
            if "ranks" not in c and not large:
                c["ranks"] = ranks_of(index[id(c)])
            elif large:
                c.pop("ranks", None)

        def with_stages(c: dict[str, Any]) -> dict[str, Any]:
            full = result.entry_with_stages(index[id(c)], c)
            full["stages"] = to_json_safe(full["stages"])
            return full

        stored["best"] = with_stages(chosen)
        stored["alternatives"] = [with_stages(c) for c in alternatives]
        stored["diff"] = plan_diff(parent, chosen, near, chosen is d["best"])
        stored["explanation"] = result.explain(stored["best"], stored["alternatives"], index[id(chosen)])
        return stored, result.entries()[index[id(chosen)]]

    def _wants_job(self, options: RunOptions, req: PlanRequest) -> bool:
        if options.run_async:
            return True
        if isinstance(req.model, GraphSpec) and req.model.num_ops > self.settings.sync_max_graph_ops:
            return True
        size = self._search_size_fn(req)
        return size is not None and size > self.settings.sync_max_candidates

    def _enqueue(self, kind: str, prepared: PreparedRequest, force: bool, parent_id: str | None, callback_url: str | None) -> StoredJob:
        limit = self.settings.tenant_max_active_jobs
        active = self.repo.count_active_jobs()
        if active >= limit:
            retry = float(max(1, round(self.settings.solver_time_limit_s)))
            raise Busy(f"tenant {self.repo.owner!r} has {active} queued or running jobs, its limit (PLANNER_TENANT_MAX_ACTIVE_JOBS); "
                       "retry when one finished", status=429, retry_after_s=retry, code="tenant_concurrency")
        job = self.repo.create_job(kind, prepared.canonical, prepared.request_hash, force=force, parent_id=parent_id, callback_url=callback_url)
        if self._on_job_created is not None:
            self._on_job_created()
        return job

    def create_plan(self, prepared: PreparedRequest, options: RunOptions | None = None) -> Outcome:
        """POST /v1/plans: the stored plan of an identical request, a job, or a new plan."""
        options = options or RunOptions()
        h = prepared.request_hash
        existing = self.repo.find_plan_by_hash(h)
        # ``force``, or a stored plan not proved optimal under a smaller budget than this
        # service's: plan again and store a new revision that links to the one it supersedes.
        force = options.force or (existing is not None and self._can_improve(existing))
        if not force and existing is not None:
            return Outcome("existing", plan=existing)
        if self._wants_job(options, prepared.request):
            if not force:
                active = self.repo.find_active_job(h)
                if active is not None:
                    return Outcome("job", job=active)
            return Outcome("job", job=self._enqueue("plan", prepared, force, None, options.callback_url))
        if self.executor is None or force:
            return self._plan_and_store(prepared, force, existing)
        # identical concurrent requests of a tenant: one searches, the others get its plan
        with self.executor.coalesce(f"{self.repo.owner}:{h}", wait_s=10 * self.settings.solver_time_limit_s + 30) as leader:
            if not leader:
                stored = self.repo.find_plan_by_hash(h)
                if stored is not None:
                    return Outcome("existing", plan=stored)
            return self._plan_and_store(prepared, force, existing)

    def _plan_and_store(self, prepared: PreparedRequest, force: bool, existing: StoredPlan | None) -> Outcome:
        new = self._compute_now(prepared)
        if force and existing is not None:
            new = replace(new, result={**new.result, "supersedes": existing.id})
        stored, created = self.repo.insert_plan(new, force=force)
        return Outcome("created" if created else "existing", plan=stored)

    def _can_improve(self, stored: StoredPlan) -> bool:
        """A stored plan a new search could beat: not proved optimal, planned under a smaller
        budget than the one this service runs with now, or a kept-layout replan (its search was
        restricted to the parent's layout: the same request planned afresh searches them all)."""
        if (stored.result.get("search") or {}).get("mode") == "kept_layout":
            return True
        if stored.status == "optimal":
            return False
        budget = (stored.result.get("search") or {}).get("budget_s")
        return isinstance(budget, int | float) and budget < self.solver_settings().time_limit_s

    def newest_for(self, p: StoredPlan) -> tuple[str, int] | None:
        """(id, revision) of the latest plan stored for ``p``'s request hash (``plan_to_api``'s
        ``newest``)."""
        return self.repo.find_newest_ref(p.request_hash)

    def replan(self, plan_id: str, changes: ClusterChanges, options: RunOptions | None = None,
               overrides: Mapping[str, Any] | None = None) -> Outcome:
        """POST /v1/plans/{id}/replan: the parent's request on a changed cluster (and, with
        ``overrides``, changed request keys: a recalibrated replan's memory headroom)."""
        options = options or RunOptions()
        parent = self.repo.get_plan(plan_id)
        if changes.cluster is not None:
            base = parse_cluster(changes.cluster, self._resolve_cluster).to_dict()
        else:
            base = parent.request["cluster"]
        cluster = apply_cluster_changes(base, list(changes.unavailable_nodes), [dict(n) for n in changes.added_nodes])
        cluster = sticky_host_order(pin_topology_domains(cluster), (parent.result.get("best") or {}).get("ranks"))
        body = {**parent.request, "cluster": cluster, **(overrides or {})}
        req, planned, calibration = self._parse_for_plan(body)
        if self._wants_job(options, planned):
            prepared = self._identified(body, req, planned, calibration)
            return Outcome("job", job=self._enqueue("replan", prepared, True, parent.id, options.callback_url))

        def compute() -> NewPlan:
            # the kept-layout search starts first; the canonical form and hash (a 12,288-node
            # cluster's: ~0.1 s) are built while it runs in the pool
            kept_search = self._start_kept_layout(replan_request(planned), parent)
            return self.compute(self._identified(body, req, planned, calibration), parent=parent, kept_search=kept_search)

        if self.executor is None:
            new = compute()
        else:
            with self.executor.admit(self.repo.owner):
                new = compute()
        stored, _ = self.repo.insert_plan(new, force=True)
        return Outcome("created", plan=stored)

    def compute_for_job(self, job: StoredJob, progress: ProgressFn | None, should_cancel: CancelFn | None) -> NewPlan:
        parent = self.repo.get_plan(job.parent_id) if job.parent_id else None
        prepared = self.prepare_canonical(job.request, job.request_hash)
        new = self.compute(prepared, parent=parent, progress=progress, should_cancel=should_cancel)
        existing = self.repo.find_plan_by_hash(job.request_hash) if job.force and parent is None else None
        return replace(new, result={**new.result, "supersedes": existing.id}) if existing is not None else new

    # ---------------------------------------------------------------- estimate
    def estimate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        from cost_model import estimate

        req = parse_estimate_request(body, resolve_model=self._resolve_model, resolve_cluster=self._resolve_cluster)
        profile = self.load_profile(req.profile_id)
        est = estimate(req.model, req.training, req.cluster, req.strategy, profile=profile)
        return to_json_safe(est.to_dict())


__all__ = [
    "ClusterChanges",
    "JobCancelled",
    "Outcome",
    "PlanService",
    "PreparedRequest",
    "RunOptions",
    "apply_cluster_changes",
    "canonical_request",
    "choose_stable",
    "plan_diff",
    "plan_status",
    "plan_row",
    "plan_to_api",
    "unstored_plan_to_api",
    "ranks_moved",
    "request_hash",
    "to_json_safe",
]
