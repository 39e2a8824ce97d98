"""Planning wall time for four cases, side by side with exhaustive enumeration of the same
space through ``cost_model.estimate``.

The exhaustive baseline evaluates every candidate strategy of the planner's search space (each
with its near-even split, and for mixed clusters each contiguous placement of stages on device
types) by calling ``estimate`` once per candidate — the "one Python call per candidate" approach.
It would take minutes to hours, so the bench times ``estimate`` on a random sample of the
candidates (``--sample``, default 300) in the same run and multiplies the measured mean by the
candidate count; it ignores uneven splits, so the true exhaustive time is larger still.

Run: make bench-plan   (writes bench/results/plan.json)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from cost_model import estimate  # noqa: E402
from cost_model.errors import PlannerError  # noqa: E402
from cost_model.strategy import even_split  # noqa: E402
from planner_service.planner import SolverSettings, plan  # noqa: E402
from planner_service.planner.request import parse_plan_request  # noqa: E402
from planner_service.planner.transformer.search import normalise_cluster  # noqa: E402
from planner_service.planner.transformer.space import enumerate_space, strategy_at  # noqa: E402


def group(name, count, device):
    return {"name": name, "count": count, "gpus_per_node": 8, "device": device}


CASES = {
    "gpt3-175b on 128x8 A100-80GB": {
        "model": {"preset": "gpt3-175b"},
        "training": {"global_batch_size": 1536, "sequence_length": 2048},
        "cluster": {"name": "a100-1024", "node_groups": [group("a100", 128, "A100-SXM4-80GB")]},
        "target_s": 1.0,
    },
    "llama3-70b on 128x8 H100": {
        "model": {"preset": "llama3-70b"},
        "training": {"global_batch_size": 1024, "sequence_length": 8192},
        "cluster": {"name": "h100-1024", "node_groups": [group("h100", 128, "H100-SXM5-80GB")]},
        "target_s": 1.0,
    },
    "llama3-405b on 2048x8 H100": {
        "model": {"preset": "llama3-405b"},
        "training": {"global_batch_size": 2048, "sequence_length": 8192},
        "cluster": {"name": "h100-16384", "node_groups": [group("h100", 2048, "H100-SXM5-80GB")]},
        "target_s": 5.0,
    },
    "llama3-70b on 32x8 H100 + 32x8 A100 + 16x8 V100": {
        "model": {"preset": "llama3-70b"},
        # fp16: the V100s have no bf16 tensor cores; with bf16 they would simply be left out.
        "training": {"global_batch_size": 1024, "sequence_length": 4096, "dtype": "fp16"},
        "cluster": {"name": "mixed", "node_groups": [group("h100", 32, "H100-SXM5-80GB"), group("a100", 32, "A100-SXM4-80GB"), group("v100", 16, "V100-SXM2-32GB")]},
        "target_s": 10.0,
    },
}


#: Frontier-scale cases on clusters with a network topology (issue 18): search time only (an
#: exhaustive baseline over millions of placements × nesting orders is not sampled).
POD_1_7 = {"levels": [{"name": "pod", "group_size_nodes": 384, "oversubscription": 7.0}], "rail_optimized": True}
MOE_1_8T = {"name": "moe-1.8t-64e-top2", "transformer": {
    "model_type": "mixtral", "num_hidden_layers": 36, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
    "intermediate_size": 32768, "vocab_size": 128256, "num_local_experts": 64, "num_experts_per_tok": 2}}
FRONTIER = {
    "llama3-405b on 12288x8 H100 (98,304 GPUs), 32 pods, spine 1:7": {
        "model": {"preset": "llama3-405b"},
        "training": {"global_batch_size": 6144, "sequence_length": 8192},
        "cluster": {"name": "h100-98304", "node_groups": [group("h100", 12288, "H100-SXM5-80GB")], "topology": POD_1_7},
        "target_s": 5.0,
    },
    "1.8T MoE (64 experts, top-2) on 4096x8 H100 (32,768 GPUs), pods of 3,072, spine 1:7": {
        "model": MOE_1_8T,
        "training": {"global_batch_size": 4096, "sequence_length": 8192},
        "cluster": {"name": "h100-32768", "node_groups": [group("h100", 4096, "H100-SXM5-80GB")], "topology": POD_1_7},
        "target_s": 5.0,
    },
}


def request_body(case: dict) -> dict:
    """A case's plan request: the case less its ``target_s``, which is the benchmark's own."""
    return {k: v for k, v in case.items() if k != "target_s"}


def time_frontier(repeats: int) -> list[dict]:
    rows = []
    for name, case in FRONTIER.items():
        req = parse_plan_request(request_body(case))
        walls, result = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = plan(req, SolverSettings())
            walls.append(time.perf_counter() - t0)
        med = statistics.median(walls)
        best = result.best
        entry = result.to_dict(alternative_ranks=False)["best"]
        rows.append({"case": name, "plan_wall_s_median": round(med, 3), "plan_wall_s_runs": [round(w, 3) for w in walls],
                     "target_s": case["target_s"], "within_target": med <= case["target_s"], "candidates": result.search["candidates"],
                     "pruned": result.search["pruned"],
                     "solver_status": result.search["solver_status"], "best_strategy": best.strategy.to_dict(),
                     "best_step_time_s": round(best.prediction.step_time_s, 4), "best_mfu": round(best.prediction.mfu, 4),
                     "boundaries": entry.get("topology", {}).get("boundaries")})
        print(f"{name:48s} plan {med:6.2f} s (target {case['target_s']:.0f} s)  {result.search['candidates']} candidates, "
              f"status {result.search['solver_status']}, best {best.strategy.to_dict()}")
    return rows


def timed_replans(client, parent: dict, first_host: int, repeats: int) -> list[tuple[float, dict]]:
    """(wall seconds, response body) of ``repeats`` POST /v1/plans/{id}/replan, each with a
    different node of the parent plan down (the ``first_host``-th host onwards, sorted)."""
    hosts = sorted({r["host"] for r in parent["best"]["ranks"]})
    out = []
    for k in range(repeats):
        t0 = time.perf_counter()
        r = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": [hosts[first_host + k]]})
        out.append((time.perf_counter() - t0, r.json()))
    return out


def time_frontier_http(repeats: int) -> dict:
    """Through the HTTP app in-process, on the 98,304-GPU case: GET of the stored plan (98,304
    ranks; gzip when the client accepts it, as curl --compressed and browsers do) and a replan
    after losing one node (a different node each run)."""
    import tempfile

    from fastapi.testclient import TestClient

    from planner_service.api import create_app
    from planner_service.settings import ServiceSettings

    name = next(iter(FRONTIER))
    body = request_body(FRONTIER[name])
    with tempfile.TemporaryDirectory() as d:
        settings = ServiceSettings(database_url=f"sqlite:///{d}/bench.db", auto_migrate=True, sync_max_candidates=10_000_000,
                                   auth="disabled", allowed_hosts="testserver", rate_limit="")
        app = create_app(settings, start_worker=False)
        with TestClient(app) as client:
            t0 = time.perf_counter()
            parent = client.post("/v1/plans", json=body).json()
            post_s = time.perf_counter() - t0
            gets, sizes = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = client.get(f"/v1/plans/{parent['id']}", headers={"Accept-Encoding": "gzip"})
                r.json()
                gets.append(time.perf_counter() - t0)
                sizes.append(int(r.headers.get("content-length") or len(r.content)))
            runs = timed_replans(client, parent, 100, repeats)
            walls = [w for w, _ in runs]
            planner = [c.get("search", {}).get("wall_time_s") for _, c in runs]
            modes = [c.get("search", {}).get("mode") for _, c in runs]
    return {"case": name, "ranks": len(parent["best"]["ranks"]), "post_plan_s": round(post_s, 3),
            "get_plan_s_median": round(statistics.median(gets), 3), "get_plan_s_runs": [round(g, 3) for g in gets],
            "get_plan_bytes_on_wire": sizes[0], "get_target_s": 1.0,
            "replan_wall_s_median": round(statistics.median(walls), 3), "replan_wall_s_runs": [round(w, 3) for w in walls],
            "replan_planner_s_runs": planner, "replan_modes": modes, "replan_target_s": 1.0,
            "get_plan_first_s": round(gets[0], 3)}


def exhaustive_candidates(req):
    """(strategy, stage_groups) pairs of the same space, one estimate call each."""
    cluster = normalise_cluster(req.cluster, None)
    pools = [g for g in cluster.node_groups if req.training.dtype in g.device.supported_dtypes()]
    out = []
    for r in range(1, len(pools) + 1):
        import itertools

        for subset in itertools.combinations(pools, r):
            gpus = sum(g.gpus_per_node * g.count for g in subset)
            S = enumerate_space(req.model, req.training, gpus, min(g.gpus_per_node for g in subset), {})
            for j in range(len(S)):
                pp = int(S.pp[j])
                block = int(S.dp[j] * S.cp[j] * S.tp[j])
                caps = [(g.gpus_per_node * g.count) // block for g in subset]
                if sum(caps) < pp or (r > 1 and (min(caps) < 1 or pp < r or S.vpp[j] > 1)):
                    continue
                lps = even_split(req.model.num_layers, pp) if (pp > 1 and S.vpp[j] == 1) else None
                st = strategy_at(S, j, lps)
                if r == 1:
                    out.append((cluster, st, (subset[0].name,) * pp))
                else:
                    # every contiguous placement: pools in any order, each ≥ 1 stage
                    for order in itertools.permutations(subset):
                        for counts in _compositions(pp, r):
                            if all(c <= cap for c, cap in zip(counts, [caps[subset.index(g)] for g in order], strict=True)):
                                out.append((cluster, st, tuple(g.name for g, c in zip(order, counts, strict=True) for _ in range(c))))
    return out


def _compositions(total, parts):
    import itertools

    for cuts in itertools.combinations(range(1, total), parts - 1):
        b = (0,) + cuts + (total,)
        yield tuple(b[i + 1] - b[i] for i in range(parts))


def time_exhaustive(req, cands, sample, rng):
    picked = cands if len(cands) <= sample else rng.sample(cands, sample)
    t0 = time.perf_counter()
    for cluster, st, place in picked:
        with contextlib.suppress(PlannerError):
            estimate(req.model, req.training, cluster, st, stage_groups=place)
    per_call = (time.perf_counter() - t0) / max(len(picked), 1)
    return per_call, per_call * len(cands), len(picked)


def time_replan(repeats: int) -> dict:
    """POST /v1/plans/{id}/replan with one of 128 nodes down (a different node each run),
    through the app in-process; also the planner's own share (the plan's search wall time)."""
    import tempfile

    from fastapi.testclient import TestClient

    from planner_service.api import create_app
    from planner_service.settings import ServiceSettings

    body = request_body(CASES["llama3-70b on 128x8 H100"])
    with tempfile.TemporaryDirectory() as d:
        # In-process and loopback only: no keys, the TestClient's Host allowed, no rate limit.
        settings = ServiceSettings(database_url=f"sqlite:///{d}/bench.db", auto_migrate=True, auth="disabled",
                                   allowed_hosts="testserver", rate_limit="")
        app = create_app(settings, start_worker=False)
        with TestClient(app) as client:
            parent = client.post("/v1/plans", json=body).json()
            runs = timed_replans(client, parent, 10, repeats)
            walls = [w for w, _ in runs]
            planner = [c["search"]["wall_time_s"] for _, c in runs]
            moved = [c["diff"]["ranks_moved"] for _, c in runs]
    return {"case": "llama3-70b on 128x8 H100, one node down", "replan_wall_s_median": round(statistics.median(walls), 3),
            "replan_wall_s_runs": [round(w, 3) for w in walls], "target_s": 1.0,
            "planner_wall_s_median": round(statistics.median(planner), 3), "planner_wall_s_runs": [round(w, 3) for w in planner],
            "ranks_moved": moved}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--frontier-only", action="store_true", help="only the topology cases (prints; writes nothing)")
    ap.add_argument("--http-only", action="store_true",
                    help="only the 98,304-GPU GET and replan over HTTP, merged into bench/results/plan.json")
    args = ap.parse_args()
    rng = random.Random(0)
    if args.http_only:
        path = ROOT / "bench" / "results" / "plan.json"
        out = json.loads(path.read_text())
        out["frontier_http"] = time_frontier_http(args.repeats)
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(json.dumps(out["frontier_http"], indent=1))
        return 0
    if args.frontier_only:
        time_frontier(args.repeats)
        print(json.dumps(time_frontier_http(args.repeats), indent=1))
        return 0
    rows = []
    # Warm the imports (OR-tools, numpy) so process start is excluded.
    plan(parse_plan_request(request_body(CASES["gpt3-175b on 128x8 A100-80GB"])), SolverSettings())
    for name, case in CASES.items():
        req = parse_plan_request(request_body(case))
        walls = []
        result = None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = plan(req, SolverSettings())
            walls.append(time.perf_counter() - t0)
        cands = exhaustive_candidates(req)
        per_call, exhaustive_s, sampled = time_exhaustive(req, cands, args.sample, rng)
        med = statistics.median(walls)
        best = result.best
        rows.append(
            {
                "case": name,
                "plan_wall_s_median": round(med, 3),
                "plan_wall_s_runs": [round(w, 3) for w in walls],
                "target_s": case["target_s"],
                "within_target": med <= case["target_s"],
                "candidates": result.search["candidates"],
                "solver_status": result.search["solver_status"],
                "exhaustive_candidates": len(cands),
                "exhaustive_estimate_s_per_call": round(per_call, 5),
                "exhaustive_s": round(exhaustive_s, 1),
                "exhaustive_sampled_calls": sampled,
                "speedup": round(exhaustive_s / med, 1),
                "best_strategy": best.strategy.to_dict(),
                "best_devices": list(result.device_types),
                "best_step_time_s": round(best.prediction.step_time_s, 4),
                "best_mfu": round(best.prediction.mfu, 4),
            }
        )
        print(f"{name:48s} plan {med:6.2f} s (target {case['target_s']:.0f} s)  exhaustive ≈ {exhaustive_s:8.1f} s "
              f"({len(cands)} × {per_call * 1e3:.2f} ms)  speed-up {exhaustive_s / med:7.1f}×  status {result.search['solver_status']}")
    frontier = time_frontier(args.repeats)
    frontier_http = time_frontier_http(args.repeats)
    print(f"98,304 ranks over HTTP: GET plan median {frontier_http['get_plan_s_median']:.2f} s "
          f"({frontier_http['get_plan_bytes_on_wire']:,} bytes on the wire); replan after losing one node "
          f"median {frontier_http['replan_wall_s_median']:.2f} s")
    replan = time_replan(args.repeats)
    print(f"replan after losing 1 of 128 nodes (HTTP, in-process): median {replan['replan_wall_s_median']:.2f} s "
          f"(target 1 s; planner alone {replan['planner_wall_s_median']:.2f} s), ranks moved {replan['ranks_moved']}")
    import os

    out = {"cpu_count": os.cpu_count(), "loadavg": os.getloadavg()[0], "repeats": args.repeats, "rows": rows, "replan": replan,
           "frontier": frontier, "frontier_http": frontier_http}
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "plan.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
