"""The layouts frameworks ship as examples and recipes (``cost_model/data/framework_recipes.json``):
real configurations the planner must accept as their frameworks run them.

Each recipe is a request body (a Hugging Face config.json-style model, the training settings
with the framework, a cluster of the stated GPUs, the stated strategy) and what is expected of
its estimate: ``runs`` — no refusal, predicted to fit (tight allowed) — or ``does_not_fit`` with
the reason (a setting the cost model does not price, e.g. verl's sequence packing).  Layouts only: no
source's measured figure is recorded.  Used by the acceptance test
(``tests/planner/transformer/test_framework_recipes.py``) and ``bench/acceptance.py``."""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

#: The catalog device a recipe's stated device runs on (H100 80GB when none is stated): the first
#: key the statement contains, so the 40 GB A100 comes before the family name (80 GB) and GB200 before B200.
DEVICES = {"A100-40G": "A100-SXM4-40GB", "H100": "H100-SXM5-80GB", "A100": "A100-SXM4-80GB", "A800": "A800-SXM4-80GB",
           "H800": "H800-SXM5-80GB", "GB200": "GB200-NVL72-186GB", "B200": "B200-SXM-192GB", "H200": "H200-SXM-141GB", "L40S": "L40S-48GB",
           "A10": "A10-24GB", "H20": "H20-96GB"}


def load_recipes() -> list[dict[str, Any]]:
    """The recipes of ``framework_recipes.json``, in file order."""
    doc = json.loads(resources.files("cost_model").joinpath("data/framework_recipes.json").read_text())
    out: list[dict[str, Any]] = doc["recipes"]
    return out


def recipe_body(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe as an estimate request's model, training and cluster (its strategy apart)."""
    gpus = int(recipe["gpus"])
    per_node = min(int(recipe["gpus_per_node"]), gpus)
    stated = (recipe.get("device") or "H100").upper()
    device = next((v for k, v in DEVICES.items() if k in stated), DEVICES["H100"])
    return {"model": {"transformer": recipe["model"], "name": recipe["id"]}, "training": recipe["training"],
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": math.ceil(gpus / per_node), "gpus_per_node": per_node,
                                                      "device": device}]}}
