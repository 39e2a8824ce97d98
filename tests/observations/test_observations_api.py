"""The observed-run loop over HTTP (SQLite, and PostgreSQL with PLANNER_TEST_DATABASE_URL): post
an observation, see it beside the prediction, the cluster recalibrated and versioned, new plans
costed at the new calibration, refusals (wrong model, empty, truncated), the plan never changed,
suggestions and their callback, a recalibrated replan, tenant isolation, and the migration from
the previous head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from helpers.calibrations import add_calibration
from helpers.requests import small_request
from planner_service.storage.db import make_engine, upgrade

SAMPLES = Path(__file__).parent / "samples"


def _plan(client, **overrides):
    r = client.post("/v1/plans", json=small_request(**overrides))
    assert r.status_code in (200, 201), r.text
    return r.json()


def _steps_log(step_s: float, factor: float, n: int = 10, peak_GB: float | None = None) -> str:
    doc: dict = {"step_times_s": [step_s * factor * 3] + [step_s * factor * (1 + 0.004 * (i % 3)) for i in range(n - 1)]}
    if peak_GB is not None:
        doc["memory"] = [{"rank": 0, "max_allocated_GB": peak_GB * 0.93, "max_reserved_GB": peak_GB}]
    return json.dumps(doc)


def _megatron_log_of(plan: dict) -> str:
    """A Megatron-LM log of exactly the plan's run (arguments block + iteration lines)."""
    s = plan["best"]["strategy"]
    step = plan["best"]["prediction"]["step_time_s"]
    args = {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "seq_length": 2048, "global_batch_size": 64,
            "micro_batch_size": s["micro_batch_size"], "tensor_model_parallel_size": s["tp"], "pipeline_model_parallel_size": s["pp"],
            "data_parallel_size": s["dp"], "world_size": 8}
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in sorted(args.items())]
    lines += ["-------------------- end of arguments ---------------------"]
    for i, it in enumerate(range(10, 90, 10)):
        ms = step * 1e3 * (2.5 if i == 0 else 1.2 + 0.002 * (i % 2))
        lines.append(f" iteration {it:8d}/     100 | consumed samples: {it * 64:12d} | elapsed time per iteration (ms): {ms:.2f} | "
                     f"throughput per GPU (TFLOP/s/GPU): 100.0 | global batch size:    64 | lm loss: 9.0E+00 |")
    lines.append("[Rank 0] (after 10 iterations) memory (MB) | allocated: 2000.0 | max allocated: 9000.5 | reserved: 10240.0 | max reserved: 10240.0")
    return "\n".join(lines) + "\n"


def test_observation_flows_back_and_recalibrates(client):
    plan = _plan(client)
    assert plan["calibration"] == {"cluster": "one-node", "version": 0, "source": "public"}
    before = client.get(f"/v1/plans/{plan['id']}").json()
    assert before["observed"] is None
    step = plan["best"]["prediction"]["step_time_s"]

    r = client.post(f"/v1/plans/{plan['id']}/observations", json={"log": _megatron_log_of(plan)})
    assert r.status_code == 201, r.text
    obs = r.json()
    assert obs["format"] == "megatron" and obs["cluster"] == "one-node" and obs["calibration_version"] == 0
    assert obs["observed"]["warmup_dropped"] == 1 and obs["observed"]["steps_used"] == 7
    assert obs["observed"]["step_time_s"] == pytest.approx(step * 1.201, rel=0.01)
    assert obs["observed"]["peak_memory_reserved_GB"] == pytest.approx(10240.0 * 2**20 / 1e9)
    assert obs["predicted"]["step_time_s"] == pytest.approx(step)
    assert obs["calibration"]["version"] == 1 and obs["calibration"]["n_observations"] == 1

    # the stored plan is unchanged; GET shows the observation beside the prediction
    after = client.get(f"/v1/plans/{plan['id']}").json()
    assert {k: v for k, v in after.items() if k != "observed"} == {k: v for k, v in before.items() if k != "observed"}
    seen = after["observed"]
    assert seen["observations"] == 1 and seen["step_time_s"] == pytest.approx(obs["observed"]["step_time_s"])
    assert seen["predicted_step_time_s"] == pytest.approx(step) and seen["step_error_fraction"] == pytest.approx(step / seen["step_time_s"] - 1)
    assert seen["peak_memory_as_printed_GB"] == pytest.approx(10.0)  # the log's 10,240 MiB, as predictions are compared
    assert client.get(f"/v1/plans/{plan['id']}/observations").json()["items"][0]["id"] == obs["id"]

    cal = client.get("/v1/clusters/one-node/calibration").json()
    assert cal["version"] == 1 and cal["n_observations"] == 1 and len(cal["history"]) == 1
    assert cal["residuals"][0]["observation_id"] == obs["id"]
    # the slower run pulls the GEMM efficiency down, but the prior keeps one run from explaining all of it
    assert cal["constants"]["gemm_efficiency.ampere"] < 1.0
    assert abs(cal["residuals"][0]["log_residual"]) < abs(cal["residuals"][0]["public_log_residual"])

    # a new plan on the same cluster is costed at version 1 (a new identity: not de-duplicated to the old plan)
    again = client.post("/v1/plans", json=small_request())
    assert again.status_code == 201
    new = again.json()
    assert new["calibration"]["version"] == 1 and new["calibration"]["source"] == "cluster"
    assert new["best"]["prediction"]["step_time_s"] > step
    assert new["best"]["prediction"]["interval_regime"] == "cluster:one-node@v1"
    assert new["best"]["prediction"]["step_time_s_p10"] < new["best"]["prediction"]["step_time_s"] < new["best"]["prediction"]["step_time_s_p90"]

    # a second observation: version 2, and the history keeps version 1
    r = client.post(f"/v1/plans/{new['id']}/observations", json={"log": _steps_log(step, 1.2), "format": "json"})
    assert r.status_code == 201 and r.json()["calibration"]["version"] == 2 and r.json()["calibration_version"] == 1, r.text
    cal = client.get("/v1/clusters/one-node/calibration").json()
    assert [h["version"] for h in cal["history"]] == [1, 2] and cal["n_observations"] == 2


def test_intervals_shrink_as_evidence_accumulates(client):
    plan = _plan(client)
    step = plan["best"]["prediction"]["step_time_s"]
    widths = []
    for _ in range(4):
        client.post(f"/v1/plans/{plan['id']}/observations", json={"log": _steps_log(step, 1.25)}).raise_for_status()
        cal = client.get("/v1/clusters/one-node/calibration").json()
        widths.append(cal["residual_log_sd"])
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0]


def test_wrong_model_empty_and_truncated_logs_are_422(client):
    plan = _plan(client)
    pid = plan["id"]
    wrong = (SAMPLES / "megatron_gpt1.3b_tp2_dp4.log").read_text()  # a 24-layer, 2048-wide model at tp 2
    r = client.post(f"/v1/plans/{pid}/observations", json={"log": wrong})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "observation_mismatch" and err["field"] == "log"
    assert "num_layers: log 24, plan 12" in err["message"] and "hidden_size: log 2048, plan 768" in err["message"]
    for body, field in (({"log": ""}, "log"), ({"log": '{"step_times_s": [1.0, 1.1'}, "log"), ({"log": "[1.0, 1.0]", "format": "json"}, "log"),
                        ({"log": "1", "format": "nemo"}, "format"), ({"log": 3}, "log")):
        r = client.post(f"/v1/plans/{pid}/observations", json=body)
        assert r.status_code == 422, body
        assert r.json()["error"]["field"] == field, (body, r.json())
    assert client.get(f"/v1/plans/{pid}/observations").json()["items"] == []
    assert client.get("/v1/clusters/one-node/calibration").status_code == 404
    assert client.post("/v1/plans/00000000-0000-0000-0000-000000000000/observations", json={"log": "[1,1,1]"}).status_code == 404
    assert client.get("/v1/plans/00000000-0000-0000-0000-000000000000/suggestion").status_code == 404


def test_suggestion_and_recalibrated_replan(make_client):
    sent: list[tuple[str, dict]] = []
    client = make_client(callback_allowed_hosts="hooks.example", callback_allow_private=True)

    class Recorder:
        def submit(self, url, payload):
            sent.append((url, payload))

        def stop(self):
            pass

    client.app.state.observation_callbacks = Recorder()
    plan = _plan(client)
    s = client.get(f"/v1/plans/{plan['id']}/suggestion").json()
    assert s["suggest"] is False and s["latest_calibration_version"] == 0 and "no calibration" in s["reason"]
    # observed memory at 97% of the 80 GB device (77.6 GiB as the allocator prints it, 83.3 GB of
    # 10^9 bytes): tight → a layout planned with more headroom is offered and notified
    step = plan["best"]["prediction"]["step_time_s"]
    r = client.post(f"/v1/plans/{plan['id']}/observations",
                    json={"log": _steps_log(step, 1.0, peak_GB=77.6 * 2**30 / 1e9), "callback_url": "https://hooks.example/planner"})
    assert r.status_code == 201, r.text
    s = client.get(f"/v1/plans/{plan['id']}/suggestion").json()
    assert s["memory"]["tight"] is True and s["latest_calibration_version"] == 1
    assert s["memory"]["fraction"] == pytest.approx(77.6 / 80) and s["memory"]["observed_peak_as_printed_GB"] == pytest.approx(77.6)
    assert "77.6 GiB" in s["reason"]
    assert s["suggested"]["request_changes"]["constraints"]["memory_headroom_fraction"] > 0.1
    assert s["suggest"] is True and "memory" in s["reason"] and s["suggested"]["strategy"] != plan["best"]["strategy"]
    assert len(sent) == 1 and sent[0][0] == "https://hooks.example/planner" and sent[0][1]["event"] == "plan.suggestion"
    assert sent[0][1]["suggestion"]["suggested"]["strategy"] == s["suggested"]["strategy"]
    # planner replan ID --recalibrated: a new revision at the latest calibration, with a diff
    r = client.post(f"/v1/plans/{plan['id']}/replan", json={"recalibrated": True})
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["parent_id"] == plan["id"] and new["calibration"]["version"] == 1 and new["diff"]["parent_id"] == plan["id"]
    assert new["constraints"]["memory_headroom_fraction"] > 0.1
    assert client.post(f"/v1/plans/{plan['id']}/replan", json={}).status_code == 422


def test_observations_are_tenant_scoped(make_client):
    client = make_client(auth="enabled")
    repo = client.app.state.repository
    ka, _ = repo.create_api_key("team-a", "member")
    kb, _ = repo.create_api_key("team-b", "member")
    ha, hb = {"Authorization": f"Bearer {ka}"}, {"Authorization": f"Bearer {kb}"}
    pa = client.post("/v1/plans", json=small_request(), headers=ha).json()
    pb = client.post("/v1/plans", json=small_request(), headers=hb).json()
    step = pa["best"]["prediction"]["step_time_s"]
    assert client.post(f"/v1/plans/{pa['id']}/observations", json={"log": _steps_log(step, 1.3)}, headers=ha).status_code == 201
    # B cannot see or add to A's plan's observations, and B's cluster of the same name is not calibrated by A's runs
    assert client.get(f"/v1/plans/{pa['id']}/observations", headers=hb).status_code == 404
    assert client.post(f"/v1/plans/{pa['id']}/observations", json={"log": _steps_log(step, 1.3)}, headers=hb).status_code == 404
    assert client.get("/v1/clusters/one-node/calibration", headers=hb).status_code == 404
    assert client.get("/v1/clusters/one-node/calibration", headers=ha).json()["version"] == 1
    assert client.get(f"/v1/plans/{pb['id']}", headers=hb).json()["observed"] is None
    again_b = client.post("/v1/plans", json=small_request(), headers=hb).json()
    assert again_b["calibration"]["version"] == 0 and again_b["id"] == pb["id"]


def test_migration_from_the_previous_head_keeps_plans(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine, "0002")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO clusters (tenant, name, body, created_at, updated_at) VALUES ('default', 'c1', '{}', '2026-01-01', '2026-01-01')"))
    assert upgrade(engine) == "0003"
    tables = set(inspect(engine).get_table_names())
    assert {"observations", "calibrations", "plans", "clusters"} <= tables
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM clusters")).scalar() == "c1"
    from alembic import command

    from planner_service.storage.db import _alembic_config

    with engine.connect() as conn:  # and back down
        command.downgrade(_alembic_config(conn), "0002")
        conn.commit()
    assert "observations" not in set(inspect(engine).get_table_names())
    engine.dispose()


def test_suggestion_when_a_recalibration_makes_another_layout_faster(client):
    """A plan made at the public calibration (Llama 2 70B on 4 × 8 A100 with 400 GB/s per node,
    ranked by the objective alone: a data-parallel layout across nodes); the cluster's
    calibration then says the fabric reaches 5% of the catalog's bandwidth and GEMMs 80%: the
    replicas' gradient traffic across nodes is exposed, and a layout with less data parallelism
    (a deeper pipeline) is faster by more than the interval."""
    cluster = {"name": "slow-net", "node_groups": [{"name": "g", "count": 4, "gpus_per_node": 8, "device": "A100-SXM4-80GB",
                                                    "inter_node_bandwidth_GBps": 400}]}
    plan = _plan(client, model={"preset": "llama2-70b"}, training={"global_batch_size": 128, "sequence_length": 2048}, cluster=cluster, top_k=0,
                 constraints={"tight_memory": "by_objective"})
    planned = plan["best"]["strategy"]
    assert planned["dp"] > 1
    add_calibration(client, "default", "slow-net",
                    {"fabric_efficiency.infiniband": 0.05, "framework_efficiency.megatron-core": 1.0, "gemm_efficiency.ampere": 0.8})
    s = client.get(f"/v1/plans/{plan['id']}/suggestion").json()
    assert s["latest_calibration_version"] == 1 and s["plan_calibration_version"] == 0
    assert s["suggest"] is True, s["reason"]
    assert s["suggested"]["strategy"]["dp"] < planned["dp"]
    assert s["suggested"]["improvement_fraction"] > s["suggested"]["interval_fraction"] > 0
    assert s["current"]["step_time_s"] > plan["best"]["prediction"]["step_time_s"]  # the plan's layout re-costed slower
    assert "faster" in s["reason"]


def test_a_suggestion_whose_search_finds_nothing_answers_why(make_client):
    """The suggestion's search coming back empty is an answer (200, suggest false, the planner's
    reason), not an error; a search slot refused is an error (tests/api/test_limits.py)."""
    from cost_model.errors import NoFeasiblePlan
    from planner_service.planner import SolverSettings
    from planner_service.planner import plan as run_plan
    calls: list[object] = []

    def planner(req, settings, progress=None, should_cancel=None):
        calls.append(req)
        if len(calls) > 1:
            raise NoFeasiblePlan("no strategy fits: needs at least 90 GB")
        return run_plan(req, SolverSettings(time_limit_s=0.5))

    client = make_client(plan_fn=planner)
    plan = _plan(client)
    add_calibration(client, "default", plan["cluster"]["name"])
    r = client.get(f"/v1/plans/{plan['id']}/suggestion")
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["suggest"] is False and s["suggested"] is None and len(calls) == 2
    assert s["reason"].startswith("no plan at the latest calibration") and "90 GB" in s["reason"]


def test_a_cluster_calibration_replaces_the_single_source_spread(client):
    """A DeepSpeed ZeRO-3 plan at the public calibration carries a step interval widened to the
    stage-3 constants' priors (one source informs them) and says so; once the cluster has a
    calibration of its own, its residuals bound the step: the interval is the cluster's and the
    warning goes."""
    from cost_model.estimate import SINGLE_SOURCE_WARNING

    cluster = {"name": "ds-lab", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]}
    body = {"model": {"preset": "llama2-7b"}, "training": {"global_batch_size": 32, "sequence_length": 4096, "framework": "deepspeed"},
            "cluster": cluster, "constraints": {"zero_stage": 3, "dp": 8, "micro_batch_size": 4, "recompute": "full"}}
    public_plan = _plan(client, **body)
    public = public_plan["best"]["prediction"]
    assert public["interval_regime"] == "*"
    assert any(w.startswith(SINGLE_SOURCE_WARNING) for w in public["warnings"])
    assert any(w.startswith(SINGLE_SOURCE_WARNING) for w in public_plan["warnings"])
    add_calibration(client, "default", "ds-lab")
    calibrated_plan = _plan(client, **body)
    calibrated = calibrated_plan["best"]["prediction"]
    assert calibrated["interval_regime"] == "cluster:ds-lab@v1"
    assert not any(w.startswith(SINGLE_SOURCE_WARNING) for w in calibrated["warnings"] + calibrated_plan["warnings"])
    assert calibrated["step_time_s_p10"] < calibrated["step_time_s"] < calibrated["step_time_s_p90"]


def test_observed_memory_is_compared_with_the_device_in_the_units_the_allocator_prints(client):
    """77.6 GB of 10^9 bytes is 72.3 GiB: 90% of an "80 GB" GPU, whose 80 is binary as the
    allocator and nvidia-smi print it — not the 97% that comparing 77.6 with 80 would say."""
    plan = _plan(client)
    step = plan["best"]["prediction"]["step_time_s"]
    r = client.post(f"/v1/plans/{plan['id']}/observations", json={"log": _steps_log(step, 1.0, peak_GB=77.6)})
    assert r.status_code == 201, r.text
    mem = client.get(f"/v1/plans/{plan['id']}/suggestion").json()["memory"]
    assert mem["observed_peak_GB"] == pytest.approx(77.6)
    assert mem["fraction"] == pytest.approx(77.6e9 / 2**30 / 80) and mem["tight"] is False
