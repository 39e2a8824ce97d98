"""The pipeline schedule: step time of 1F1B (optionally interleaved) over possibly uneven
stages, the data-parallel gradient sync it leaves exposed, and the micro-batches each stage
holds in flight.  One formula for both model families (:func:`cost_model.transformer.stage_cost.combine_stages` and
:func:`cost_model.graph.evaluate.evaluate`).

Source: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM" (SC '21), §2.2 (1F1B and the interleaved schedule, bubble fraction
``(p − 1)/(m·v)``).

Derivation.  Stage ``i`` of ``p`` takes ``t_i`` seconds per micro-batch (forward + backward +
its point-to-point sends); there are ``m`` micro-batches and ``v`` virtual stages (model chunks)
per device.  In the steady state of 1F1B the slowest stage works without pause, one
micro-batch per ``max_i t_i``, so the ``m`` micro-batches take ``m·max_i t_i`` there.  Before
the first micro-batch reaches the slowest stage and after the last one leaves it, the pipeline
fills and drains through every other stage once; with ``v`` chunks per device a fill/drain step
is one chunk, ``t_i/v``.  Hence::

    pipeline = m·max_i t_i + (Σ_i t_i − max_i t_i)/v

For equal stages ``t`` this is ``t·m·(1 + (p − 1)/(m·v))``: the paper's bubble fraction.

The gradient all-reduce of stage ``i`` can start once its last backward is done.  Backward
runs from the last stage to the first, so stage ``i`` finishes ``i`` backward chunks
(``i·bwd_i/v``, the drain) before stage 0 does; with part of its last backward
(``window_i``, bucketed all-reduce overlapping the backward) also hiding it::

    exposed_dp = max_i max(0, dp_i − window_i − i·bwd_i/v)

The hidden part is not free: a collective that runs beside the backward holds SMs (NCCL's
channels) and HBM bandwidth, so the compute it overlaps slows by a fraction ``s`` of the
overlapped time (``overlap_compute_slowdown``, the constant of the per-micro-batch ZeRO-2/3
traffic, :func:`cost_model.transformer.layer_cost.sharded_microbatch_exposed_s`).  Only the
part hidden behind the window overlaps compute; what hides behind the drain runs while the
stage is idle::

    exposed_dp = max_i [max(0, dp_i − window_i − i·bwd_i/v) + s·min(dp_i, window_i)]

(The operator-graph path takes s = 0: its search's CP-SAT model and lower bounds price the
exposed sync linearly, and the step time it reports must be the one they optimise.)

and the step is ``pipeline + exposed_dp + optimizer`` (the optimizer step of the slowest
stage, which every stage waits for).

Micro-batch groups of the interleaved schedule.  Megatron-Core issues micro-batches to the
model chunks in groups of ``N`` per chunk (``--microbatch-group-size-per-virtual-pipeline-stage``,
pp by default; ``schedules.get_schedule_table``): N micro-batches through chunk 0, the same N
through chunk 1, …, then the next group.  It runs N in ``[pp, m]`` whose last, partial group
(``m mod N``) is empty or holds at least pp micro-batches — a shorter one would wait on its own
earlier chunks (``forward_backward_pipelining_with_interleaving`` refuses it).  The group does
not change the step time above: every group holds at least pp micro-batches, so a stage never
waits on a chunk of its own micro-batch still in flight, and the fill and drain stay
``(Σ t_i − max t_i)/v`` (tests/costmodel/test_microbatch_group.py simulates Megatron-Core's
order for every valid N and finds this step).  It changes the warm-up — ``(pp − i − 1)·2 +
(v − 1)·N`` chunk forwards before stage i's first backward (``get_pp_rank_microbatches``) —
and with it the activations held (:func:`inflight_microbatches`).  PyTorch's
``ScheduleInterleaved1F1B`` (torchtitan's Interleaved1F1B) issues the same order in rounds
(:func:`round_group`), Paddle's interleaved schedule a first group of ``m mod pp + pp`` and then
groups of pp (:func:`leading_group`).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pipeline_time_s(stage_times_s: Any, num_microbatches: Any, vpp: Any = 1) -> tuple[Any, Any]:
    """(pipeline seconds, index of the bottleneck stage) of 1F1B over stages with
    ``stage_times_s`` seconds per micro-batch each: ``m·max_i t_i + (Σ t_i − max_i t_i)/v``
    (module docstring; Narayanan et al. 2021, §2.2).

    ``stage_times_s`` has the stages along axis 0 (``[stages]`` or ``[stages, candidates]``);
    ``num_microbatches`` and ``vpp`` are scalars or broadcast over the candidates."""
    times = np.asarray(stage_times_s, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    t_max = times.max(axis=0)
    bottleneck = times.argmax(axis=0)
    pipeline = m * t_max + (times.sum(axis=0) - t_max) / vpp
    return pipeline, bottleneck


def exposed_dp_sync_each_s(dp_comm_s: Any, dp_window_s: Any, drain_s: Any, slowdown: float) -> Any:
    """Per stage, the seconds of its data-parallel sync the schedule does not hide:
    ``max(0, dp − window − drain) + s·min(dp, window)`` (module docstring), elementwise.  The
    split searches of the planner evaluate it on their own grids; :func:`exposed_dp_sync_s`
    takes the maximum over the stages."""
    dp = np.asarray(dp_comm_s, dtype=float)
    window = np.asarray(dp_window_s, dtype=float)
    return np.maximum(0.0, dp - window - np.asarray(drain_s, dtype=float)) + slowdown * np.minimum(dp, window)


def exposed_dp_sync_s(dp_comm_s: Any, dp_window_s: Any, backward_s: Any, vpp: Any, slowdown: float) -> Any:
    """Seconds of data-parallel gradient sync the schedule does not hide:
    ``max_i [max(0, dp_i − window_i − i·bwd_i/v) + s·min(dp_i, window_i)]`` (module docstring).

    ``dp_comm_s`` is each stage's sync, ``dp_window_s`` the part of its last backward the sync
    overlaps with, ``backward_s`` its backward per micro-batch, ``slowdown`` the fraction of
    the overlapped time the compute loses (``overlap_compute_slowdown``); stages along axis 0."""
    bwd = np.asarray(backward_s, dtype=float)
    index = np.arange(bwd.shape[0], dtype=float).reshape((-1,) + (1,) * (bwd.ndim - 1))
    return exposed_dp_sync_each_s(dp_comm_s, dp_window_s, index * bwd / vpp, slowdown).max(axis=0)


def interleaved_group_runs(num_microbatches: Any, pp: Any, group: Any) -> Any:
    """Whether the interleaved schedule runs ``num_microbatches`` over ``pp`` stages in groups
    of ``group`` per model chunk: ``pp ≤ N ≤ m`` and ``m mod N`` is 0 or at least pp
    (module docstring; Megatron-Core ``forward_backward_pipelining_with_interleaving``).
    Elementwise over arrays."""
    m, p, n = (np.asarray(x, dtype=np.int64) for x in (num_microbatches, pp, group))
    rest = m % np.maximum(n, 1)
    return (p <= n) & (n <= m) & ((rest == 0) | (rest >= p))


def smallest_interleaved_group(num_microbatches: int, pp: int) -> int:
    """The smallest micro-batch group that runs ``num_microbatches`` over ``pp`` stages
    (:func:`interleaved_group_runs`; the warm-up, and the activations held, grow with the group):
    pp where pp divides m, else the first N above it — at most m, which always runs (m ≥ pp).
    0 when m < pp: no group runs."""
    return next((n for n in range(pp, num_microbatches + 1) if interleaved_group_runs(num_microbatches, pp, n)), 0)


def round_group(num_microbatches: Any, pp: Any) -> Any:
    """The micro-batches per round of PyTorch's ``ScheduleInterleaved1F1B`` (torchtitan's
    Interleaved1F1B): it runs ``m`` micro-batches in ``max(1, m // pp)`` rounds and needs them to
    divide m ("Interleaved 1F1B requires the number of microbatches to be a multiple of the number
    of rounds"); each round is a group in the sense of the module docstring (its
    ``_get_warmup_ops``: ``(v − 1)·m/rounds + 2(pp − 1 − i)``).  0 where the rounds do not divide
    m, or m < pp (one round of fewer than pp micro-batches: it runs, with dependency bubbles the
    schedule above does not have).  Elementwise over arrays."""
    m, p = np.asarray(num_microbatches, dtype=np.int64), np.asarray(pp, dtype=np.int64)
    rounds = np.maximum(1, m // np.maximum(p, 1))
    return np.where((m >= p) & (m % rounds == 0), m // rounds, 0)


def leading_group(num_microbatches: Any, pp: Any) -> Any:
    """The first micro-batch group of Paddle's interleaved schedule (``PipelineParallelWithInterleave``,
    which fleet runs from ``accumulate_steps`` ≥ 2·pp): ``m mod pp + pp`` micro-batches
    (``first_chunk_acc``), then groups of pp — its warm-up ``2(pp − 1 − i) + (v − 1)·first_chunk_acc``
    (``startup_steps``).  pp when m = pp (its ``PipelineParallelWithInterleaveFthenB``: every
    forward first).  0 for the counts fleet refuses: below pp, and from pp + 1 to 2·pp − 1
    (FthenB takes multiples of pp only).  Elementwise over arrays."""
    m, p = np.asarray(num_microbatches, dtype=np.int64), np.asarray(pp, dtype=np.int64)
    return np.where(m == p, p, np.where(m < 2 * p, 0, m % np.maximum(p, 1) + p))


def inflight_microbatches(stage_index: Any, pp: Any, num_microbatches: Any, vpp: Any = 1, group: Any = None,
                          forwards_first: Any = False) -> Any:
    """Micro-batches whose activations stage ``stage_index`` holds at its peak, in units of the
    stage's whole layer set (a count; float arrays when any argument is an array).

    1F1B: ``min(pp − i, m)`` (Narayanan et al. 2021, §2.2: stage i runs ``pp − i`` forwards
    before its first backward).  Interleaved (v model chunks per stage, micro-batches issued in
    groups of pp per chunk): Megatron-Core's warm-up count
    (``schedules.get_pp_rank_microbatches``: ``(pp − i − 1)·2 + (v − 1)·pp`` chunk forwards,
    then one more before the first backward; PyTorch's ``ScheduleInterleaved1F1B`` and Paddle's
    interleaved schedule count alike) holds ``min(2(pp − i − 1) + (v − 1)·pp + 1, m·v)`` chunk
    micro-batches of ``1/v`` of the stage each — ``pp + (pp − 2i − 1)/v`` stage micro-batches when m
    is large: ``pp·(1 + (p − 1)/(p·v))`` on the first stage (Korthikanti et al. 2022, §4.3) and
    nearly pp on every stage, since a later stage must run its first v − 1 chunks for all pp
    micro-batches of a group before its last chunk's first backward.  With a micro-batch
    ``group`` of N per chunk (module docstring; None: pp) the warm-up is
    ``2(pp − i − 1) + (v − 1)·N``.  ``forwards_first``: the schedule runs every chunk forward
    before the first backward (Paddle's FthenB at m = pp), holding all m micro-batches on every
    stage.  Layers are taken as spread evenly over a stage's chunks."""
    base = np.minimum(pp - stage_index, num_microbatches)
    v = np.maximum(np.asarray(vpp, dtype=float), 1.0)
    m = np.asarray(num_microbatches, dtype=float)
    n = np.asarray(pp if group is None else group, dtype=float)
    warm = 2.0 * (pp - np.asarray(stage_index, dtype=float) - 1.0) + (v - 1.0) * n + 1.0
    chunks = np.where(forwards_first, m * v, np.minimum(warm, m * v))
    return np.where(v > 1, chunks / v, base)
