"""The HTTP API end to end (TestClient), on SQLite and PostgreSQL, with the real planner except
where a test needs a slow or failing one (injected through the app factory)."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from cost_model.errors import NoFeasiblePlan
from helpers.requests import SMALL_CLUSTER, TWO_NODE_CLUSTER, small_request
from planner_service.service.identity import canonical_request, request_hash


def wait_job(client, job_id: str, until=("succeeded", "failed", "cancelled"), timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in until:
            return job
        assert time.monotonic() < deadline, f"job stuck: {job}"
        time.sleep(0.02)


def test_health_ready_catalogs(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    devices = {d["name"]: d for d in client.get("/v1/devices").json()["items"]}
    assert devices["A100-SXM4-80GB"]["memory_GB"] == 80
    presets = {p["name"]: p for p in client.get("/v1/presets").json()["items"]}
    assert "gpt3-125m" in presets and presets["llama3-8b"]["num_hidden_layers"] == 32


def test_post_plan_then_identical_post_returns_it(client):
    r = client.post("/v1/plans", json=small_request())
    assert r.status_code == 201, r.text
    plan = r.json()
    assert r.headers["location"] == f"/v1/plans/{plan['id']}"
    for key in ("id", "status", "request_hash", "created_at", "parent_id", "model", "cluster", "training",
                "objective", "best", "alternatives", "search", "explanation", "warnings"):
        assert key in plan, key
    assert plan["model"]["name"] == "gpt3-125m" and plan["model"]["params"] > 100e6
    assert plan["cluster"]["name"] == "one-node" and plan["training"]["global_batch_size"] == 64
    assert plan["status"] in ("optimal", "feasible") and plan["parent_id"] is None
    best = plan["best"]
    assert set(best) >= {"strategy", "prediction", "stages", "ranks"}
    assert best["prediction"]["tokens_per_s"] > 0 and plan["summary"]["tokens_per_s"] == best["prediction"]["tokens_per_s"]
    assert len(best["ranks"]) == plan["summary"]["num_devices"] == 8

    again = client.post("/v1/plans", json=small_request())
    assert again.status_code == 200 and again.json()["id"] == plan["id"]
    # The same request spelled differently (defaults explicit, keys reordered, async flag) is the same request.
    spelled = {"cluster": SMALL_CLUSTER, "training": {"sequence_length": 2048, "global_batch_size": 64, "dtype": "bf16", "optimizer": "adam"},
               "model": {"preset": "GPT3-125M"}, "objective": "throughput", "top_k": 3, "async": True}
    same = client.post("/v1/plans", json=spelled)
    assert same.status_code == 200 and same.json()["id"] == plan["id"]
    assert client.get(f"/v1/plans/{plan['id']}").json() == plan


def test_force_replans_as_a_new_revision(client):
    first = client.post("/v1/plans", json=small_request()).json()
    forced = client.post("/v1/plans", json=small_request(force=True))
    assert forced.status_code == 201
    assert forced.json()["id"] != first["id"] and forced.json()["revision"] == 1
    assert forced.json()["request_hash"] == first["request_hash"]
    latest = client.post("/v1/plans", json=small_request())
    assert latest.status_code == 200 and latest.json()["id"] == forced.json()["id"]


def test_canonical_request_round_trips(client):
    service = client.app.state.service
    body = small_request(constraints={"max_tp": 4, "recompute": "none"}, top_k=2)
    req = service.parse(body)
    canonical = canonical_request(body, req)
    assert request_hash(canonical_request(canonical, service.parse(canonical))) == request_hash(canonical)
    assert "async" not in canonical and "force" not in canonical and "callback_url" not in canonical


def test_list_filters_sort_and_pagination(client):
    ids = []
    for gbs in (8, 16, 32, 64):
        r = client.post("/v1/plans", json=small_request(training={"global_batch_size": gbs, "sequence_length": 2048}))
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    other = client.post("/v1/plans", json=small_request(model={"preset": "gpt3-350m"}, cluster=TWO_NODE_CLUSTER))
    assert other.status_code == 201, other.text

    def listing(**params):
        r = client.get("/v1/plans", params=params)
        assert r.status_code == 200, r.text
        return r.json()

    assert len(listing()["items"]) == 5
    newest_first = [p["id"] for p in listing()["items"]]
    assert newest_first[1:] == ids[::-1]
    assert {p["id"] for p in listing(model="gpt3-125m")["items"]} == set(ids)
    assert [p["id"] for p in listing(cluster="two-node")["items"]] == [other.json()["id"]]
    assert len(listing(device="A100-SXM4-80GB")["items"]) == 5
    assert len(listing(device="a100")["items"]) == 5  # alias resolved through the catalog
    assert listing(device="H100-SXM5-80GB")["items"] == []
    by_tps = listing(sort="-tokens_per_s")["items"]
    assert [p["tokens_per_s"] for p in by_tps] == sorted((p["tokens_per_s"] for p in by_tps), reverse=True)
    floor = by_tps[2]["tokens_per_s"]
    assert {p["id"] for p in listing(min_tokens_per_s=floor)["items"]} == {p["id"] for p in by_tps[:3]}
    status = by_tps[0]["status"]
    assert all(p["status"] == status for p in listing(status=status)["items"])
    hour = timedelta(hours=1)
    now = datetime.now(UTC)
    assert len(listing(created_after=(now - hour).isoformat(), created_before=(now + hour).isoformat())["items"]) == 5
    assert listing(created_after=(now + hour).isoformat())["items"] == []
    # pagination
    seen, cursor = [], None
    while True:
        page = listing(limit=2, **({"cursor": cursor} if cursor else {}))
        assert len(page["items"]) <= 2
        seen += [p["id"] for p in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == newest_first
    summary = listing(limit=1)["items"][0]
    assert set(summary) >= {"id", "status", "model", "cluster_name", "device_types", "num_devices", "tokens_per_s", "step_time_s", "mfu", "strategy"}


def test_delete(client):
    plan = client.post("/v1/plans", json=small_request()).json()
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    assert client.get(f"/v1/plans/{plan['id']}").status_code == 404
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 404
    assert client.post("/v1/plans", json=small_request()).status_code == 201  # planned again


def test_replan_after_a_node_dies_and_after_nodes_are_added(client):
    parent = client.post("/v1/plans", json=small_request(cluster=TWO_NODE_CLUSTER)).json()
    assert len(parent["best"]["ranks"]) == 16
    r = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": ["node-1"]})
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["parent_id"] == parent["id"] and child["id"] != parent["id"]
    assert len(child["best"]["ranks"]) <= 8
    hosts = {rk.get("host", rk.get("hostname")) for rk in child["best"]["ranks"]}
    assert hosts == {"node-0"}
    diff = child["diff"]
    assert diff["parent_id"] == parent["id"]
    assert diff["tokens_per_s_before"] == parent["best"]["prediction"]["tokens_per_s"]
    assert diff["tokens_per_s_after"] == child["best"]["prediction"]["tokens_per_s"]
    assert diff["ranks_before"] == 16 and diff["ranks_moved"] >= 8
    # Alternatives carry their ranks as in a fresh plan (the replan places them lazily).
    assert child["alternatives"]
    for alt in child["alternatives"]:
        assert len(alt["ranks"]) == alt["prediction"]["num_devices"]
        assert {rk["host"] for rk in alt["ranks"]} <= {"node-0"}
    assert isinstance(diff["strategy_changed"], bool) and isinstance(diff["strategy_changes"], dict)
    down = [n for n in child["cluster"]["nodes"] if not n["available"]]
    assert [n["hostname"] for n in down] == ["node-1"]

    grown = client.post(f"/v1/plans/{child['id']}/replan", json={"added_nodes": [{"hostname": "node-9", "group": "g0"}]})
    assert grown.status_code == 201, grown.text
    g = grown.json()
    assert g["parent_id"] == child["id"]
    assert "node-9" in g["cluster"]["node_groups"][0]["hostnames"] and g["cluster"]["node_groups"][0]["count"] == 3
    assert client.get("/v1/plans", params={"parent_id": parent["id"]}).json()["items"][0]["id"] == child["id"]
    assert client.delete(f"/v1/plans/{parent['id']}").status_code == 409


def test_estimate(client):
    body = {**small_request(), "strategy": {"dp": 4, "tp": 2, "micro_batch_size": 2}}
    r = client.post("/v1/estimate", json=body)
    assert r.status_code == 200, r.text
    est = r.json()
    for key in ("step_time_s", "tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "fits", "peak_memory_GB", "breakdown_s"):
        assert key in est, key
    assert est["tokens_per_s"] > 0 and est["fits"] is True


def test_an_estimates_strategy_in_a_plan_request_says_where_pins_go(client):
    """A plan request with an estimate's ``strategy``: a 422 naming it and saying that a plan pins
    under ``constraints``, and nothing stored; elsewhere an unknown field is just unknown."""
    r = client.post("/v1/plans", json={**small_request(), "strategy": {"tp": 2}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "strategy", r.text
    assert "constraints" in r.json()["error"]["message"]
    assert client.get("/v1/plans").json()["items"] == []
    r = client.post("/v1/estimate", json={**small_request(), "strategy": {"dp": 8}, "constraints": {"tp": 2}})
    said = r.json()["error"]["message"]
    assert r.status_code == 422 and r.json()["error"]["field"] == "constraints" and said.startswith("is not a known field"), r.text
    assert "strategy" in said and "constraints" not in said.split(";", 1)[1]  # the estimate's fields, as the CLI lists them


def test_fused_kernels_through_the_api(client):
    """``training.fused_kernels`` reaches the cost model through /v1/estimate, is part of a plan's
    identity (a plain-PyTorch run is a different request), and a bad value is a 422 naming it."""
    body = {**small_request(), "strategy": {"dp": 4, "tp": 2, "micro_batch_size": 2}}
    fused = client.post("/v1/estimate", json=body).json()
    eager_body = {**body, "training": {**body["training"], "fused_kernels": False}}
    eager = client.post("/v1/estimate", json=eager_body).json()
    assert eager["breakdown_s"]["optimizer"] > 1.5 * fused["breakdown_s"]["optimizer"]
    a = client.post("/v1/plans", json=small_request()).json()
    b = client.post("/v1/plans", json={**small_request(), "training": {**small_request()["training"], "fused_kernels": False}}).json()
    assert a["request_hash"] != b["request_hash"] and b["training"]["fused_kernels"] is False
    bad = client.post("/v1/estimate", json={**body, "training": {**body["training"], "fused_kernels": "no"}})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "training.fused_kernels"


def test_ulysses_under_fsdp_through_the_api(client):
    """verl's FSDP trainers run Ulysses (``training.cp_comm_type: a2a`` under ``fsdp``): estimated
    and planned with the all-to-all's cost; torchtitan's launch, which would all-gather K/V, is a
    422 naming the target, the torchrun launch (the trainer's own script) is not."""
    training = {"global_batch_size": 8, "sequence_length": 16384, "framework": "fsdp", "cp_comm_type": "a2a"}
    body = {**small_request(), "training": training, "constraints": {"cp": 4, "zero_stage": 3}}
    est = client.post("/v1/estimate", json={**small_request(), "training": training,
                                            "strategy": {"dp": 2, "cp": 4, "zero_stage": 3, "micro_batch_size": 1}})
    assert est.status_code == 200 and est.json()["breakdown_s"]["cp_comm"] > 0, est.text
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code in (200, 201) and plan.json()["best"]["strategy"]["cp"] == 4, plan.text
    pid = plan.json()["id"]
    titan = client.get(f"/v1/plans/{pid}/launch", params={"target": "torchtitan", "format": "json"})
    assert titan.status_code == 422 and titan.json()["error"]["field"] == "target", titan.text
    assert "ulysses_sequence_parallel_size=4" in titan.json()["error"]["message"]
    assert client.get(f"/v1/plans/{pid}/launch", params={"target": "torchrun", "format": "json"}).status_code == 200


def test_saved_cluster_by_name(client):
    client.app.state.repository.save_cluster("lab", SMALL_CLUSTER)
    r = client.post("/v1/plans", json=small_request(cluster="lab"))
    assert r.status_code == 201, r.text
    assert r.json()["cluster"]["name"] == "one-node"
    # Same content inline is the same request.
    assert client.post("/v1/plans", json=small_request()).json()["id"] == r.json()["id"]


def test_async_job_runs_in_process_and_links_the_plan(client):
    r = client.post("/v1/plans", json=small_request(**{"async": True}))
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/v1/jobs/{job['id']}" and job["status"] in ("queued", "running")
    done = wait_job(client, job["id"])
    assert done["status"] == "succeeded" and done["progress"] == 1.0 and done["attempts"] == 1
    plan = client.get(f"/v1/plans/{done['plan_id']}").json()
    assert plan["request_hash"] == client.post("/v1/plans", json=small_request()).json()["request_hash"]
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 409  # already finished


def test_large_search_becomes_a_job(make_client):
    client = make_client(search_size_fn=lambda req: 10**9, sync_max_candidates=1000)
    r = client.post("/v1/plans", json=small_request())
    assert r.status_code == 202
    assert wait_job(client, r.json()["id"])["status"] == "succeeded"


def _slow_planner(started: threading.Event):
    def plan(req, settings, progress=None, should_cancel=None):
        started.set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if progress:
                progress(0.5)
            if should_cancel and should_cancel():
                raise NoFeasiblePlan("cancelled", field=None)
            time.sleep(0.01)
        raise AssertionError("never cancelled")

    return plan


def test_cancel_a_running_job(make_client):
    started = threading.Event()
    client = make_client(plan_fn=_slow_planner(started), job_lease_timeout_s=0.6)
    job = client.post("/v1/plans", json=small_request(**{"async": True})).json()
    assert started.wait(10)
    running = wait_job(client, job["id"], until=("running",))
    r = client.delete(f"/v1/jobs/{job['id']}")
    assert r.status_code == 200 and r.json()["cancel_requested"] is True
    done = wait_job(client, job["id"])
    assert done["status"] == "cancelled" and done["plan_id"] is None
    assert running["progress"] >= 0.0
    assert client.get("/v1/plans").json()["items"] == []


def test_cancel_a_queued_job(make_client):
    client = make_client(start_worker=False)
    job = client.post("/v1/plans", json=small_request(**{"async": True})).json()
    r = client.delete(f"/v1/jobs/{job['id']}")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"


def test_identical_async_requests_share_a_queued_job(make_client):
    client = make_client(start_worker=False)
    a = client.post("/v1/plans", json=small_request(**{"async": True})).json()
    b = client.post("/v1/plans", json=small_request(**{"async": True})).json()
    assert a["id"] == b["id"]


def test_failing_planner_fails_the_job_with_its_error(make_client):
    def infeasible(req, settings, progress=None, should_cancel=None):
        raise NoFeasiblePlan("no strategy fits: needs at least 41.3 GB per GPU, devices have 40 GB", field="cluster")

    client = make_client(plan_fn=infeasible)
    sync = client.post("/v1/plans", json=small_request())
    assert sync.status_code == 422 and sync.json()["error"]["code"] == "no_feasible_plan"
    job = client.post("/v1/plans", json=small_request(**{"async": True})).json()
    done = wait_job(client, job["id"])
    assert done["status"] == "failed" and done["error"]["code"] == "no_feasible_plan" and "41.3 GB" in done["error"]["message"]


def test_planner_bug_fails_the_job_not_the_worker(make_client):
    calls = []

    def buggy(req, settings, progress=None, should_cancel=None):
        calls.append(1)
        raise ZeroDivisionError("oops")

    client = make_client(plan_fn=buggy)
    first = wait_job(client, client.post("/v1/plans", json=small_request(**{"async": True})).json()["id"])
    assert first["status"] == "failed" and first["error"]["code"] == "internal_error"
    second = wait_job(client, client.post("/v1/plans", json=small_request(force=True, **{"async": True})).json()["id"])
    assert second["status"] == "failed" and len(calls) == 2  # the worker thread survived


class _Recorder(BaseHTTPRequestHandler):
    received: list = []
    headers_seen: list = []
    raw: list = []

    def do_POST(self):  # noqa: N802 - http.server API
        length = int(self.headers.get("content-length", 0))
        raw = self.rfile.read(length)
        type(self).headers_seen.append(dict(self.headers))
        type(self).raw.append(raw)
        type(self).received.append(json.loads(raw))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):  # silence
        pass


def test_callback_url_gets_the_finished_job(make_client):
    """A callback to an allowed host (loopback allowed explicitly here), signed with HMAC."""
    from planner_service.service.worker import sign

    client = make_client(callback_allowed_hosts="127.0.0.1", callback_allow_private=True, callback_secret="s3cret")
    _Recorder.received, _Recorder.headers_seen, _Recorder.raw = [], [], []
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        job = client.post("/v1/plans", json=small_request(**{"async": True, "callback_url": url})).json()
        done = wait_job(client, job["id"])
        deadline = time.monotonic() + 10
        while not _Recorder.received and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _Recorder.received and _Recorder.received[0]["job"]["id"] == job["id"]
        assert _Recorder.received[0]["job"]["status"] == done["status"] == "succeeded"
        assert _Recorder.received[0]["job"]["plan_id"] == done["plan_id"]
        headers = {k.lower(): v for k, v in _Recorder.headers_seen[0].items()}
        assert headers["x-planner-signature"] == sign("s3cret", headers["x-planner-timestamp"], _Recorder.raw[0])
    finally:
        server.shutdown()


SERVICE_BODIES = {("/v1/plans", "post"), ("/v1/plans/{plan_id}/replan", "post"), ("/v1/estimate", "post")}


def test_openapi_documents_every_request_body_with_examples(client):
    spec = client.get("/openapi.json").json()
    for path, method in SERVICE_BODIES:
        content = spec["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert content.get("examples"), f"{method.upper()} {path} has no examples"
        for example in content["examples"].values():
            assert example["value"] and example["summary"]
    for path in ("/v1/plans", "/v1/plans/{plan_id}", "/v1/jobs/{job_id}", "/v1/devices", "/v1/presets", "/healthz", "/readyz", "/metrics"):
        assert path in spec["paths"], path
    assert client.get("/docs").status_code == 200


def test_openapi_examples_are_accepted(client):
    """The documented examples are valid requests (those that need no saved state)."""
    from planner_service.api.schemas import ESTIMATE_EXAMPLES, PLAN_EXAMPLES

    assert client.post("/v1/estimate", json=ESTIMATE_EXAMPLES["megatron_style"]["value"]).status_code == 200
    assert client.post("/v1/plans", json=PLAN_EXAMPLES["preset"]["value"]).status_code == 201
    body = dict(PLAN_EXAMPLES["hf_config_async"]["value"])
    body.pop("callback_url", None)
    assert client.post("/v1/plans", json=body).status_code == 202


def test_metrics(client):
    client.post("/v1/plans", json=small_request())
    client.post("/v1/plans", json=small_request())
    text = client.get("/metrics").text
    assert 'planner_http_requests_total{method="POST",route="/v1/plans",status="201"} 1.0' in text
    assert 'planner_http_requests_total{method="POST",route="/v1/plans",status="200"} 1.0' in text
    assert "planner_http_request_duration_seconds_bucket" in text
    assert "planner_plans_stored{status=" in text
    assert 'planner_plans_created_total{kind="plan"} 1.0' in text


def test_lost_database_is_a_503_not_a_500(make_client, db_url):
    if not db_url.startswith("sqlite"):
        pytest.skip("simulated by removing the SQLite file")
    import os

    client = make_client(start_worker=False)
    path = db_url.removeprefix("sqlite:///")
    client.app.state.repository.engine.dispose()
    os.remove(path)  # new connections see an empty database without the planner schema
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "planner db upgrade" in ready.json()["error"]["message"]
    listing = client.get("/v1/plans")
    assert listing.status_code == 503 and listing.json()["error"]["code"] == "database_unavailable"


@pytest.mark.parametrize("top_k", [0, 2])
def test_a_replan_explains_the_alternatives_it_keeps_each_with_its_stages(client, top_k):
    # a replan weighs more candidates than it keeps (REPLAN_MIN_TOP_K): the stored entries get
    # their stages and the explanation is over them, explanation.alternatives[i] for alternatives[i]
    parent = client.post("/v1/plans", json={**small_request(cluster=TWO_NODE_CLUSTER), "top_k": top_k}).json()
    child = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": ["node-1"]}).json()
    assert len(child["alternatives"]) <= top_k
    assert len(child["explanation"]["alternatives"]) == len(child["alternatives"])
    for entry in (child["best"], *child["alternatives"]):
        assert list(entry)[:3] == ["strategy", "prediction", "stages"]
        assert len(entry["stages"]) == entry["strategy"]["pp"]
        assert sum(s["num_gpus"] for s in entry["stages"]) == entry["prediction"]["num_devices"]
        assert {h for s in entry["stages"] for h in s["hosts"]} == {"node-0"}
    assert client.get(f"/v1/plans/{child['id']}").json()["explanation"] == child["explanation"]


def test_replan_keeps_surviving_ranks_in_place_when_a_spare_node_exists(client):
    """One node of a 4-node plan dies while a fifth, spare node is up: the same strategy is
    kept and only that node's 8 ranks move (to the spare)."""
    body = {
        "model": {"preset": "gpt3-1.3b"},
        "training": {"global_batch_size": 256, "sequence_length": 2048},
        "cluster": {"name": "spare", "node_groups": [{"name": "g0", "count": 5, "gpus_per_node": 8, "device": "A100-SXM4-80GB",
                                                      "hostnames": [f"node-{i}" for i in range(5)]}]},
        "constraints": {"max_devices": 32},
    }
    parent = client.post("/v1/plans", json=body).json()
    used = {r["host"] for r in parent["best"]["ranks"]}
    victim = sorted(used)[1]
    child = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": [victim]}).json()
    assert child["diff"]["strategy_changed"] is False
    assert child["diff"]["ranks_moved"] == 8
    assert victim not in {r["host"] for r in child["best"]["ranks"]}


def test_an_imported_clusters_gpu_product_reaches_the_kubernetes_launch(client):
    """GPU Feature Discovery's ``nvidia.com/gpu.product``, read by the k8s-nodes importer, is part
    of the saved cluster, of the plan's cluster and of the launch's node affinity — it was once
    dropped when the cluster was parsed, so only hand-made plans carried it."""
    nodes = json.loads((Path(__file__).parents[1] / "importers" / "samples" / "k8s_nodes.json").read_text())
    r = client.post("/v1/clusters/import", params={"format": "k8s-nodes", "name": "gfd", "save": "true"}, json=nodes)
    assert r.status_code == 200, r.text
    body = {"model": {"preset": "gpt3-125m"}, "training": {"global_batch_size": 16, "sequence_length": 1024}, "cluster": "gfd",
            "constraints": {"allowed_device_types": ["H100-SXM5-80GB"]}, "top_k": 0}
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    groups = plan.json()["cluster"]["node_groups"]
    assert {g.get("gpu_product") for g in groups} >= {"NVIDIA-H100-80GB-HBM3"}
    art = client.get(f"/v1/plans/{plan.json()['id']}/launch", params={"target": "volcano", "format": "json", "image": "nvcr.io/nvidia/pytorch:24.05-py3"})
    assert art.status_code == 200, art.text
    assert "nvidia.com/gpu.product" in art.json()["files"]["volcano-job.yaml"] and "NVIDIA-H100-80GB-HBM3" in art.json()["files"]["volcano-job.yaml"]
    # a misspelt field of an inline cluster is refused, naming it
    r = client.post("/v1/plans", json={**body, "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "device": "H100-SXM5-80GB",
                                                                                          "nvlink_GBps": 900}]}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "cluster.node_groups[0].nvlink_GBps", r.text


def test_a_cluster_saved_before_unknown_fields_were_refused_stays_plannable():
    """Saving refuses unknown cluster fields now; one saved before with such a field is still
    resolved by name (read leniently), while the same body given inline is refused."""
    from cost_model.errors import InvalidCluster
    from planner_service.planner.request import parse_plan_request

    old = {"name": "old", "node_groups": [{"name": "g", "count": 1, "device": "A100-SXM4-80GB", "rack": "r1"}]}
    body = {"model": {"preset": "gpt3-125m"}, "training": {"global_batch_size": 8, "sequence_length": 1024}}
    req = parse_plan_request({**body, "cluster": "old"}, resolve_cluster=lambda name: old)
    assert req.cluster.total_gpus == 8
    with pytest.raises(InvalidCluster) as exc:
        parse_plan_request({**body, "cluster": old})
    assert exc.value.field == "cluster.node_groups[0].rack"
