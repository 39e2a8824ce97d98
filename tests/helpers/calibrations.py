"""A cluster calibration stored directly (as an observation would leave one), for tests of what
reads it: suggestions, recalibrated replans."""

from __future__ import annotations

from planner_service.storage.observations import ObservationStore

NAMES = ["fabric_efficiency.infiniband", "framework_efficiency.megatron-core", "gemm_efficiency.ampere"]


def add_calibration(client, tenant: str, cluster: str, constants: dict[str, float] | None = None) -> None:
    """Store a newer calibration of ``cluster`` for ``tenant`` (default: every constant 0.9),
    with a tight diagonal covariance."""
    fit = {"names": NAMES, "covariance": [[1e-4 if i == j else 0.0 for j in range(len(NAMES))] for i in range(len(NAMES))], "residual_log_sd": 0.03}
    ObservationStore(client.app.state.repository.scoped(tenant)).add_calibration(cluster, constants or dict.fromkeys(NAMES, 0.9), fit)
