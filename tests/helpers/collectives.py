"""A micro-batch's ZeRO-3 / FSDP traffic as one figure, for tests that compare collectives."""

from __future__ import annotations

from typing import Any

import numpy as np

from cost_model.transformer.layer_cost import sharded_passes_s


def sharded_step_comm_s(*args: Any, passes: float = 3.0, reduce_scatter: bool = True, **kwargs: Any) -> np.ndarray:
    """Seconds of ``passes`` − 1 all-gathers and one gradient reduce-scatter of each layer
    (``reduce_scatter`` false: ``passes`` all-gathers); the other arguments are
    :func:`cost_model.transformer.layer_cost.sharded_passes_s`'s, whose two passes it combines."""
    gather, reduce = sharded_passes_s(*args, **kwargs)
    out: np.ndarray = (passes - 1.0) * gather + reduce if reduce_scatter else passes * gather
    return out
