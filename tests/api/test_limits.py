"""Limits that hold: per-tenant concurrency quotas and the server's search capacity (429 / 503
with Retry-After), the per-tenant job quota, graphs above the size threshold as jobs, uploads
streamed under their limit and capped in number, request ids and JSON log lines."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import logging
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from helpers.calibrations import add_calibration
from helpers.graphs import gpt_graph, mlp_onnx
from helpers.requests import TWO_NODE_CLUSTER, small_request
from planner_service.api.logs import REQUEST_ID, JsonFormatter, RequestIdFilter
from planner_service.api.middleware import BodyLimitMiddleware
from planner_service.importers.onnx import load_onnx_bytes
from planner_service.importers.onnx_stream import load_onnx_stream, strip_weights
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_plan_request
from planner_service.service.executor import SearchExecutor, dumps_result, loads_result
from planner_service.storage.errors import Busy

GRAPH_CLUSTER = {"name": "one-node", "node_groups": [{"name": "g0", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]}


def _blocking_planner(release: threading.Event, entered: threading.Semaphore):
    def planner(req, settings, progress=None, should_cancel=None):
        entered.release()
        assert release.wait(30), "never released"
        return plan(req, SolverSettings(time_limit_s=0.5))

    return planner


def _keys(client, *tenants: str) -> dict[str, dict[str, str]]:
    repo = client.app.state.repository
    return {t: {"Authorization": f"Bearer {repo.create_api_key(t, 'member')[0]}"} for t in tenants}


def _body(name: str) -> dict:
    return small_request(model={"preset": "gpt3-125m", "name": name})


def test_a_tenant_over_its_concurrent_searches_gets_429_others_proceed(make_client):
    release, entered = threading.Event(), threading.Semaphore(0)
    client = make_client(plan_fn=_blocking_planner(release, entered), auth="enabled", tenant_max_concurrent_searches=1, search_max_inflight=4,
                         solver_time_limit_s=3.0)
    keys = _keys(client, "team-a", "team-b")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.post, "/v1/plans", json=_body("a1"), headers=keys["team-a"])
        assert entered.acquire(timeout=30)
        over = client.post("/v1/plans", json=_body("a2"), headers=keys["team-a"])
        other = pool.submit(client.post, "/v1/plans", json=_body("b1"), headers=keys["team-b"])
        assert entered.acquire(timeout=30)  # team-b's search runs beside team-a's
        release.set()
        assert first.result().status_code == 201 and other.result().status_code == 201
    assert over.status_code == 429, over.text
    assert over.headers["Retry-After"] == "3"
    err = over.json()["error"]
    assert err["code"] == "tenant_concurrency" and "PLANNER_TENANT_MAX_CONCURRENT_SEARCHES" in err["message"]
    # the slot is free again, and a de-duplicated request never needs one
    assert client.post("/v1/plans", json=_body("a2"), headers=keys["team-a"]).status_code == 201
    assert client.app.state.executor.inflight() == 0


def test_a_plan_suggestion_searches_within_the_tenants_quota(make_client):
    """GET /v1/plans/{id}/suggestion runs a search (stores nothing): it takes a slot of the
    tenant's concurrent searches like POST /v1/plans, so a tenant at its limit gets 429 there
    too, and the slot is freed after."""
    release, entered = threading.Event(), threading.Semaphore(0)
    release.set()
    client = make_client(plan_fn=_blocking_planner(release, entered), auth="enabled", tenant_max_concurrent_searches=1, search_max_inflight=4,
                         solver_time_limit_s=3.0)
    keys = _keys(client, "team-a")
    planned = client.post("/v1/plans", json=_body("s1"), headers=keys["team-a"])
    assert planned.status_code == 201, planned.text
    assert entered.acquire(timeout=30)
    add_calibration(client, "team-a", planned.json()["cluster"]["name"])  # a newer calibration: the suggestion searches
    url = f"/v1/plans/{planned.json()['id']}/suggestion"
    release.clear()
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(client.post, "/v1/plans", json=_body("s2"), headers=keys["team-a"])
        assert entered.acquire(timeout=30)
        over = client.get(url, headers=keys["team-a"])
        release.set()
        assert busy.result().status_code == 201
    assert over.status_code == 429, over.text
    assert over.json()["error"]["code"] == "tenant_concurrency"
    after = client.get(url, headers=keys["team-a"])
    assert after.status_code == 200 and after.json()["latest_calibration_version"] == 1, after.text
    assert client.app.state.executor.inflight() == 0


def test_a_full_server_answers_503_with_retry_after(make_client):
    release, entered = threading.Event(), threading.Semaphore(0)
    client = make_client(plan_fn=_blocking_planner(release, entered), search_max_inflight=1)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/plans", json=_body("x1"))
        assert entered.acquire(timeout=30)
        full = client.post("/v1/plans", json=_body("x2"))
        health = client.get("/healthz")
        release.set()
        assert first.result().status_code == 201
    assert full.status_code == 503 and full.headers["Retry-After"] == "2"
    assert full.json()["error"]["code"] == "search_capacity"
    assert health.status_code == 200


def test_a_tenant_over_its_job_quota_gets_429(make_client):
    client = make_client(start_worker=False, auth="enabled", tenant_max_active_jobs=2)
    keys = _keys(client, "team-a", "team-b")
    for i in range(2):
        assert client.post("/v1/plans", json=small_request(**{"async": True, "model": {"preset": "gpt3-125m", "name": f"j{i}"}}),
                           headers=keys["team-a"]).status_code == 202
    third = client.post("/v1/plans", json=small_request(**{"async": True, "model": {"preset": "gpt3-125m", "name": "j2"}}), headers=keys["team-a"])
    assert third.status_code == 429 and third.headers["Retry-After"]
    assert third.json()["error"]["code"] == "tenant_concurrency" and "PLANNER_TENANT_MAX_ACTIVE_JOBS" in third.json()["error"]["message"]
    # the same request again is its queued job (no new job), and another tenant has its own quota
    again = client.post("/v1/plans", json=small_request(**{"async": True, "model": {"preset": "gpt3-125m", "name": "j0"}}), headers=keys["team-a"])
    assert again.status_code == 202
    assert client.post("/v1/plans", json=small_request(**{"async": True}), headers=keys["team-b"]).status_code == 202


def test_a_graph_above_the_size_threshold_is_a_job(make_client):
    client = make_client(start_worker=False, sync_max_graph_ops=20)
    graph = gpt_graph(layers=2, hidden=64, heads=2, vocab=128, positions=64)
    assert len(graph["ops"]) > 20
    r = client.post("/v1/plans", json={"model": {"graph": graph}, "training": {"global_batch_size": 16, "sequence_length": 64}, "cluster": GRAPH_CLUSTER})
    assert r.status_code == 202, r.text
    assert r.headers["Location"] == f"/v1/jobs/{r.json()['id']}" and r.json()["status"] == "queued"


def test_request_id_in_and_out(client):
    given = client.get("/healthz", headers={"X-Request-ID": "abc-123.x:y"})
    assert given.headers["X-Request-ID"] == "abc-123.x:y"
    made = client.get("/v1/plans/%00")  # answered by the edge middleware: still carries an id
    assert made.status_code == 404 and len(made.headers["X-Request-ID"]) == 32
    bad = client.get("/healthz", headers={"X-Request-ID": "no spaces, please" + "x" * 200})
    assert bad.headers["X-Request-ID"] != "no spaces" and len(bad.headers["X-Request-ID"]) == 32


def test_the_request_id_reaches_the_search_and_the_log_line(make_client):
    seen = []

    def planner(req, settings, progress=None, should_cancel=None):
        seen.append(REQUEST_ID.get())
        return plan(req, SolverSettings(time_limit_s=0.5))

    client = make_client(plan_fn=planner)
    assert client.post("/v1/plans", json=small_request(), headers={"X-Request-ID": "req-42"}).status_code == 201
    assert seen == ["req-42"]
    record = logging.LogRecord("planner.api", logging.ERROR, __file__, 1, "database error on %s: %s", ("POST /v1/plans", "DataError"), None)
    token = REQUEST_ID.set("req-43")
    try:
        RequestIdFilter().filter(record)
    finally:
        REQUEST_ID.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == "req-43" and line["level"] == "error" and line["logger"] == "planner.api"
    assert line["message"] == "database error on POST /v1/plans: DataError" and "exc" not in line


def test_an_upload_past_the_limit_is_refused_while_it_streams(make_client, tmp_path):
    client = make_client(max_upload_bytes=200_000)
    path = mlp_onnx(str(tmp_path / "big.onnx"), layers=2, width=256)

    def chunks():  # no Content-Length: only counting while it streams can stop it
        boundary = b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.onnx\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        yield boundary
        with open(path, "rb") as fh:
            while block := fh.read(16_384):
                yield block
        yield b"\r\n--xyz--\r\n"

    r = client.post("/v1/models/onnx", content=chunks(), headers={"Content-Type": "multipart/form-data; boundary=xyz"})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["field"] == "body" and "200000" in r.json()["error"]["message"]


def test_uploads_beyond_the_cap_get_503_before_their_body_is_read():
    inside = asyncio.Event()
    leave = asyncio.Event()

    async def app(scope, receive, send):
        await receive()
        inside.set()
        await leave.wait()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    mw = BodyLimitMiddleware(app, max_bytes=1024, upload_paths={"/v1/models/onnx": 10_000}, max_concurrent_uploads=1)
    scope = {"type": "http", "method": "POST", "path": "/v1/models/onnx", "headers": []}

    async def run() -> tuple[list[dict], list[dict], int]:
        first: list[dict] = []
        second: list[dict] = []
        reads = 0

        async def receive_first():
            return {"type": "http.request", "body": b"x" * 100, "more_body": False}

        async def receive_second():
            nonlocal reads
            reads += 1
            return {"type": "http.request", "body": b"y", "more_body": False}

        async def collect(out, message):
            out.append(message)

        task = asyncio.create_task(mw(scope, receive_first, lambda m: collect(first, m)))
        await inside.wait()
        await mw(scope, receive_second, lambda m: collect(second, m))
        leave.set()
        await task
        return first, second, reads

    first, second, reads = asyncio.run(run())
    assert first[0]["status"] == 201
    assert second[0]["status"] == 503 and (b"retry-after", b"5") in second[0]["headers"] and reads == 0
    assert json.loads(second[1]["body"])["error"]["code"] == "upload_capacity"
    assert mw.uploads_in_progress == 0


def test_stripping_the_weights_keeps_the_graph_and_drops_the_bytes(tmp_path):
    path = mlp_onnx(str(tmp_path / "m.onnx"), layers=3, width=512)
    with open(path, "rb") as fh:
        data = fh.read()
        stripped = strip_weights(fh)
    assert len(stripped) < len(data) / 20
    with open(path, "rb") as fh:
        assert load_onnx_stream(fh, name="m") == load_onnx_bytes(data, name="m")


@pytest.mark.parametrize("payload", [b"not an onnx file at all", b"\x3a\xff\xff\xff\x0f", b"\x08", b""])
def test_a_broken_upload_stream_is_an_invalid_graph(payload):
    from cost_model.errors import InvalidGraph

    with pytest.raises(InvalidGraph) as err:
        load_onnx_stream(io.BytesIO(payload))
    assert err.value.field == "model.onnx"


def test_the_process_pool_plans_like_the_planner_and_admits_per_tenant():
    req = parse_plan_request(small_request())
    settings = SolverSettings(time_limit_s=0.5)
    executor = SearchExecutor(workers=1, max_inflight=2, tenant_max=1, retry_after_s=0.5, kind="process")
    try:
        with executor.admit("a"):
            with pytest.raises(Busy) as busy, executor.admit("a"):
                pass
            assert busy.value.status == 429 and busy.value.retry_after_s == 1.0
            with executor.admit("b"), pytest.raises(Busy) as full, executor.admit("c"):
                pass
            assert full.value.status == 503
            result = executor.run(None, req, settings)
        assert executor.inflight() == 0
        assert result.to_dict()["best"]["strategy"] == plan(req, settings).to_dict()["best"]["strategy"]
        # the result's nodes are the request's own (loads_result), not copies
        assert result.cluster.nodes == req.cluster.nodes and result.cluster.nodes[0] is req.cluster.nodes[0]
        with pytest.raises(TypeError):
            executor.run(lambda *a, **k: None, req, settings)
    finally:
        executor.shutdown()


def _shared_nodes(result, req):
    own = {id(n) for n in req.cluster.nodes}
    return sum(id(n) in own for n in result.cluster.nodes)


@pytest.mark.parametrize("topology", [False, True])
def test_a_pickled_result_refers_to_the_request_for_its_cluster_and_nodes(topology):
    body = small_request(cluster=TWO_NODE_CLUSTER)
    if topology:  # nodes with their domains given, as a replan pins them: the search keeps them as they are
        body["cluster"] = {**TWO_NODE_CLUSTER, "topology": [{"name": "rack", "group_size_nodes": 1, "oversubscription": 2.0}],
                           "nodes": [{"hostname": f"node-{i}", "domains": [f"rack-{i}"]} for i in range(2)]}
    req = parse_plan_request(body)
    result = plan(req, SolverSettings(time_limit_s=0.5))
    assert _shared_nodes(result, req) == 2
    data = dumps_result(result, req)
    again = parse_plan_request(body)  # the API process's own copy of the request
    back = loads_result(data, again)
    assert back.to_dict() == result.to_dict() and back.cluster == result.cluster
    assert _shared_nodes(back, again) == 2
    assert len(data) < len(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    graph_like = replace(result, cluster=req.cluster)  # the graph search returns the request's cluster
    assert loads_result(dumps_result(graph_like, req), again).cluster is again.cluster


@pytest.mark.parametrize(("gc_freeze", "young"), [(True, 20_000), (False, 0)])
def test_search_processes_tune_their_garbage_collector_as_the_server_does(gc_freeze, young):
    # PLANNER_GC_FREEZE and PLANNER_GC_YOUNG_THRESHOLD reach the search processes: a replan's
    # 12,288-node request unpickled there otherwise runs full collections over every import
    executor = SearchExecutor(workers=1, max_inflight=1, tenant_max=1, retry_after_s=1.0, kind="process",
                              gc_freeze=gc_freeze, gc_young_threshold=young)
    try:
        pool = executor._get_pool()
        frozen = pool.submit(gc.get_freeze_count).result(timeout=120)
        threshold = pool.submit(gc.get_threshold).result(timeout=120)
    finally:
        executor.shutdown()
    assert (frozen > 0) is gc_freeze
    assert threshold[0] == (young or 700)


def test_the_server_sets_the_young_generation_threshold(make_client):
    before = gc.get_threshold()
    try:
        make_client(gc_young_threshold=12_345)
        assert gc.get_threshold() == (12_345, *before[1:])
    finally:
        gc.set_threshold(*before)


def test_database_errors_never_carry_the_statement_parameters(db_url):
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from planner_service.storage.db import make_engine

    engine = make_engine(db_url)
    try:
        assert engine.hide_parameters
        with pytest.raises(DBAPIError) as err, engine.connect() as conn:
            conn.execute(text("SELECT * FROM no_such_table WHERE name = :name"), {"name": "secret-value"})
        assert "secret-value" not in str(err.value) and "parameters hidden" in str(err.value)
    finally:
        engine.dispose()


def test_configured_logging_follows_sys_stderr_after_it_is_swapped(monkeypatch):
    """``planner serve``/``worker`` configure logging with :func:`log_config`; run under a program
    that swaps ``sys.stderr`` for a while (CliRunner), a later record must reach the stderr of
    the moment, not the swapped-out stream, closed by then ("--- Logging error ---")."""
    import io
    import logging.config
    import sys

    from planner_service.api.logs import log_config

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        borrowed = io.StringIO()
        monkeypatch.setattr(sys, "stderr", borrowed)
        logging.config.dictConfig(log_config("info", "text"))
        logging.getLogger("t").info("while borrowed")
        borrowed.close()
        now = io.StringIO()
        monkeypatch.setattr(sys, "stderr", now)
        logging.getLogger("t").info("after")
        assert "after" in now.getvalue() and "Logging error" not in now.getvalue()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
