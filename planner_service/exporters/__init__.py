"""Launch artifacts for a stored plan: pure functions over the plan JSON (no database).

    from planner_service.exporters import render, LaunchParams
    artifact = render(plan_dict, "slurm", LaunchParams(command="train.py --cfg x"))
    artifact.files  # {"job.sbatch": "...", "rankmap.json": "..."}

Every artifact puts each rank on exactly the host and GPU in ``plan["best"]["ranks"]``; see
:mod:`planner_service.exporters.plan_view` for how.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping
from typing import Any

from cost_model.errors import InvalidInput
from planner_service.exporters.common import (
    Artifact,
    LaunchParams,
    launch_params,
    rankmap_dict,
    rankmap_json,
)
from planner_service.exporters.frameworks import (
    render_deepspeed_config,
    render_megatron,
    render_paddle_fleet,
    render_torchtitan,
)
from planner_service.exporters.kubernetes import (
    render_paddlejob,
    render_pytorchjob,
    render_trainjob,
    render_volcano,
)
from planner_service.exporters.launchers import (
    render_deepspeed,
    render_paddle_launch,
    render_torchrun,
)
from planner_service.exporters.plan_view import InvalidPlan, PlanView, plan_view
from planner_service.exporters.slurm import render_slurm


def render_rankmap(view: PlanView, params: LaunchParams) -> Artifact:
    data = rankmap_dict(view)
    buf = io.StringIO()
    cols = ["rank", "host", "gpu", "node_rank", "local_rank", "node_group", "device", "stage", "pp", "dp", "cp", "tp", "first_layer", "last_layer"]
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(cols)
    for r in data["ranks"]:
        layers = r.get("layers") or ["", ""]
        writer.writerow([r[c] for c in cols[:-2]] + layers)
    return Artifact("rankmap", {"rankmap.json": rankmap_json(view), "rankmap.csv": buf.getvalue()}, "rankmap.json")


TARGETS: Mapping[str, Callable[[PlanView, LaunchParams], Artifact]] = {
    "torchrun": render_torchrun,
    "paddle-launch": render_paddle_launch,
    "deepspeed": render_deepspeed,
    "slurm": render_slurm,
    "kubernetes-pytorchjob": render_pytorchjob,
    "kubernetes-paddlejob": render_paddlejob,
    "volcano": render_volcano,
    "kubeflow-trainjob": render_trainjob,
    "megatron": render_megatron,
    "deepspeed-config": render_deepspeed_config,
    "paddle-fleet": render_paddle_fleet,
    "torchtitan": render_torchtitan,
    "rankmap": render_rankmap,
}


#: The frameworks (``training.framework``) whose plans a target launches; targets not listed
#: launch any.  A plan is searched and costed for one framework (its layout rules and
#: constants, :mod:`cost_model.frameworks`): launching it with another framework's engine would
#: run something the prediction is not about, so it is refused (docs/frameworks.md).
_TORCH = ("megatron-core", "megatron-deepspeed", "deepspeed", "fsdp")
TARGET_FRAMEWORKS: Mapping[str, tuple[str, ...]] = {
    "deepspeed": ("deepspeed", "megatron-deepspeed"),
    "deepspeed-config": ("deepspeed", "megatron-deepspeed"),
    "megatron": ("megatron-core", "megatron-deepspeed"),
    "torchtitan": ("fsdp",),
    "paddle-launch": ("paddle",),
    "paddle-fleet": ("paddle",),
    "kubernetes-paddlejob": ("paddle",),
    "torchrun": _TORCH,
    "kubernetes-pytorchjob": _TORCH,
    "kubeflow-trainjob": _TORCH,
}


def check_target_framework(plan: Mapping[str, Any], target: str) -> None:
    """Refuse (422 on ``target``) a target whose framework is not the one the plan was searched
    for.  Plans without ``training.framework`` (hand-written) are not checked."""
    training = plan.get("training")
    framework = training.get("framework") if isinstance(training, Mapping) else None
    allowed = TARGET_FRAMEWORKS.get(target)
    if framework is None or allowed is None or framework in allowed:
        return
    raise InvalidInput(
        f"target {target} launches {' or '.join(allowed)}, but this plan was searched for {framework} "
        f"(its layout and prediction are {framework}'s); re-plan with training.framework "
        f"{' or '.join(repr(f) for f in allowed)} for this target, or launch with a {framework} target",
        field="target",
    )


def render(plan: Mapping[str, Any], target: str, params: LaunchParams | None = None) -> Artifact:
    """Render ``target`` for ``plan`` (the plan JSON).  Raises :class:`InvalidPlan` (a
    :class:`cost_model.errors.InvalidInput`, HTTP 422) naming the field on bad input, e.g. a
    target of another framework than the plan's (:data:`TARGET_FRAMEWORKS`)."""
    if target not in TARGETS:
        raise InvalidInput(f"unknown target {target!r}; one of {', '.join(TARGETS)}", field="target")
    check_target_framework(plan, target)
    view = plan_view(plan)
    params = (params or LaunchParams()).validated(view)
    return TARGETS[target](view, params)


__all__ = ["Artifact", "InvalidPlan", "LaunchParams", "TARGETS", "TARGET_FRAMEWORKS", "check_target_framework", "launch_params", "plan_view", "render"]
