"""Identity of a plan request: its canonical form and hash, and the JSON hygiene both rely on.

Two requests that plan the same thing (defaults filled in, a saved cluster's name replaced by
its body, preset names lower-cased) have the same canonical form and the same hash; ``async``,
``force`` and ``callback_url`` are not part of it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from planner_service.planner.request import PlanRequest

#: Keys of a plan request that do not change the answer (excluded from the request hash).
NON_IDENTITY_KEYS = ("async", "force", "callback_url")


_PLAIN = frozenset({str, int, bool, type(None)})


def _flat_plain(rows: Any) -> bool:
    """Every row a dict with str keys and str/int/bool/None values (nothing to convert): one
    pass over the types, ~20x cheaper than converting each value."""
    return all(type(r) is dict for r in rows) and {type(k) for r in rows for k in r} <= {str} and {
        type(v) for r in rows for v in r.values()} <= _PLAIN


def to_json_safe(value: Any) -> Any:
    """Plain JSON types only: numpy scalars → Python, tuples → lists, NaN/±inf → None (neither
    PostgreSQL's json type nor strict JSON parsers accept them)."""
    # Exact built-in types first: a plan holds ~10^5 values (a rank entry per GPU), and the
    # generic checks below (``isinstance(…, Mapping)``) cost several times more per value.
    kind = type(value)
    if kind is dict:
        # plain leaves copied without a call (a 12,288-node cluster has ~10^5 of them)
        return {k if type(k) is str else str(k): v if type(v) in _PLAIN else to_json_safe(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        if value and type(value[0]) is dict and _flat_plain(value):
            return [dict(r) for r in value]  # a rank table: one flat dict of str/int per GPU
        if {type(v) for v in value} <= _PLAIN:  # host names, domains
            return list(value)
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
    cluster = req.cluster.to_dict()
    out = to_json_safe(
        {
            "model": _canonical_model(body["model"]),
            "training": req.training.to_dict(),
            "cluster": {k: None if k == "nodes" else v for k, v in cluster.items()},
            "constraints": req.constraints.to_dict(),
            "objective": req.objective,
            "top_k": req.top_k,
            "profile_id": req.profile_id,
        }
    )
    # the node entries are plain JSON as Cluster.to_dict writes them (strings, booleans, lists
    # of strings): not copied again (12,288 dicts and their domain lists)
    out["cluster"]["nodes"] = cluster["nodes"]
    return out


def request_hash(canonical: Mapping[str, Any]) -> str:
    """SHA-256 of the sorted-key, whitespace-free JSON of the canonical request."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()
