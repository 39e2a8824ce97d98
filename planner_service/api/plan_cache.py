"""The encoded body of GET /v1/plans/{id} for plans with a large rank table, kept per app.

A 98,304-rank plan is ~16 MB of JSON: decoding it from the database and encoding it again took
most of a GET.  A stored plan does not change (a new revision is a new plan), so the first GET
keeps its body (less the two keys that can change: ``superseded_by`` and ``observed``) as bytes,
with a copy of the plan without its rank table for those two keys; later GETs check the plan is
still there and readable by the caller, then send the kept bytes with the two keys appended.
Bounded (least recently used out); one per app, so nothing is shared between apps or tests."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from planner_service.storage.rank_table import dumps_with_tables
from planner_service.storage.repository import StoredPlan

#: Plans with more ranks than this have their GET body kept.
CACHED_MIN_RANKS = 4096

#: Bodies kept (each about 16 MB at 98,304 ranks).
MAX_ENTRIES = 4


def dumps(value: Any) -> bytes:
    """JSON exactly as :class:`starlette.responses.JSONResponse` renders it (a rank table
    written from its columns: ``storage.rank_table``)."""
    return dumps_with_tables(value)


class PlanBodyCache:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._items: OrderedDict[str, tuple[StoredPlan, bytes]] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def __contains__(self, plan_id: str) -> bool:
        with self._lock:
            return plan_id in self._items

    def get(self, plan_id: str) -> tuple[StoredPlan, bytes] | None:
        with self._lock:
            hit = self._items.get(plan_id)
            if hit is not None:
                self._items.move_to_end(plan_id)
            return hit

    def put(self, plan: StoredPlan, body: dict[str, Any]) -> tuple[StoredPlan, bytes]:
        """Keep ``body`` (the plan JSON, without ``superseded_by`` and ``observed``) for ``plan``."""
        best = plan.result.get("best") or {}
        slim = replace(plan, result={**plan.result, "best": {k: v for k, v in best.items() if k != "ranks"}, "alternatives": []})
        entry = (slim, dumps(body))
        with self._lock:
            self._items[plan.id] = entry
            self._items.move_to_end(plan.id)
            while len(self._items) > self._max:
                self._items.popitem(last=False)
        return entry

    def discard(self, plan_id: str) -> None:
        with self._lock:
            self._items.pop(plan_id, None)


def assemble(prefix: bytes, superseded_by: Any, observed: Any) -> bytes:
    """The kept body with ``superseded_by`` and ``observed`` appended."""
    assert prefix.endswith(b"}")
    return prefix[:-1] + b',"superseded_by":' + dumps(superseded_by) + b',"observed":' + dumps(observed) + b"}"
