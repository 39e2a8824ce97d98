"""Cost model for hybrid-parallel transformer (and operator-graph) training.

>>> from cost_model import estimate, get_preset, simple_cluster, Strategy, Training
>>> est = estimate(get_preset("gpt3-1.3b"), Training(512, 2048), simple_cluster("A100-SXM4-80GB", 4),
...                Strategy(dp=32, micro_batch_size=4))
"""

from cost_model.cluster import (
    Cluster,
    Node,
    NodeGroup,
    cluster_from_dict,
    simple_cluster,
)
from cost_model.devices import (
    DeviceSpec,
    Efficiency,
    catalog,
    get_device,
    resolve_device,
)
from cost_model.errors import PlannerError
from cost_model.estimate import estimate
from cost_model.result import Estimate, StageEstimate
from cost_model.strategy import Strategy, strategy_from_dict, validate_strategy
from cost_model.training import Training, training_from_dict
from cost_model.transformer.spec import (
    PRESETS,
    TransformerSpec,
    from_hf_config,
    get_preset,
    model_from_dict,
)

__all__ = [
    "Cluster",
    "DeviceSpec",
    "Efficiency",
    "Estimate",
    "Node",
    "NodeGroup",
    "PRESETS",
    "PlannerError",
    "StageEstimate",
    "Strategy",
    "Training",
    "TransformerSpec",
    "catalog",
    "cluster_from_dict",
    "estimate",
    "from_hf_config",
    "get_device",
    "get_preset",
    "model_from_dict",
    "resolve_device",
    "simple_cluster",
    "strategy_from_dict",
    "training_from_dict",
    "validate_strategy",
]
