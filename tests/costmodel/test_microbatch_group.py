"""Megatron-Core's interleaved micro-batch group (``--microbatch-group-size-per-virtual-pipeline-
stage``, ``training.microbatch_group_size_per_vp_stage``): which groups run, what they cost, and
that a micro-batch count pp does not divide is planned with the smallest group that runs — not
refused — under Megatron-Core, while Paddle (no such setting) still refuses it.

The schedule is checked against an event simulation of Megatron-Core's own order
(``get_schedule_table`` and ``get_pp_rank_microbatches``: each rank's warm-up forwards, then
one forward and one backward, then the cool-down backwards), each chunk forward taking tf/v and
each chunk backward tb/v, a chunk starting once its rank is free and its input has arrived."""

from __future__ import annotations

import itertools

import pytest

from cost_model.errors import InvalidStrategy
from cost_model.estimate import estimate
from cost_model.frameworks import interleaved_microbatch_group, interleaved_microbatches_violation
from cost_model.schedule import (
    inflight_microbatches,
    interleaved_group_runs,
    pipeline_time_s,
    round_group,
    smallest_interleaved_group,
)
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_estimate_request, parse_plan_request


def _schedule_table(m: int, v: int, n: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in Megatron-Core's forward order: groups of n micro-batches per chunk."""
    out: list[tuple[int, int]] = []
    for first in range(0, m, n):
        last = m if first + n >= m else first + n
        out += [(mb, c) for c in range(v) for mb in range(first, last)]
    return out


def simulate(pp: int, m: int, v: int, n: int, tf: float = 1.0, tb: float = 2.0) -> tuple[float, list[float]]:
    """(step seconds, per stage the peak chunk micro-batches held / v) of the interleaved schedule."""
    table = _schedule_table(m, v, n)
    total = m * v
    orders = []
    for r in range(pp):
        warm = min(2 * (pp - r - 1) + (v - 1) * n, total)
        ops = [("F", *table[k]) for k in range(warm)]
        for k in range(total - warm):
            ops += [("F", *table[warm + k]), ("B", table[k][0], v - 1 - table[k][1])]
        ops += [("B", table[k][0], v - 1 - table[k][1]) for k in range(total - warm, total)]
        orders.append(ops)
    done: dict[tuple[str, int, int, int], float] = {}
    pos, free, live, peak = [0] * pp, [0.0] * pp, [0] * pp, [0] * pp
    moved = True
    while moved:
        moved = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, mb, c = orders[r][pos[r]]
                if kind == "F":
                    dep = ("F", mb, c, r - 1) if r > 0 else (("F", mb, c - 1, pp - 1) if c > 0 else None)
                else:
                    dep = ("B", mb, c, r + 1) if r < pp - 1 else (("B", mb, c + 1, 0) if c < v - 1 else ("F", mb, c, r))
                if dep is not None and dep not in done:
                    break
                free[r] = max(free[r], done[dep] if dep else 0.0) + (tf if kind == "F" else tb) / v
                done[(kind, mb, c, r)] = free[r]
                live[r] += 1 if kind == "F" else -1
                peak[r] = max(peak[r], live[r])
                pos[r] += 1
                moved = True
    assert pos == [len(o) for o in orders], "the order deadlocked"
    return max(free), [p / v for p in peak]


CASES = [(4, 4, 2), (2, 2, 3), (4, 8, 2), (4, 9, 2), (4, 10, 3), (4, 13, 4), (2, 7, 3), (8, 20, 2)]  # m = pp: no forwards-first special case


@pytest.mark.parametrize("pp, m, v", CASES)
def test_every_group_that_runs_keeps_the_step_and_holds_the_warm_up_the_cost_model_prices(pp, m, v):
    groups = [n for n in range(pp, m + 1) if interleaved_group_runs(m, pp, n)]
    assert groups and groups[0] == smallest_interleaved_group(m, pp)
    step, _ = pipeline_time_s([3.0] * pp, m, v)  # tf + tb = 3 per micro-batch on every stage
    for n in groups:
        simulated, held = simulate(pp, m, v, n)
        assert simulated == pytest.approx(float(step)), n
        assert held == pytest.approx([float(inflight_microbatches(i, pp, m, v, n)) for i in range(pp)]), n
    # a larger group holds more at the first stage; its step is the same
    if len(groups) > 1:
        assert simulate(pp, m, v, groups[-1])[1][0] > simulate(pp, m, v, groups[0])[1][0]


def test_the_groups_that_run_are_megatron_cores():
    """pp ≤ N ≤ m, and a last group of 0 or at least pp micro-batches; the smallest such N is
    pp exactly when pp divides m, and every m ≥ pp has one."""
    for pp, m in itertools.product(range(2, 9), range(1, 60)):
        runs = [n for n in range(1, m + 2) if interleaved_group_runs(m, pp, n)]
        assert runs == [n for n in range(pp, m + 1) if m % n == 0 or m % n >= pp]
        assert smallest_interleaved_group(m, pp) == (runs[0] if runs else 0)
        assert (smallest_interleaved_group(m, pp) == pp) is (m >= pp and m % pp == 0)
        assert bool(runs) is (m >= pp)


@pytest.mark.parametrize("pp, v", [(2, 2), (4, 2), (4, 3), (8, 2)])
def test_torchtitans_interleaved_schedule_runs_the_rounds_the_cost_model_allows_and_holds_what_it_prices(pp, v):
    """PyTorch's own ScheduleInterleaved1F1B (torchtitan's Interleaved1F1B), built over stand-in
    stages: it accepts exactly the micro-batch counts of at least pp that round_group takes (and
    fewer than pp, in one round with bubbles, which the cost model refuses instead of mispricing),
    and its per-rank action lists hold, at their peak, the chunk micro-batches
    inflight_microbatches prices for that round."""
    pipelining = pytest.importorskip("torch.distributed.pipelining.schedules", reason="needs torch")

    class Stage:  # what the schedule's constructor reads of a stage
        def __init__(self, index: int, rank: int):
            self.stage_index, self.group_rank, self.group_size, self.num_stages = index, rank, pp, pp * v
            self.is_first, self.is_last, self.has_backward = index == 0, index == pp * v - 1, True
            self.stage_index_to_group_rank: dict[int, int] = {}

    for m in range(pp, 4 * pp + 3):
        stages = [Stage(k * pp, 0) for k in range(v)]
        try:
            schedule = pipelining.ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=lambda *a: 0)
        except ValueError:
            assert round_group(m, pp) == 0 and interleaved_microbatches_violation("fsdp", num_microbatches=m, pp=pp) is not None, m
            continue
        group = round_group(m, pp)
        assert group == schedule.microbatches_per_round and interleaved_microbatches_violation("fsdp", num_microbatches=m, pp=pp) is None, m
        assert interleaved_microbatch_group("fsdp", num_microbatches=m, pp=pp) == group
        for rank in range(pp):
            live = peak = 0
            for action in schedule.pipeline_order[rank]:
                if action is not None:
                    kind = pipelining._ComputationType
                    live += {kind.FORWARD: 1, kind.FULL_BACKWARD: -1}.get(action.computation_type, 0)
                    peak = max(peak, live)
            assert peak / v == pytest.approx(float(inflight_microbatches(rank, pp, m, v, group))), (m, rank)


def test_megatron_core_takes_any_count_of_at_least_pp_and_the_others_whole_groups():
    assert interleaved_microbatches_violation("megatron-core", num_microbatches=9, pp=4) is None
    assert interleaved_microbatch_group("megatron-core", num_microbatches=9, pp=4) == 5  # 9 = 5 + 4
    assert interleaved_microbatch_group("megatron-core", num_microbatches=12, pp=4) == 4  # Megatron-Core's default
    assert interleaved_microbatches_violation("megatron-core", num_microbatches=3, pp=4)[0] == "vpp"
    field, why = interleaved_microbatches_violation("megatron-core", num_microbatches=9, pp=4, group=4)
    assert field == "microbatch_group_size_per_vp_stage" and "last group of 1" in why
    assert interleaved_microbatches_violation("megatron-core", num_microbatches=9, pp=4, group=10)[0] == "microbatch_group_size_per_vp_stage"
    for framework in ("paddle", "fsdp"):
        assert interleaved_microbatch_group(framework, num_microbatches=12, pp=4) == 4
    assert interleaved_microbatches_violation("fsdp", num_microbatches=9, pp=4)[0] == "vpp"  # not two equal rounds
    assert interleaved_microbatch_group("fsdp", num_microbatches=10, pp=4) == 5  # two rounds of 5
    # Paddle: a first group of m mod pp + pp from 2·pp micro-batches on, every forward first at pp
    assert interleaved_microbatch_group("paddle", num_microbatches=10, pp=4) == 6
    assert interleaved_microbatch_group("paddle", num_microbatches=4, pp=4) == 4
    assert interleaved_microbatches_violation("paddle", num_microbatches=6, pp=4)[0] == "vpp"


CLUSTER = {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]}
STRATEGY = {"tp": 2, "pp": 4, "vpp": 2, "dp": 1, "micro_batch_size": 4}


def _estimate(framework: str, batch: int, **training):
    body = {"model": {"preset": "llama3-8b"}, "cluster": CLUSTER, "strategy": STRATEGY,
            "training": {"global_batch_size": batch, "sequence_length": 4096, "framework": framework, **training}}
    req = parse_estimate_request(body)
    return estimate(req.model, req.training, req.cluster, req.strategy)


def test_six_micro_batches_over_four_stages_run_in_a_group_of_six_under_megatron_core_and_paddle_refuses_them():
    """24 sequences in micro-batches of 4 over pp 4, interleaved: Megatron-Core's default group
    (pp) refuses the 6 micro-batches, a group of 6 runs them (5 leaves 1) — the estimate costs
    that, says so, and holds (v − 1)·(6 − 4) = 2 more chunk micro-batches than the 8-micro-batch
    step's groups of 4; the step per micro-batch is unchanged.  Paddle's fleet refuses it (its
    interleaved schedule takes pp, or from 2·pp micro-batches on)."""
    six, eight = _estimate("megatron-core", 24), _estimate("megatron-core", 32)
    note = next(w for w in six.warnings if "groups of 6" in w)
    assert "--microbatch-group-size-per-virtual-pipeline-stage 6" in note and "2 more chunk micro-batches" in note
    assert not any("groups of" in w for w in eight.warnings)
    per_chunk = eight.stages[0].memory_GB["activations"] / float(inflight_microbatches(0, 4, 8, 2, 4))
    extra = six.stages[0].memory_GB["activations"] - eight.stages[0].memory_GB["activations"]
    assert extra == pytest.approx(per_chunk * (float(inflight_microbatches(0, 4, 6, 2, 6)) - float(inflight_microbatches(0, 4, 8, 2, 4))), rel=1e-6)
    with pytest.raises(InvalidStrategy) as e:
        _estimate("paddle", 24)
    assert e.value.field == "strategy.vpp" and "needs at least 2·pp=8 micro-batches a step (accumulate_steps), or exactly pp=4; got 6" in e.value.message


def test_a_group_asked_for_is_costed_and_one_that_cannot_run_is_refused_naming_it():
    asked = _estimate("megatron-core", 32, microbatch_group_size_per_vp_stage=8)
    default = _estimate("megatron-core", 32)
    assert asked.step_time_s == pytest.approx(default.step_time_s)
    assert asked.stages[0].memory_GB["activations"] > default.stages[0].memory_GB["activations"]
    assert any("groups of 8" in w and "as asked" in w for w in asked.warnings)
    with pytest.raises(InvalidStrategy) as e:
        _estimate("megatron-core", 32, microbatch_group_size_per_vp_stage=5)  # 8 = 5 + 3, 3 < pp
    assert e.value.field == "training.microbatch_group_size_per_vp_stage" and "last group of 3" in e.value.message


def test_the_plan_runs_the_group_and_the_megatron_launch_writes_it(client):
    body = {"model": {"preset": "llama3-8b"}, "cluster": CLUSTER, "top_k": 0,
            "training": {"global_batch_size": 24, "sequence_length": 4096}, "constraints": dict(STRATEGY)}
    direct = plan(parse_plan_request(body), SolverSettings())
    assert any("groups of 6" in w for w in direct.warnings)
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    stored = r.json()
    assert {k: stored["best"]["strategy"][k] for k in ("pp", "vpp", "dp", "micro_batch_size")} == {"pp": 4, "vpp": 2, "dp": 1, "micro_batch_size": 4}
    art = client.get(f"/v1/plans/{stored['id']}/launch?target=megatron&format=json").json()
    assert "--microbatch-group-size-per-virtual-pipeline-stage 6" in art["files"][art["primary"]]
    # groups of pp (32 sequences: 8 micro-batches) write no flag: Megatron-Core's default
    r = client.post("/v1/plans", json={**body, "training": {**body["training"], "global_batch_size": 32}})
    art = client.get(f"/v1/plans/{r.json()['id']}/launch?target=megatron&format=json").json()
    assert "--microbatch-group-size-per-virtual-pipeline-stage" not in art["files"][art["primary"]]


def test_the_http_api_takes_the_group_and_refuses_it_where_it_cannot_be(client):
    body = {"model": {"preset": "llama3-8b"}, "cluster": CLUSTER, "strategy": STRATEGY,
            "training": {"global_batch_size": 32, "sequence_length": 4096, "microbatch_group_size_per_vp_stage": 8}}
    r = client.post("/v1/estimate", json=body)
    assert r.status_code == 200, r.text
    assert any("groups of 8" in w for w in r.json()["warnings"])
    for framework, value, words in (("paddle", 8, "sets its own first group"), ("fsdp", 8, "sets its own rounds"), ("megatron-core", 1, "at least 2"),
                                    ("megatron-core", "8", "an integer")):
        bad = {**body, "training": {**body["training"], "framework": framework, "microbatch_group_size_per_vp_stage": value}}
        r = client.post("/v1/estimate", json=bad)
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["field"] == "training.microbatch_group_size_per_vp_stage" and words in error["message"], error


def test_paddle_runs_a_first_group_from_two_pp_micro_batches_and_every_forward_first_at_pp():
    """fleet's PipelineParallelWithInterleave (accumulate_steps ≥ 2·pp): a first group of
    m mod pp + pp micro-batches, then groups of pp — 10 micro-batches over pp 4 warm up with a
    first group of 6; its FthenB at accumulate_steps = pp runs every chunk forward first.  On a
    middle stage (no embedding, no head) the activations held go 4 (m = 4, every forward first),
    4.5 (m = 8, groups of 4), 5.5 (m = 10, first group 6) stage micro-batches: the two steps up
    are in the ratio 1 : 2."""
    four, eight, ten = (_estimate("paddle", 4 * m) for m in (4, 8, 10))
    assert any("first group of 6" in w for w in ten.warnings) and not any("first group" in w for w in eight.warnings)
    held = [e.stages[1].memory_GB["activations"] for e in (four, eight, ten)]
    assert [float(inflight_microbatches(1, 4, m, 2, g, m == 4)) for m, g in ((4, 4), (8, 4), (10, 6))] == [4.0, 4.5, 5.5]
    assert (held[2] - held[1]) == pytest.approx(2 * (held[1] - held[0]), rel=1e-6)


def test_the_prediction_carries_the_groups_the_schedule_runs(client):
    """The estimate says which micro-batch groups it priced (the page draws the schedule from
    them): Megatron-Core's smallest group that runs (6 micro-batches over pp 4: one group of 6),
    a group asked for, torchtitan's rounds (12 over pp 4 fall in 3 rounds of 4; 10 in 2 of 5),
    Paddle's leading group (10: a first group of 6, then groups of 4); none without interleaving."""
    assert _estimate("megatron-core", 24).microbatch_groups == (6, 6)
    assert _estimate("megatron-core", 32).microbatch_groups == (4, 4)
    assert _estimate("megatron-core", 32, microbatch_group_size_per_vp_stage=8).microbatch_groups == (8, 8)
    assert _estimate("fsdp", 40).microbatch_groups == (5, 5)
    assert _estimate("paddle", 40).microbatch_groups == (6, 4)
    flat = parse_estimate_request({"model": {"preset": "llama3-8b"}, "cluster": CLUSTER, "strategy": {**STRATEGY, "vpp": 1},
                                   "training": {"global_batch_size": 24, "sequence_length": 4096}})
    assert estimate(flat.model, flat.training, flat.cluster, flat.strategy).microbatch_groups is None
    r = client.post("/v1/estimate", json={"model": {"preset": "llama3-8b"}, "cluster": CLUSTER, "strategy": STRATEGY,
                                          "training": {"global_batch_size": 40, "sequence_length": 4096, "framework": "paddle"}})
    assert r.status_code == 200, r.text
    assert r.json()["microbatch_groups"] == {"first": 6, "later": 4}
