"""Request and response shapes for the HTTP edge (OpenAPI documentation and top-level type checks).

Requests.  The schemas are deliberately permissive below the top level (model, training,
cluster, constraints and strategy are objects): the rules, with their field paths and reasons,
live in ``planner_service.planner.request`` and ``cost_model``, which the routes call with the
validated dict.  Top-level fields are strict (no coercion of "3" to 3) and unknown top-level
fields are refused.

Responses.  Every route that returns JSON declares one of the models below as its
``response_model`` (or in ``responses`` for a second success status), so OpenAPI documents every
2xx body.  The routes still answer with the dicts they build (a ``JSONResponse``: a plan holds a
rank entry per GPU, and the stored JSON is plain already), so the models describe the bodies
rather than filter them: they name the contract's fields with their units and allow more keys
(``extra="allow"``), because the contract lets fields be added but never renamed.
``tests/api/test_openapi.py`` checks real bodies against them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cost_model.devices import DTYPES
from cost_model.training import OPTIMIZERS
from planner_service.exporters import TARGETS

EXAMPLE_CLUSTER: dict[str, Any] = {
    "name": "dgx-a100",
    "node_groups": [
        {
            "name": "a100",
            "count": 2,
            "gpus_per_node": 8,
            "device": "A100-SXM4-80GB",
            "intra_node_bandwidth_GBps": 300,
            "inter_node_bandwidth_GBps": 200,
            "hostnames": ["node-0", "node-1"],
        }
    ],
}
EXAMPLE_MIXED_CLUSTER: dict[str, Any] = {
    "name": "mixed",
    "node_groups": [
        {"name": "h100", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB"},
        {"name": "a100", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB"},
    ],
    "nodes": [{"hostname": "a100-1", "group": "a100", "available": False}],
}
EXAMPLE_TRAINING: dict[str, Any] = {"global_batch_size": 64, "sequence_length": 2048, "dtype": "bf16", "optimizer": "adam"}

PLAN_EXAMPLES: dict[str, Any] = {
    "preset": {
        "summary": "A preset model on one node of 8 A100s",
        "value": {
            "model": {"preset": "gpt3-125m"},
            "training": EXAMPLE_TRAINING,
            "cluster": {"name": "one-node", "node_groups": [{"name": "g0", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]},
        },
    },
    "hf_config_async": {
        "summary": "A Hugging Face config on a mixed cluster, as a job (add callback_url for a host in PLANNER_CALLBACK_ALLOWED_HOSTS)",
        "value": {
            "model": {"name": "my-llama", "transformer": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}},
            "training": {"global_batch_size": 512, "sequence_length": 4096, "dtype": "bf16"},
            "cluster": EXAMPLE_MIXED_CLUSTER,
            "constraints": {"max_tp": 8, "memory_headroom_fraction": 0.1},
            "objective": "throughput",
            "top_k": 3,
            "async": True,
        },
    },
    "saved_cluster_forced": {
        "summary": "A saved cluster by name; force a fresh plan",
        "value": {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 256, "sequence_length": 8192}, "cluster": "dgx-a100", "force": True},
    },
}

REPLAN_EXAMPLES: dict[str, Any] = {
    "node_down": {"summary": "A node died", "value": {"unavailable_nodes": ["node-1"]}},
    "nodes_added": {"summary": "Nodes were added to a group", "value": {"added_nodes": [{"hostname": "node-2", "group": "a100"}]}},
    "new_cluster": {"summary": "A different cluster altogether", "value": {"cluster": EXAMPLE_CLUSTER}},
}

ESTIMATE_EXAMPLES: dict[str, Any] = {
    "megatron_style": {
        "summary": "One strategy on 2 DGX A100 nodes",
        "value": {
            "model": {"preset": "gpt3-1.3b"},
            "training": {"global_batch_size": 512, "sequence_length": 2048, "dtype": "bf16"},
            "cluster": EXAMPLE_CLUSTER,
            "strategy": {"dp": 8, "tp": 2, "pp": 1, "micro_batch_size": 4, "sequence_parallel": True, "recompute": "selective", "zero_stage": 1},
        },
    }
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class PlanCreate(_Strict):
    """POST /v1/plans."""

    model: dict[str, Any] = Field(
        description="Exactly one of {preset}, {transformer: <config.json keys>}, {graph: <operator graph>} or {model_id} (an uploaded model); optional name.",
        json_schema_extra={"examples": [{"preset": "llama3-70b"}]},
    )
    training: dict[str, Any] = Field(
        description=(f"global_batch_size (sequences), sequence_length, dtype ({'|'.join(DTYPES)}), optimizer ({'|'.join(OPTIMIZERS)}), "
                     "framework, attention, total_tokens, and the framework settings of README 'The contract (v1)'."),
        json_schema_extra={"examples": [EXAMPLE_TRAINING]},
    )
    cluster: dict[str, Any] | str = Field(
        description="A cluster object {name, node_groups[], nodes?} or the name of a saved cluster.",
        json_schema_extra={"examples": [EXAMPLE_CLUSTER]},
    )
    constraints: dict[str, Any] | None = Field(
        default=None,
        description="Pinned strategy fields (tp, pp, ...), max_tp, max_pp, memory_headroom_fraction (0..0.9; default: the predicted peak memory interval is the margin), allowed_device_types, max_devices, tight_memory (rank_after_safe | by_objective | reject | reject_unlikely).",
    )
    objective: str = Field(default="throughput", description="throughput | cost | time_to_train")
    top_k: int = Field(default=3, description="How many alternative plans to keep (0-50).")
    async_: bool = Field(default=False, alias="async", description="Run as a job: 202 with the job; poll GET /v1/jobs/{id}.")
    force: bool = Field(default=False, description="Plan again even if an identical request has a stored plan (new revision).")
    callback_url: str | None = Field(default=None, description="http(s) URL that gets a POST with the job when it ends (jobs only).")
    profile_id: str | None = Field(default=None, description="An uploaded operator profile to calibrate the cost model.")


class NodeRef(_Strict):
    hostname: str
    group: str


class ReplanRequest(_Strict):
    """POST /v1/plans/{id}/replan: what changed in the parent plan's cluster."""

    unavailable_nodes: list[str] | None = Field(default=None, description="Hostnames that are down.")
    added_nodes: list[NodeRef] | None = Field(default=None, description="New nodes, each added to an existing node group.")
    cluster: dict[str, Any] | str | None = Field(default=None, description="A replacement cluster (object or saved name); the edits above apply to it.")
    async_: bool = Field(default=False, alias="async", description="Run as a job (202).")
    callback_url: str | None = None
    recalibrated: bool = Field(default=False, description="Re-plan at the cluster's latest calibration from observed runs (no cluster change needed); "
                                                          "a plan whose observed memory was tight gets more memory headroom.")


class EstimateCreate(_Strict):
    """POST /v1/estimate."""

    model: dict[str, Any] = Field(json_schema_extra={"examples": [{"preset": "gpt3-1.3b"}]})
    training: dict[str, Any] = Field(json_schema_extra={"examples": [EXAMPLE_TRAINING]})
    cluster: dict[str, Any] | str = Field(json_schema_extra={"examples": [EXAMPLE_CLUSTER]})
    strategy: dict[str, Any] = Field(
        description="dp, tp, pp, cp, ep, vpp, micro_batch_size, sequence_parallel, recompute (none|selective|full), recompute_num_layers (with full: the first N layers of each model chunk, megatron-core; N of the layers without a pipeline, fsdp and paddle: fms-fsdp's selective_checkpointing, PaddleNLP's no_recompute_layers), recompute_method (with full and recompute_num_layers N: block — the default, as above — or uniform: one checkpoint per group of N layers, Megatron-Core's --recompute-method uniform), recompute_modules (with selective: Megatron-Core's --recompute-modules, e.g. moe_act and layernorm, or PaddleNLP's recompute_granularity, core_attn or full_attn; absent: the default, core_attn), zero_stage (0-3), dp_shard (ZeRO/FSDP state sharded over dp_shard of the dp ranks and replicated over the rest: HSDP; 0 all), etp (the experts' tensor-parallel size, Megatron-Core's --expert-tensor-parallel-size; 0 its default), layers_per_stage, account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split.",
        json_schema_extra={"examples": [{"dp": 8, "tp": 2, "micro_batch_size": 4}]},
    )
    profile_id: str | None = None


# --------------------------------------------------------------------------------------------
# Responses (documentation of the bodies the routes build; see the module docstring)
# --------------------------------------------------------------------------------------------


class _Open(BaseModel):
    """A response body: the fields named here, and possibly more."""

    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Open):
    code: str = Field(description="Machine-readable reason, e.g. invalid_input, not_found, no_feasible_plan")
    message: str
    field: str | None = Field(description="Dotted path of the offending input, e.g. cluster.node_groups[0].count")


class ErrorBody(_Open):
    """Every error response."""

    error: ErrorDetail


class StageEstimate(_Open):
    """One pipeline stage of a prediction."""

    index: int
    device: str
    forward_s: float | None = Field(description="Forward time of one micro-batch, s")
    backward_s: float | None = Field(description="Backward time of one micro-batch, s")
    peak_memory_GB: float | None = Field(description="Peak memory per GPU of the stage, GB as the allocator prints them (binary, compared with the device's nominal memory; docs/frameworks.md)")
    host_memory_GB: float | None = Field(default=None, description="Host memory per GPU of the state and activations offloaded to it (training.optimizer_offload_fraction, cpu_offload, activation_offloading), GB; absent without offload")


class MicrobatchGroups(_Open):
    """The micro-batch groups an interleaved pipeline schedule runs a step in (each group's
    micro-batches through every model chunk before the next group's)."""

    first: int = Field(description="Micro-batches in the first group (the warm-up is priced with it)")
    later: int = Field(description="Micro-batches in each later group; the last holds what is left")


class Prediction(_Open):
    """POST /v1/estimate and every plan candidate's ``prediction``: the cost model's answer for
    one strategy.  Floats that were not finite are null."""

    step_time_s: float | None
    tokens_per_s: float | None
    samples_per_s: float | None
    model_tflops_per_gpu: float | None = Field(description="Model FLOP/s per GPU (no recompute), 1e12")
    hardware_tflops_per_gpu: float | None = Field(description="Hardware FLOP/s per GPU (with recompute), 1e12")
    mfu: float | None = Field(description="Model FLOPs utilisation, 0-1")
    fits: bool = Field(description="Every stage's p10 peak memory is within its (usable) memory")
    tight: bool = Field(default=False, description="Fits, but some stage's p90 peak exceeds usable memory: may run out of memory (docs/frameworks.md)")
    peak_memory_quantity: str = Field(default="max_reserved", description="What peak_memory_GB predicts: max_reserved = torch.cuda.max_memory_reserved + CUDA context and NCCL buffers")
    peak_memory_GB: list[float | None] = Field(description="Peak memory per GPU, per stage, GB")
    memory_interval_basis: str | None = Field(
        default=None,
        description="Where peak_memory_GB_p10/_p90 come from: measured-peaks (the residuals of peaks measured under this framework) "
        "or fragmentation-bounds (no measured peak under it: widened by the allocator's fragmentation range; docs/frameworks.md)",
    )
    breakdown_s: dict[str, float | None] = Field(
        description="Where a step's time goes: compute, recompute, tp_comm, cp_comm, ep_comm, pp_comm, dp_comm_exposed, offload_exposed, bubble, optimizer (s)"
    )
    stages: list[StageEstimate]
    num_devices: int
    microbatch_groups: MicrobatchGroups | None = Field(
        default=None, description="The interleaved schedule's micro-batch groups as the framework runs them; null without interleaving")
    pipeline_schedules: int = Field(default=1, description="Pipeline schedules the step runs its micro-batches in (training.pipeline_schedules_per_step with a pipeline; 1 without one)")
    warnings: list[str]
    model_params: float | None = Field(default=None, description="Parameters of the model")
    active_params: float | None = Field(default=None, description="Parameters one token uses (MoE: the top-k routed experts); equals model_params for dense models")


class RankEntry(_Open):
    """Where one rank runs: host and local GPU, node group, device, mesh coordinates (Megatron order)."""

    rank: int
    host: str | None
    gpu: int
    node_group: str
    device: str
    stage: int
    dp: int
    pp: int
    tp: int
    cp: int


class PlanStage(_Open):
    """A stage of a plan: the prediction's stage plus its hosts (layer range or operator range)."""

    index: int
    device: str
    hosts: list[str]


class Candidate(_Open):
    """The best plan or an alternative: strategy, prediction, stages and ranks (an operator-graph
    plan's alternatives carry strategy and prediction only)."""

    strategy: dict[str, Any] = Field(description="dp, tp, pp, cp, ep, vpp, micro_batch_size, sequence_parallel, recompute, zero_stage, layers_per_stage, ...")
    prediction: Prediction
    stages: list[PlanStage] | None = None
    ranks: list[RankEntry] | None = None


class SearchStats(_Open):
    candidates: int = Field(description="Candidate strategies weighed")
    pruned: int = Field(description="Candidates the bound ruled out")
    solver_status: str
    wall_time_s: float


class PlanModel(_Open):
    name: str
    params: int | None = Field(description="Parameter count")
    spec: Any = Field(default=None, description="The model as requested")


class PlanSummaryFigures(_Open):
    device_types: list[str]
    num_devices: int
    step_time_s: float
    tokens_per_s: float
    mfu: float


class Plan(_Open):
    """A stored plan (contract v1): the request as planned, the best candidate, the alternatives,
    the search and its explanation; ``diff`` on a replan."""

    id: str
    status: str = Field(description="optimal | feasible")
    request_hash: str = Field(description="SHA-256 of the canonical request")
    revision: int
    created_at: str = Field(description="ISO 8601, UTC")
    parent_id: str | None = Field(description="The plan this one re-plans")
    model: PlanModel
    cluster: dict[str, Any] | None = Field(description="The cluster as planned (defaults filled in)")
    training: dict[str, Any] | None
    constraints: dict[str, Any] | None
    objective: str
    top_k: int | None
    profile_id: str | None
    summary: PlanSummaryFigures
    best: Candidate | None
    alternatives: list[Candidate]
    search: SearchStats | None
    explanation: dict[str, Any] | None
    warnings: list[str]
    diff: dict[str, Any] | None = Field(default=None, description="Replans only: what changed against the parent plan")
    supersedes: str | None = Field(default=None, description="The earlier plan of the same request this one replaces (force, or a larger budget than a plan not proved optimal had)")
    superseded_by: str | None = Field(default=None, description="GET only: a newer plan of the same request (forced, or planned under a larger budget) when there is one")
    calibration: dict[str, Any] | None = Field(default=None, description="The calibration the plan was costed with: {cluster, version (0: public), source, constants}")
    observed: dict[str, Any] | None = Field(default=None, description="The latest observed run beside the prediction and its interval "
                                                                       "(POST /v1/plans/{id}/observations), filled by GET; null when none")


class PlanListItem(_Open):
    """A plan's summary row in ``GET /v1/plans``."""

    id: str
    status: str
    request_hash: str
    revision: int
    parent_id: str | None
    created_at: str
    objective: str
    model: PlanModel
    cluster_name: str
    device_types: list[str]
    num_devices: int
    step_time_s: float
    tokens_per_s: float
    mfu: float
    strategy: dict[str, Any]


class PlanPage(_Open):
    items: list[PlanListItem]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")
    limit: int
    sort: str


class Job(_Open):
    """A planning job (202 answers and GET /v1/jobs/{id})."""

    id: str
    kind: str = Field(description="plan | replan")
    status: str = Field(description="queued | running | succeeded | failed | cancelled")
    progress: float | None = Field(description="0-1")
    plan_id: str | None = Field(description="The plan, once the job succeeded")
    parent_id: str | None
    error: dict[str, Any] | None = Field(description="A failed job's error body ({code, message, field})")
    attempts: int
    cancel_requested: bool
    callback_url: str | None
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    links: dict[str, str] = Field(description="self, and plan once there is one")


class LaunchQuery(BaseModel):
    """The query of ``GET /v1/plans/{id}/launch``: the target, the output format and the launch
    parameters (``exporters.LaunchParams``), as one request object."""

    target: str = Field(description="One of: " + ", ".join(TARGETS))
    image: str | None = Field(default=None, description="Container image (Kubernetes targets)")
    command: str | None = Field(default=None, description="Training entry point and arguments (default per target)")
    job_name: str | None = Field(default=None, description="Job name (DNS-1123 label)")
    namespace: str = Field(default="default", description="Kubernetes namespace")
    queue: str | None = Field(default=None, description="Slurm partition / Volcano or Kueue queue")
    env: list[str] | None = Field(default=None, description="Extra environment, KEY=VALUE (repeatable)")
    smoke_test: bool = Field(default=False, description="Run an NCCL all-reduce smoke test before training")
    nccl_debug: str = Field(default="WARN", description="NCCL_DEBUG level")
    master_port: int = Field(default=29500, ge=1, le=65534)
    format: str = Field(default="json", description="json (all files) or raw (one file as text)")
    file: str | None = Field(default=None, description="With format=raw: which file (default: the primary)")


class LaunchArtifacts(_Open):
    """GET /v1/plans/{id}/launch (format=json)."""

    target: str
    primary: str = Field(description="The file to start with")
    files: dict[str, str] = Field(description="File name → text")
    notes: list[str]
    plan_id: str
    warnings: list[str] = Field(description="Preflight warnings (mixed versions or devices inside a communication group)")


class SavedCluster(_Open):
    name: str
    cluster: dict[str, Any] = Field(description="The cluster object {name, node_groups, nodes?}")
    created_at: str
    updated_at: str


class ClusterList(_Open):
    items: list[SavedCluster]


class ClusterImport(_Open):
    cluster: dict[str, Any] = Field(description="The imported cluster object")
    warnings: list[str]
    saved: SavedCluster | None = Field(default=None, description="With ?save=true: the stored cluster")


class ProfileSummary(_Open):
    id: str
    device: str
    source: str | None
    name: str | None
    created_at: str
    measurements: int = Field(description="Number of measurements")
    efficiency: dict[str, Any] | None = Field(description="Fitted efficiency parameters")
    device_overrides: dict[str, Any] | None
    quality: dict[str, Any] | None


class ProfileCreated(ProfileSummary):
    fit: dict[str, Any]


class ProfileDetail(ProfileSummary):
    profile: dict[str, Any] = Field(description="The stored profile document")
    fit: dict[str, Any] | None


class ProfileList(_Open):
    profiles: list[ProfileSummary]


class StoredModelInfo(_Open):
    id: str
    name: str
    format: str = Field(description="onnx")
    created_at: str


class ModelCreated(_Open):
    id: str
    name: str
    format: str
    summary: dict[str, Any] = Field(description="Operators, parameters")
    links: dict[str, str]


class ModelDetail(StoredModelInfo):
    summary: dict[str, Any]
    graph: dict[str, Any] | None = Field(default=None, description="With ?include_graph=true: the operator graph")


class ModelList(_Open):
    items: list[StoredModelInfo]


class DeviceInfo(_Open):
    name: str
    memory_GB: float
    bf16_tflops: float | None
    intra_node_bandwidth_GBps: float | None
    inter_node_bandwidth_GBps: float | None


class DeviceList(_Open):
    items: list[DeviceInfo]


class PresetInfo(_Open):
    name: str
    num_hidden_layers: int
    hidden_size: int


class PresetList(_Open):
    items: list[PresetInfo]


class Health(_Open):
    status: str


class Ready(_Open):
    status: str
    database: str = Field(description="sqlite | postgresql")


#: The ``responses`` argument of a route or router: status → {model, description, content}.
Responses = dict[int | str, dict[str, Any]]

#: Router-level ``responses``: the API's 422 is the error body (``api.errors``), not FastAPI's
#: default validation error shape.
INVALID_INPUT: Responses = {
    422: {"model": ErrorBody, "description": "Invalid input (a malformed body or parameter); error.field names it"}
}

#: ``responses`` entries for text bodies (OpenAPI has no model for them).
#: Added to every /v1 router by the app factory (api.auth).
AUTH_RESPONSES: Responses = {
    400: {"model": ErrorBody, "description": "The Host header is not one this server answers for (PLANNER_ALLOWED_HOSTS)"},
    401: {"model": ErrorBody, "description": "No API key, or an unknown or revoked one (Authorization: Bearer <key>)"},
    403: {"model": ErrorBody, "description": "The key's role may not do this (reader: reads only)"},
    404: {"model": ErrorBody, "description": "No such resource in the key's tenant"},
    429: {"model": ErrorBody, "description": "The tenant's rate limit or concurrency quota is exceeded; see Retry-After", "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait"}}},
}
#: A route that runs a search or takes an upload: the server's capacity may be full.
BUSY_RESPONSES: Responses = {
    503: {"model": ErrorBody, "description": "The server's searches (or uploads) are at capacity, or the database is unreachable; see Retry-After",
          "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait"}}},
}

TEXT_BODY = {"text/plain": {"schema": {"type": "string"}}}


# --------------------------------------------------------------------------------------------
# Observed runs and cluster calibrations
# --------------------------------------------------------------------------------------------
class ObservationCreate(_Strict):
    """POST /v1/plans/{id}/observations: what a launched run of the plan printed."""

    log: str = Field(description="The log text (Megatron-LM, torchtitan, DeepSpeed, PaddleNLP), a PyTorch profiler Chrome trace, or JSON/CSV of step times")
    format: str = Field(default="auto", description="auto | megatron | torchtitan | chrome_trace | deepspeed | paddle | json | csv")
    warmup_steps: int | None = Field(default=None, ge=0, description="Log entries to drop as warm-up (default: 10% of them, at least 1 of 4 or more)")
    callback_url: str | None = Field(default=None, description="Notified ({event: plan.suggestion}) when the recalibration makes another plan better")


class Observation(_Open):
    """One stored observation: the observed summary beside the plan's prediction."""

    id: str
    plan_id: str
    cluster: str = Field(description="The cluster key (the plan's cluster name) whose calibration it feeds")
    format: str
    created_at: str
    observed: dict[str, Any] = Field(description="step_time_s (median after warm-up and outliers), _p10/_p90, steps_used, warmup_dropped, "
                                                 "outliers_dropped, peak_memory_allocated_GB, peak_memory_reserved_GB, tokens_per_s, phases_s, versions")
    predicted: dict[str, Any] = Field(description="The plan's step_time_s with its p10/p90 and peak_memory_GB when observed")
    calibration_version: int = Field(description="The calibration the plan's prediction was made with")
    calibration: dict[str, Any] | None = Field(default=None, description="POST only: the recalibration this observation produced")


class ObservationList(_Open):
    items: list[Observation]


class ClusterCalibration(_Open):
    """GET /v1/clusters/{name}/calibration."""

    cluster: str
    version: int
    constants: dict[str, float] = Field(description="Fitted multipliers of the device-family efficiencies (cost_model/cluster_calibration.py)")
    log_sd: dict[str, float] = Field(description="Posterior log-sd of each multiplier")
    residual_log_sd: float | None
    n_observations: int | None
    cross_validation: dict[str, Any]
    residuals: list[dict[str, Any]] = Field(description="Per observation: observed, predicted now, predicted by the public calibration, log residuals")
    history: list[dict[str, Any]] = Field(description="Every version: constants, observations, CV error")


class PlanSuggestion(_Open):
    """GET /v1/plans/{id}/suggestion."""

    plan_id: str
    cluster: str
    suggest: bool
    reason: str | None
    plan_calibration_version: int
    latest_calibration_version: int
    current: dict[str, Any] | None = Field(description="The plan's layout re-costed at the latest calibration, with its interval")
    suggested: dict[str, Any] | None = Field(description="The planner's best layout at the latest calibration: strategy, step_time_s, improvement_fraction")
    memory: dict[str, Any] | None = Field(description="Observed peak memory vs the device and the prediction")


__all__ = [
    "AUTH_RESPONSES",
    "BUSY_RESPONSES",
    "Candidate",
    "ClusterCalibration",
    "ClusterImport",
    "ClusterList",
    "DeviceList",
    "ESTIMATE_EXAMPLES",
    "ErrorBody",
    "EstimateCreate",
    "Health",
    "INVALID_INPUT",
    "Job",
    "LaunchArtifacts",
    "ModelCreated",
    "ModelDetail",
    "ModelList",
    "NodeRef",
    "Observation",
    "ObservationCreate",
    "ObservationList",
    "PLAN_EXAMPLES",
    "Plan",
    "PlanCreate",
    "PlanPage",
    "PlanSuggestion",
    "Prediction",
    "PresetList",
    "ProfileCreated",
    "ProfileDetail",
    "ProfileList",
    "REPLAN_EXAMPLES",
    "Ready",
    "ReplanRequest",
    "Responses",
    "SavedCluster",
    "TEXT_BODY",
]
