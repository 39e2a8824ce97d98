"""The search executor: expensive searches run here, never on the threads that answer requests.

* A bounded pool (``PLANNER_SEARCH_WORKERS``): by default a pool of *processes* (``spawn``,
  started on the first search, each at a lower CPU priority), so a running search holds neither
  the API process's GIL nor its request threads — ``/healthz`` and cheap GETs stay responsive
  while searches run.  With an injected planner function (tests) a thread pool of the same size.
* Admission before a synchronous search: at most ``PLANNER_TENANT_MAX_CONCURRENT_SEARCHES``
  searches of one tenant at a time (over it: :class:`Busy` 429, ``tenant_concurrency``) and at
  most ``PLANNER_SEARCH_MAX_INFLIGHT`` on the whole process (over it: :class:`Busy` 503,
  ``search_capacity``), both with a ``Retry-After`` of about one search.  An admitted request
  waits for its result on its request thread; the bound keeps those far below the request pool.
* Job searches (the in-process worker of a SQLite deployment) use the same pool without
  admission: the worker is one thread, so at most one job search is in the pool at a time.  In a
  process pool a job's cancel is honoured by abandoning its result (the planner's own cancel
  hook cannot cross the process boundary); its progress is reported when it ends.
* A search process tunes its garbage collector as the API process does (:func:`tune_gc`):
  unpickling a 12,288-node cluster's request otherwise runs full collections over every
  imported object, ~0.1 s of each replan's search.
* A search process sends its result back with the request's cluster and nodes as references
  into the request (:func:`dumps_result`): the API process, which still holds the request,
  reads them back as its own (frozen and equal) instead of building 12,288 new nodes.

``planner worker`` processes run their searches inline (no executor): they answer no requests.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import contextvars
import functools
import gc
import io
import logging
import math
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Literal, cast

from cost_model.cluster import Node
from planner_service.planner.request import PlanRequest, SearchCancelled, SolverSettings
from planner_service.planner.result import PlanResult
from planner_service.storage.errors import Busy

log = logging.getLogger("planner.executor")

#: CPU priority (``nice`` increment) of search processes: request handling comes first.
SEARCH_NICE = 19
_POLL_S = 0.1


def tune_gc(freeze: bool, young_threshold: int) -> None:
    """The garbage collector of a server or search process (``PLANNER_GC_FREEZE``,
    ``PLANNER_GC_YOUNG_THRESHOLD``).  ``freeze`` (once per process): collect, then freeze what
    is alive (imports, catalogs) out of every later collection.  ``young_threshold`` (0: leave
    Python's 700): net container allocations between young-generation collections.

    The two go together: a full collection runs every tenth middle-generation one unless the
    objects promoted since the last are under a quarter of those it left, and after a freeze
    those are the few thousand the process holds of its own, so the guard no longer holds full
    collections back.  A 98,304-rank replan keeps ~10^5 request-scoped objects alive (the
    12,288-node cluster as dicts, nodes and copies) and ran three or four full scans of them,
    ~0.13 s of the request, for garbage that reference counting frees anyway; a young
    threshold of 20,000 lets most of it die before it is promoted (~0.03 s)."""
    if freeze and gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()
    if young_threshold:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)


def _init_search_process(gc_freeze: bool = True, gc_young_threshold: int = 0) -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(OSError, AttributeError):
        os.nice(SEARCH_NICE)
    import planner_service.planner  # noqa: F401 - import once, not on the first search

    tune_gc(gc_freeze, gc_young_threshold)


def _plan_in_process(request: PlanRequest, settings: SolverSettings) -> bytes:  # pragma: no cover - runs in the child
    from planner_service.planner import plan

    return dumps_result(plan(request, settings), request)


def _request_part(kind: str, index: int) -> Any:
    """Stands for a part of the request in a pickled result; :class:`_ResultUnpickler` reads it
    as the API process's own."""
    raise RuntimeError("a result pickled against a request is read with loads_result")


class _ResultPickler(pickle.Pickler):
    """A result with the request's cluster (the graph search returns it as is) and each of its
    nodes written as a reference into the request."""

    def __init__(self, file: io.BytesIO, request: PlanRequest) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._cluster = request.cluster
        self._nodes = {id(n): i for i, n in enumerate(request.cluster.nodes)}

    def reducer_override(self, obj: Any) -> Any:
        if obj is self._cluster:
            return _request_part, ("cluster", 0)
        if type(obj) is Node:
            i = self._nodes.get(id(obj))
            if i is not None:
                return _request_part, ("node", i)
        return NotImplemented


class _ResultUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, request: PlanRequest) -> None:
        super().__init__(file)
        self._cluster = request.cluster

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_request_part":
            return self._part
        return super().find_class(module, name)

    def _part(self, kind: str, index: int) -> Any:
        return self._cluster if kind == "cluster" else self._cluster.nodes[index]


def dumps_result(result: PlanResult, request: PlanRequest) -> bytes:
    """``result`` pickled for the process that holds ``request`` (:func:`loads_result`)."""
    out = io.BytesIO()
    _ResultPickler(out, request).dump(result)
    return out.getvalue()


def loads_result(data: bytes, request: PlanRequest) -> PlanResult:
    """The result :func:`dumps_result` wrote, with the request's cluster and nodes where it had
    them (``request`` equal to the one it was pickled against)."""
    result = _ResultUnpickler(io.BytesIO(data), request).load()
    assert isinstance(result, PlanResult)
    return result


@dataclass(frozen=True, kw_only=True)
class Started:
    """A search :meth:`SearchExecutor.start` started: its pool, its future (a pickled result
    from a process pool) and the request it plans."""

    pool: cf.Executor
    future: cf.Future[Any]
    request: PlanRequest


class SearchExecutor:
    """Bounded pool plus per-tenant and per-process admission (see the module docstring)."""

    def __init__(
        self,
        *,
        workers: int,
        max_inflight: int,
        tenant_max: int,
        retry_after_s: float,
        kind: Literal["process", "thread"] = "process",
        gc_freeze: bool = True,
        gc_young_threshold: int = 0,
    ) -> None:
        self.workers = workers
        self.gc_freeze = gc_freeze
        self.gc_young_threshold = gc_young_threshold
        self.max_inflight = max_inflight
        self.tenant_max = tenant_max
        self.retry_after_s = max(1.0, float(retry_after_s))
        self.kind = kind
        self._lock = threading.Lock()
        self._inflight = 0
        self._per_tenant: dict[str, int] = {}
        self._leaders: dict[str, threading.Event] = {}
        self._pool: cf.Executor | None = None

    # ------------------------------------------------------------------ admission
    def _retry(self) -> float:
        return float(math.ceil(self.retry_after_s))

    @contextlib.contextmanager
    def admit(self, tenant: str) -> Iterator[None]:
        """Hold one synchronous search slot of ``tenant`` (raises :class:`Busy` when none is free)."""
        with self._lock:
            mine = self._per_tenant.get(tenant, 0)
            if mine >= self.tenant_max:
                raise Busy(f"tenant {tenant!r} already runs {mine} searches, its limit (PLANNER_TENANT_MAX_CONCURRENT_SEARCHES); "
                           f"retry after {self._retry():.0f} s or send \"async\": true", status=429, retry_after_s=self._retry(),
                           code="tenant_concurrency")
            if self._inflight >= self.max_inflight:
                raise Busy(f"the server runs {self._inflight} searches, its capacity (PLANNER_SEARCH_MAX_INFLIGHT); "
                           f"retry after {self._retry():.0f} s or send \"async\": true", status=503, retry_after_s=self._retry(),
                           code="search_capacity")
            self._inflight += 1
            self._per_tenant[tenant] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight -= 1
                left = self._per_tenant[tenant] - 1
                if left:
                    self._per_tenant[tenant] = left
                else:
                    del self._per_tenant[tenant]

    @contextlib.contextmanager
    def coalesce(self, key: str, wait_s: float) -> Iterator[bool]:
        """Single flight: the first caller with ``key`` (a tenant's request hash) gets True and
        runs the search; a caller arriving while it runs waits for it (at most ``wait_s``), gets
        False, and looks for the stored plan instead of searching again — identical concurrent
        requests take one search slot, not one each."""
        with self._lock:
            event = self._leaders.get(key)
            leader = event is None
            if leader:
                event = self._leaders[key] = threading.Event()
        assert event is not None
        if not leader:
            event.wait(wait_s)
            yield False
            return
        try:
            yield True
        finally:
            with self._lock:
                del self._leaders[key]
            event.set()

    def inflight(self) -> int:
        with self._lock:
            return self._inflight

    # ------------------------------------------------------------------ running
    def _get_pool(self) -> cf.Executor:
        with self._lock:
            if self._pool is None:
                if self.kind == "process":
                    self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                        initializer=functools.partial(_init_search_process, self.gc_freeze,
                                                                                      self.gc_young_threshold))
                else:
                    self._pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="planner-search")
            return self._pool

    def run(
        self,
        fn: Callable[..., PlanResult] | None,
        request: PlanRequest,
        settings: SolverSettings,
        progress: Callable[[float], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
    ) -> PlanResult:
        """Run one search in the pool and wait for it.  ``fn`` None: the planner
        (:func:`planner_service.planner.plan`)."""
        return self.finish(self.start(fn, request, settings, progress, should_cancel), progress, should_cancel)

    def start(
        self,
        fn: Callable[..., PlanResult] | None,
        request: PlanRequest,
        settings: SolverSettings,
        progress: Callable[[float], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
    ) -> Started:
        """Start one search in the pool (:meth:`finish` waits for it): the caller's thread is
        free meanwhile (a replan builds the request's canonical form while its search runs)."""
        pool = self._get_pool()
        if self.kind == "process":
            if fn is not None:
                raise TypeError("a process pool runs the default planner only; use kind='thread' for an injected one")
            return Started(pool=pool, future=pool.submit(_plan_in_process, request, settings), request=request)
        if fn is None:
            from planner_service.planner import plan as fn
        # the request's context (its request id) goes with the search
        future = pool.submit(contextvars.copy_context().run, fn, request, settings, progress=progress, should_cancel=should_cancel)
        return Started(pool=pool, future=future, request=request)

    def finish(
        self,
        started: Started,
        progress: Callable[[float], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
    ) -> PlanResult:
        """Wait for a search :meth:`start` started."""
        try:
            result = self._wait(started.future, should_cancel)
        except BrokenProcessPool:
            self._reset_pool(started.pool)
            raise Busy("a search process died (out of memory?); retry", status=503, retry_after_s=self._retry(), code="search_capacity") from None
        if isinstance(result, bytes):  # from a search process (_plan_in_process)
            result = loads_result(result, started.request)
        if progress is not None and self.kind == "process":
            progress(1.0)
        return cast(PlanResult, result)

    @staticmethod
    def _wait(future: cf.Future[Any], should_cancel: Callable[[], bool] | None) -> Any:
        if should_cancel is None:
            return future.result()
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except cf.TimeoutError:
                if should_cancel():
                    future.cancel()
                    raise SearchCancelled("the job was cancelled") from None

    def _reset_pool(self, broken: cf.Executor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["SEARCH_NICE", "SearchExecutor", "Started", "dumps_result", "loads_result", "tune_gc"]
