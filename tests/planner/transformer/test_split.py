"""The exact single-pool stage split (planner/split.py) against CP-SAT and against enumerating
every split, on random instances and on the cost model's own coefficients."""

import numpy as np
import pytest

from cost_model.transformer.layer_cost import DP_OVERLAP_WINDOW
from helpers.bruteforce import compositions
from planner_service.planner.request import parse_plan_request
from planner_service.planner.transformer import split_cpsat as solver
from planner_service.planner.transformer.search import normalise_cluster
from planner_service.planner.transformer.space import enumerate_space
from planner_service.planner.transformer.split_cpsat import solve_split
from planner_service.planner.transformer.split_exact import (
    SplitBudgetExceeded,
    _water_fill,
    max_layers_in_memory,
    single_pool_split,
    split_objective_s,
)
from planner_service.planner.transformer.tables import (
    StageLinear,
    pool_costs,
    stage_linear,
)


def random_instance(rng: np.random.Generator, pp: int, mem_tight: bool) -> StageLinear:
    """Coefficients shaped like the cost model's: every stage runs the same layers (equal
    per-layer terms), the first and last carry the embedding and the head, activation memory
    falls with the stage index (fewer micro-batches in flight)."""
    per_layer_s = rng.uniform(0.01, 0.05)
    time_a = np.full(pp, rng.uniform(0.0, 0.01))
    time_a[0] += rng.uniform(0.0, 4.0) * per_layer_s
    time_a[-1] += rng.uniform(0.0, 4.0) * per_layer_s
    time_b = np.full(pp, per_layer_s) * (1 + rng.uniform(-1e-12, 1e-12, pp))  # rounding noise
    bwd_a, bwd_b = time_a * 2 / 3, time_b * 2 / 3
    window = rng.choice([0.0, DP_OVERLAP_WINDOW])  # the device's overlap: none (CPUs) or the GPUs'
    dp_a = np.full(pp, rng.uniform(0.0, 0.2))
    dp_b = np.full(pp, rng.uniform(0.0, 3.0) * per_layer_s)
    opt_a = np.full(pp, rng.uniform(0.0, 0.01))
    opt_a[0] += rng.uniform(0.0, 0.05)
    opt_a[-1] += rng.uniform(0.0, 0.05)
    opt_b = np.full(pp, rng.uniform(0.001, 0.01))
    mem_a = np.full(pp, 1e9) + rng.uniform(0, 1e9) * (pp - np.arange(pp)) / pp
    mem_b = (rng.uniform(0.5e9, 2e9) if mem_tight else 1e8) * (pp - np.arange(pp)) / pp + 1e8
    return StageLinear(time_a, time_b, bwd_a, bwd_b, dp_a, dp_b, window * bwd_a, window * bwd_b, opt_a, opt_b, mem_a, mem_b, np.zeros(pp))


def _cp_sat(lin, cap, L, pp, m, vpp):
    return solve_split([lin], [cap], [pp], L, pp, m, vpp, 30.0, 1, scale_ref_s=float(lin.time_b.mean()) * L / pp * m, method="cp-sat")


def _check_split(lin, cap, L, layers):
    assert sum(layers) == L and min(layers) >= 1
    assert all(n <= h for n, h in zip(layers, max_layers_in_memory(lin.mem_a, lin.mem_b, cap, L), strict=True))


@pytest.mark.parametrize("seed", range(40))
def test_exact_split_matches_cp_sat_on_random_single_pool_instances(seed):
    rng = np.random.default_rng(seed)
    pp = int(rng.integers(2, 9))
    L = int(rng.integers(pp, 41))
    m = float(rng.choice([pp, 2 * pp, 16, 64]))
    vpp = 1
    lin = random_instance(rng, pp, mem_tight=bool(rng.integers(0, 2)))
    cap = float(rng.uniform(4e9, 40e9))
    fast = single_pool_split(lin, cap, L, pp, m, vpp)
    ref = _cp_sat(lin, cap, L, pp, m, vpp)
    assert (fast is None) == (ref is None)
    if fast is None:
        return
    assert ref.status == "OPTIMAL"
    _check_split(lin, cap, L, fast.layers)
    ref_s = split_objective_s(lin, ref.layers, m, vpp)
    assert fast.objective_s == pytest.approx(split_objective_s(lin, fast.layers, m, vpp), rel=1e-12)
    assert fast.objective_s <= ref_s * (1 + 1e-9)
    assert fast.objective_s == pytest.approx(ref_s, rel=1e-7)


@pytest.mark.parametrize("seed", range(20))
def test_exact_split_matches_enumerating_every_split(seed):
    rng = np.random.default_rng(100 + seed)
    pp = int(rng.integers(2, 5))
    L = int(rng.integers(pp, 13))
    m = float(rng.choice([pp, 8, 32]))
    lin = random_instance(rng, pp, mem_tight=True)
    cap = float(rng.uniform(3e9, 20e9))
    hi = max_layers_in_memory(lin.mem_a, lin.mem_b, cap, L)
    splits = [c for c in compositions(L, pp) if all(n <= h for n, h in zip(c, hi, strict=True))]
    fast = single_pool_split(lin, cap, L, pp, m, 1)
    if not splits:
        assert fast is None
        return
    best = min(split_objective_s(lin, c, m, 1) for c in splits)
    assert fast is not None
    assert fast.objective_s == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_a_cutoff_gives_up_only_splits_that_cannot_beat_it(seed):
    rng = np.random.default_rng(300 + seed)
    pp = int(rng.integers(2, 9))
    L = int(rng.integers(pp, 41))
    m = float(rng.choice([pp, 2 * pp, 16, 64]))
    lin = random_instance(rng, pp, mem_tight=bool(rng.integers(0, 2)))
    cap = float(rng.uniform(4e9, 40e9))
    best = single_pool_split(lin, cap, L, pp, m, 1)
    if best is None:
        return
    above = single_pool_split(lin, cap, L, pp, m, 1, cutoff_s=best.objective_s * (1 + 1e-9))
    assert above is not None and above.layers == best.layers and above.pairs <= best.pairs
    assert single_pool_split(lin, cap, L, pp, m, 1, cutoff_s=best.objective_s) is None
    # through the solver entry point the search calls
    assert solve_split([lin], [cap], [pp], L, pp, m, 1, 30.0, 1, cutoff_s=best.objective_s) is None
    assert solve_split([lin], [cap], [pp], L, pp, m, 1, 30.0, 1, cutoff_s=np.inf).layers == best.layers


def test_equal_stages_get_a_level_split():
    pp, L = 4, 10
    lin = StageLinear(*(np.full(pp, v) for v in (0.01, 0.1, 0.0, 0.06, 0.0, 0.01, 0.0, 0.048, 0.0, 0.001, 1e9, 1e8)), np.zeros(pp))
    fast = single_pool_split(lin, 80e9, L, pp, 16.0, 1)
    assert sorted(fast.layers, reverse=True) == [3, 3, 2, 2]


def test_level_fill_keeps_bounds_and_total_and_is_level():
    rng = np.random.default_rng(11)
    for _ in range(500):
        k = int(rng.integers(1, 8))
        lo = rng.integers(0, 6, k)
        hi = lo + rng.integers(0, 6, k)
        target = int(rng.integers(lo.sum(), hi.sum() + 1))
        n = _water_fill(lo, hi, np.array(target))
        assert n.sum() == target and (lo <= n).all() and (n <= hi).all()
        # No layer could move from a fuller stage to one two or more layers emptier.
        assert not any(n[i] - n[j] >= 2 and n[i] > lo[i] and n[j] < hi[j] for i in range(k) for j in range(k)), (lo, hi, n)


def test_no_split_fits_memory():
    pp, L = 4, 40
    lin = random_instance(np.random.default_rng(7), pp, mem_tight=True)
    assert single_pool_split(lin, 2.5e9, L, pp, 16.0, 1) is None
    assert _cp_sat(lin, 2.5e9, L, pp, 16.0, 1) is None


@pytest.mark.parametrize("pp", [3, 7, 15])
def test_exact_split_matches_cp_sat_on_the_cost_models_coefficients(pp):
    req = parse_plan_request({
        "model": {"preset": "llama3-70b"},
        "training": {"global_batch_size": 1024, "sequence_length": 8192},
        "cluster": {"name": "h", "node_groups": [{"name": "h100", "count": 127, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
    })
    model, training = req.model, req.training
    group = normalise_cluster(req.cluster, None).node_groups[0]
    S = enumerate_space(model, training, 127 * 8, 8, {"pp": pp, "vpp": 1})
    pc = pool_costs(model, training, group, S)
    cap = group.device.memory_bytes * 0.9
    m_all = training.global_batch_size / (S.dp * S.mbs)
    checked = 0
    for j in np.random.default_rng(pp).permutation(len(S))[:12]:
        j = int(j)
        lin = stage_linear(model, training, pc, j, pp, bool(S.dp[j] * S.cp[j] * S.tp[j] >= 8))
        m = float(m_all[j])
        fast = single_pool_split(lin, cap, model.num_layers, pp, m, 1)
        ref = _cp_sat(lin, cap, model.num_layers, pp, m, 1)
        assert (fast is None) == (ref is None)
        if fast is None:
            continue
        checked += 1
        ref_s = split_objective_s(lin, ref.layers, m, 1)
        assert fast.objective_s == pytest.approx(ref_s, rel=1e-7)
    assert checked > 0


def test_solve_split_falls_back_to_cp_sat_past_the_enumeration_budget(monkeypatch):
    rng = np.random.default_rng(3)
    pp, L = 5, 30
    lin = random_instance(rng, pp, mem_tight=False)
    with pytest.raises(SplitBudgetExceeded):
        single_pool_split(lin, 80e9, L, pp, 16.0, 1, max_pairs=0)

    def over_budget(*args, **kwargs):
        raise SplitBudgetExceeded("test")

    monkeypatch.setattr(solver, "single_pool_split", over_budget)
    res = solve_split([lin], [80e9], [pp], L, pp, 16.0, 1, 30.0, 1, scale_ref_s=1.0)
    assert res is not None and res.status == "OPTIMAL"
    fast = single_pool_split(lin, 80e9, L, pp, 16.0, 1)
    assert split_objective_s(lin, res.layers, 16.0, 1) == pytest.approx(fast.objective_s, rel=1e-7)
