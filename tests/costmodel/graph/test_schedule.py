"""The one pipeline-schedule formula (cost_model.schedule) and its two users."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from cost_model import Training, simple_cluster
from cost_model.graph.assign import greedy_choices, split_stages
from cost_model.graph.evaluate import evaluate
from cost_model.graph.mesh import inflight, mesh_for
from cost_model.graph.parse import graph_from_dict
from cost_model.graph.tables import build_tables
from cost_model.schedule import exposed_dp_sync_s, inflight_microbatches, pipeline_time_s
from cost_model.transformer.calibration import overlap_compute_slowdown
from cost_model.transformer.layer_cost import dp_overlap_fraction
from cost_model.transformer.stage_cost import StageCost, combine_stages
from helpers.graphs import gpt_graph


@pytest.mark.parametrize(("p", "m", "v"), [(1, 8, 1), (4, 8, 1), (4, 16, 2), (8, 8, 4)])
def test_equal_stages_give_the_papers_bubble_fraction(p, m, v):
    t = 0.37
    pipeline, bottleneck = pipeline_time_s([t] * p, m, v)
    # Narayanan et al. 2021 §2.2: bubble fraction (p − 1)/(m·v)
    assert pipeline == pytest.approx(t * m * (1 + (p - 1) / (m * v)), rel=1e-12)
    assert bottleneck == 0


def test_uneven_stages_pay_the_slowest_m_times_and_the_rest_once_per_chunk():
    times = np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]])  # [stages, candidates]
    pipeline, bottleneck = pipeline_time_s(times, 4, np.array([1.0, 2.0]))
    assert list(bottleneck) == [1, 0]
    assert pipeline[0] == pytest.approx(4 * 3.0 + (1.0 + 2.0) / 1.0)
    assert pipeline[1] == pytest.approx(4 * 2.0 + (1.0 + 2.0) / 2.0)


def test_dp_sync_hides_behind_its_window_and_the_drain_of_later_stages():
    dp = np.array([1.0, 1.0, 1.0])
    window = np.array([0.2, 0.2, 0.2])
    bwd = np.array([0.3, 0.3, 0.3])
    # stage k hides window + k·bwd/v: 0.2, 0.5, 0.8 → exposed 0.8, 0.5, 0.2
    assert exposed_dp_sync_s(dp, window, bwd, 1, 0.0) == pytest.approx(0.8)
    assert exposed_dp_sync_s(dp, window, bwd, 3, 0.0) == pytest.approx(0.8)
    assert exposed_dp_sync_s(np.zeros(3), window, bwd, 1, 0.0) == 0.0
    # what hides behind the window slows that backward by the slowdown fraction: stage 0's
    # 0.8 + 0.1·0.2; stage 2 hides 0.2 behind its window and 0.6 behind the drain (idle)
    assert exposed_dp_sync_s(dp, window, bwd, 1, 0.1) == pytest.approx(0.8 + 0.1 * 0.2)
    assert exposed_dp_sync_s(np.array([0.1, 0.0, 0.0]), window, bwd, 1, 0.5) == pytest.approx(0.5 * 0.1)


def test_graph_evaluate_uses_the_schedule_formula():
    g = graph_from_dict(gpt_graph(layers=4, hidden=256, heads=4, vocab=1024, positions=256))
    training = Training(global_batch_size=32, sequence_length=256)
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    mesh = mesh_for(training, cluster, dp=2, t=1, pp=4, micro_batch=2)
    tables = build_tables(g, training, mesh)
    choice = greedy_choices(tables)
    stage_of_op = split_stages(tables, choice)
    ev = evaluate(tables, choice, stage_of_op)
    times = [s.time_s for s in ev.stages]
    m = mesh.num_microbatches
    assert ev.pipeline_s == pytest.approx(m * max(times) + sum(times) - max(times), rel=1e-12)
    w = dp_overlap_fraction(training, mesh.device)
    # the graph path's linear exposure (no overlap slowdown: its search optimises this formula)
    exposed = max(max(0.0, s.dp_comm_s - (w + s.index) * s.bwd_compute_s) for s in ev.stages)
    assert ev.dp_exposed_s == pytest.approx(exposed, rel=1e-12, abs=1e-15)
    assert ev.step_time_s == pytest.approx(ev.pipeline_s + ev.dp_exposed_s + ev.optimizer_s, rel=1e-12)


def test_transformer_combine_stages_uses_the_schedule_formula():
    rng = np.random.default_rng(0)
    n_stages, n_cand = 4, 5

    def stage(k: int) -> StageCost:
        fields = {f.name: np.zeros(n_cand) for f in dataclasses.fields(StageCost)}
        for name in ("forward_s", "backward_s", "pp_comm_s", "dp_comm_s", "dp_window_s", "optimizer_s"):
            fields[name] = rng.uniform(0.1, 1.0, n_cand)
        return StageCost(**fields)

    stages = [stage(k) for k in range(n_stages)]
    vpp = np.array([1.0, 2.0, 1.0, 4.0, 2.0])
    m = np.array([8.0, 8.0, 16.0, 16.0, 4.0])
    step = combine_stages(stages, SimpleNamespace(vpp=vpp), m)
    times = np.stack([st.time_s for st in stages])
    pipeline, bottleneck = pipeline_time_s(times, m, vpp)
    exposed = exposed_dp_sync_s(np.stack([st.dp_comm_s for st in stages]), np.stack([st.dp_window_s for st in stages]),
                                np.stack([st.backward_s for st in stages]), vpp, overlap_compute_slowdown())
    assert np.array_equal(step.pipeline_s, pipeline) and np.array_equal(step.bottleneck_index, bottleneck)
    assert np.array_equal(step.dp_exposed_s, exposed)
    for c in range(n_cand):  # the formula written out, per candidate
        t = times[:, c]
        assert pipeline[c] == pytest.approx(m[c] * t.max() + (t.sum() - t.max()) / vpp[c], rel=1e-12)


def test_in_flight_micro_batches_of_1f1b_and_interleaving():
    assert [inflight_microbatches(i, 4, 8) for i in range(4)] == [4, 3, 2, 1]
    assert inflight_microbatches(0, 8, 3) == 3  # capped at m
    # interleaved: 1 + (p − 1)/(p·v) times more (Korthikanti et al. 2022 §4.3)
    assert inflight_microbatches(0, 4, 8, 2) == pytest.approx(4 * (1 + 3 / 8))
    # interleaved, every stage: Megatron-Core's warm-up 2(p − i − 1) + (v − 1)·p chunk forwards
    # plus one, of 1/v of the stage each — nearly p on the last stage too, not 1 + (p − 1)/(p·v)
    assert [inflight_microbatches(i, 4, 8, 2) for i in range(4)] == pytest.approx([11 / 2, 9 / 2, 7 / 2, 5 / 2])
    assert inflight_microbatches(15, 16, 32, 8) == pytest.approx((7 * 16 + 1) / 8)
    # m = p: the same warm-up, capped at every chunk forward (Megatron-Core's get_pp_rank_microbatches,
    # PyTorch's ScheduleInterleaved1F1B); Paddle's FthenB runs every chunk forward first
    assert [inflight_microbatches(i, 4, 4, 2) for i in range(4)] == pytest.approx([4, 4, 7 / 2, 5 / 2])
    assert [inflight_microbatches(i, 4, 4, 2, forwards_first=True) for i in range(4)] == pytest.approx([4, 4, 4, 4])
    assert inflight_microbatches(0, 4, 8, 16) == pytest.approx((6 + 15 * 4 + 1) / 16)
    assert inflight(mesh_for(Training(global_batch_size=8, sequence_length=8), simple_cluster("A100-SXM4-80GB", 1),
                             dp=1, t=1, pp=4, micro_batch=1), 1) == 3
