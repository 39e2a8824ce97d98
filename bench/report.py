"""Write the benchmark tables into README.md from bench/results/*.json.

Each table sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` markers, so the
README shows exactly what the last benchmark run measured.  Run: make bench-report
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _load(name: str):
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def fidelity() -> str | None:
    d = _load("fidelity.json")
    if not d:
        return None
    sys.path.insert(0, str(ROOT / "bench"))
    from fidelity import readme_section  # bench/fidelity.py renders its own section

    return readme_section(d)


def physics() -> str | None:
    """The MoE and long-context physics cases (bench/physics_cases.py) as README bullets."""
    d = _load("physics_cases.json")
    if not d:
        return None
    out = []
    sweep = d["moe_ep_sweep"]

    def ep_row(ep: int, dispatcher: str, overlap: bool) -> dict:
        return next(r for r in sweep["rows"] if r["ep"] == ep and r["dispatcher"] == dispatcher and r["overlap"] == overlap)

    inside = max((r for r in sweep["rows"] if r["ep_within_node"]), key=lambda r: r["ep"])["ep"]
    across = min(r["ep"] for r in sweep["rows"] if not r["ep_within_node"])
    a, b = ep_row(inside, "alltoall", False), ep_row(across, "alltoall", False)
    out.append(
        f"* **MoE step vs EP** ({sweep['model']}, {sweep['cluster']}): ep {inside} inside a node {a['step_time_s']:.2f} s "
        f"(dispatch/combine {a['breakdown_s'].get('ep_comm', 0.0):.2f} s exposed), ep {across} across nodes {b['step_time_s']:.2f} s "
        f"({b['breakdown_s'].get('ep_comm', 0.0):.2f} s) with NCCL all-to-all, {ep_row(across, 'deepep', False)['step_time_s']:.2f} s with "
        f"DeepEP-style node-deduplicated dispatch, {ep_row(across, 'alltoall', True)['step_time_s']:.2f} s with Megatron-Core's EP overlap."
    )
    mvd = d["moe_vs_dense"]
    out.append(
        f"* **MoE vs equivalent-active dense** (same attention, FFN k·f wide): {mvd['moe']['step_time_s']:.2f} s vs "
        f"{mvd['dense']['step_time_s']:.2f} s, ratio **{mvd['ratio_moe_over_dense']:.2f}×** (router, permutation, small-M grouped GEMMs, "
        "intra-node all-to-all)."
    )
    fold = d["moe_folding"]
    out.append(f"* **EP folding** ({fold['model']} layer): " + ", ".join(
        f"{r['layout']} {r['layer_s'] * 1e3:.1f} ms per layer (TP collectives {r['tp_comm_s'] * 1e3:.2f} ms)" for r in fold["rows"]) + ".")
    gg = d["grouped_gemm_efficiency"]
    out.append(f"* **Grouped-GEMM efficiency** vs tokens per expert ({gg['shape']}): " + ", ".join(
        f"{r['tokens_per_expert']}: {r['fraction_of_peak']:.2f}" for r in gg["rows"]) + " of peak (weight-streaming roofline at small M).")
    dl = d["dropless_imbalance"]
    out.append(f"* **Dropless imbalance** ({dl['slots_per_rank'] // 1024}k token-slots per rank): slowest EP rank's load over the mean " + ", ".join(
        f"ep {r['ep']}: {r['load_factor']:.3f}" for r in dl["rows"]) + " (binomial sampling floor).")
    cps = d["cp_vs_sequence"]
    cp_exposed = sorted({round(r["breakdown_s"]["cp_comm"], 2) for r in cps["rows"] if r["cp"] > 1})
    out.append(f"* **CP step vs sequence** ({cps['model']}, {cps['cluster']}): " + ", ".join(
        f"{r['sequence_length'] // 1024}k cp {r['cp']}: {r['step_time_s']:.1f} s" for r in cps["rows"])
        + f"; exposed CP time {'–'.join(f'{x:.2f}' for x in (cp_exposed[0], cp_exposed[-1]) if cp_exposed) if len(cp_exposed) > 1 else f'{cp_exposed[0]:.2f}'} s wherever cp > 1"
        " — the finished dK,dV's last hop; the ring itself hides behind the attention blocks (GQA keeps K,V small).")
    cpt = d["cp_comm_types"]
    out.append(f"* **CP exchange type** at {cpt['sequence_length'] // 1024}k ({cpt['layout']}): " + ", ".join(
        f"{r['cp_comm_type']} {r['step_time_s']:.1f} s (exposed {r['breakdown_s'].get('cp_comm', 0.0):.2f} s)" for r in cpt["rows"]) + ".")
    sw = d["sliding_window"]
    out.append("* **Sliding window** (4k window vs global, Llama-3-8B layer, tp 8): layer time ratio " + ", ".join(
        f"{r['sequence_length'] // 1024}k: {r['ratio']:.2f}" for r in sw["rows"]) + "; Llama 4's chunked attention (8k chunks) "
        + ", ".join(f"{r['sequence_length'] // 1024}k: {r['chunked_ratio']:.2f}" for r in sw["rows"]) + ".")
    mla = d["mla_flops"]
    out.append(f"* **MLA FLOPs** ({mla['model']}, {mla['total_params'] / 1e9:.1f}B total, {mla['active_params'] / 1e9:.1f}B active): model FLOPs "
               f"per token = 6 × active non-embedding parameters + attention to {abs(mla['relative_gap_after_attention']) * 100:.3f}%.")
    pe = d["planner_searches_ep"]
    st = pe["best"]["strategy"]
    recompute = "no recompute" if st["recompute"] == "none" else f"{st['recompute']} recompute" + (
        f" ({', '.join(st['recompute_modules'])})" if st.get("recompute_modules") else "")
    out.append(
        f"* **Planner searches EP**: {pe['model']} on {pe['cluster']} → tp {st['tp']}, pp {st['pp']}, dp {st['dp']}, cp {st['cp']}, "
        f"ep {st['ep']} (experts over dp·cp), ZeRO-{st['zero_stage']}, {recompute}, {pe['best']['step_time_s']:.1f} s (every MoE estimate "
        f"reports its {pe['best']['active_params'] / 1e9:.1f}B active of {pe['best']['model_params'] / 1e9:.1f}B parameters)."
    )
    sel = d["selective_recompute_by_framework"]

    def sel_row(framework: str, rc: str) -> dict:
        return next(r for r in sel["rows"] if r["framework"] == framework and r["recompute"] == rc)

    out.append(f"* **Selective recompute by framework** ({sel['model']}, {sel['layout']}): " + ", ".join(
        f"fsdp {rc} {sel_row('fsdp', rc)['step_time_s']:.2f} s at {sel_row('fsdp', rc)['peak_memory_GB']:.1f} GB" for rc in ("none", "selective", "full"))
        + f" — torchtitan's op-level checkpointing keeps about half the activations; Megatron-Core's selective recompute with "
        f"FlashAttention runs the attention's forward again for no memory in 16 bits ({sel_row('megatron-core', 'selective')['step_time_s']:.2f} s "
        f"at {sel_row('megatron-core', 'selective')['peak_memory_GB']:.1f} GB).")
    mm = d.get("selective_recompute_moe_mla")
    if mm:
        by_rc = {r["recompute"]: r for r in mm["rows"]}
        out.append(f"* **Op-level checkpointing of MLA and MoE layers** ({mm['model']}, {mm['layout']}): "
                   + ", ".join(f"{rc} {by_rc[rc]['step_time_s']:.2f} s at {by_rc[rc]['peak_memory_GB']:.1f} GB"
                               + ("" if by_rc[rc]["fits"] else " (does not fit)") for rc in ("none", "selective", "full"))
                   + " — torchtitan's policy keeps every other matmul of the MLA projections, the router and the shared experts, the "
                   "top-k and both all-to-alls' outputs, and recomputes the routed experts' grouped GEMMs.")
    hs = d.get("hsdp_vs_full_shard")
    if hs:
        by = {(r["nodes"], r["sharding"].split()[0]): r for r in hs["rows"]}
        nodes = sorted({r["nodes"] for r in hs["rows"]})
        out.append(f"* **HSDP vs full sharding** ({hs['model']}, {hs['layout']}, dp = all GPUs): step full / HSDP "
                   + ", ".join(f"{n} nodes {by[(n, 'full')]['step_time_s']:.2f} / {by[(n, 'HSDP')]['step_time_s']:.2f} s" for n in nodes)
                   + f" — full sharding's per-micro-batch rings span every rank (exposed DP {by[(nodes[0], 'full')]['breakdown_s'].get('dp_comm_exposed', 0):.2f}"
                   f" → {by[(nodes[-1], 'full')]['breakdown_s'].get('dp_comm_exposed', 0):.2f} s), HSDP's stay in a node at the price of"
                   f" {by[(nodes[-1], 'HSDP')]['state_GB']:.1f} GB of model state per GPU instead of {by[(nodes[-1], 'full')]['state_GB']:.2f} GB.")
    fs = d.get("fsdp_schedules")
    if fs:
        row = {(r["framework"], r["zero_stage"], r["pp"]): r for r in fs["rows"]}

        def cell(key: tuple[str, int, int]) -> str:
            r = row[key]
            return (f"{r['step_time_s']:.2f} s (DP exposed {r['breakdown_s'].get('dp_comm_exposed', 0):.2f} s), "
                    f"{r['state_GB']:.1f} GB state, peak {r['peak_memory_GB']:.1f} GB")

        out.append(f"* **FSDP's schedules as torchtitan runs them** ({fs['model']}, {fs['layout']}): without a pipeline, FULL_SHARD "
                   f"{cell(('fsdp', 3, 1))}; SHARD_GRAD_OP, its weights re-gathered with every micro-batch, {cell(('fsdp', 2, 1))}. "
                   f"With pp 4, FULL_SHARD gathers and reduces once a step and accumulates unsharded fp32 gradients "
                   f"(torch.distributed.pipelining): {cell(('fsdp', 3, 4))}, against Megatron-Core's distributed optimizer "
                   f"{cell(('megatron-core', 1, 4))} and the Llama 3 paper's per-micro-batch ZeRO-2, which torchtitan cannot run, "
                   f"{cell(('fsdp', 2, 4))}.")
    rm = d.get("recompute_modules")
    if rm:
        out.append(f"* **Recompute modules** ({rm['model']}, {rm['layout']}; Megatron-Core's --recompute-modules, first stage): "
                   + ", ".join(f"{' + '.join(r['recompute_modules'])} {r['activations_GB']:.1f} GB of activations, step {r['step_time_s']:.2f} s"
                               for r in rm["rows"])
                   + " — output-discarding modules free a little for almost nothing; the whole MoE layer frees most and "
                   "runs its dispatch and combine again.")
    rs = d.get("fsdp_replicate_sync")
    if rs:
        def sync(framework: str, pp: int, m: int) -> str:
            r = next(x for x in rs["rows"] if (x["framework"], x["pp"], x["microbatches"]) == (framework, pp, m))
            return f"{r['breakdown_s'].get('dp_comm_exposed', 0):.3f} s"

        out.append(f"* **Unsharded FSDP's all-reduce** ({rs['model']}, {rs['layout']}): exposed DP time with 2 → 16 micro-batches a step, "
                   f"torchtitan without a pipeline {sync('fsdp', 1, 2)} → {sync('fsdp', 1, 16)} (an all-reduce with every micro-batch, "
                   f"gradient sync stays on), with pp 2 {sync('fsdp', 2, 2)} → {sync('fsdp', 2, 16)} (once a step), Megatron-Core's DDP "
                   f"{sync('megatron-core', 1, 2)} → {sync('megatron-core', 1, 16)}.")
    op = d.get("optimizer_precision")
    if op:
        def state(r: dict) -> str:
            return f"{r['gradients_GB']:.1f} + {r['optimizer_state_GB']:.1f} GB, peak {r['peak_memory_GB']:.1f} GB, step {r['step_time_s']:.2f} s"

        base, aware, moments, grads, grads_alone = op["rows"]
        out.append(f"* **Optimizer precision** ({op['model']}, {op['layout']}; Megatron-Core, gradients + optimizer state per GPU): "
                   f"defaults {state(base)}; precision-aware optimizer (master weights as 16-bit remainders) {state(aware)}; "
                   f"with bf16 moments {state(moments)}; with a bf16 gradient buffer too {state(grads)}; "
                   f"the bf16 gradient buffer alone (--grad-reduce-in-bf16) {state(grads_alone)}.")
    ev = d.get("eager_vs_fused")
    if ev:
        fused, eager = (next(r for r in ev["rows"] if r["fused_kernels"] is f) for f in (True, False))
        out.append(f"* **Eager PyTorch vs fused kernels** ({ev['model']}, {ev['layout']}): step {fused['step_time_s']:.3f} s fused, "
                   f"{eager['step_time_s']:.3f} s eager (+{eager['step_time_s'] / fused['step_time_s'] - 1:.0%}: Hugging Face's RMSNorm, "
                   f"rotate_half and SwiGLU one operator at a time); activations {fused['activations_GB']:.1f} → {eager['activations_GB']:.1f} GB "
                   "(the norm's fp32 upcast and the activation's output kept for backward).")
    oo = d.get("optimizer_offload")
    if oo:
        def offload(r: dict) -> str:
            return (f"{r['offload_fraction']:g}: peak {r['peak_memory_GB']:.1f} GB{'' if r['fits'] else ' (does not fit)'}, "
                    f"host {r['host_memory_GB_per_gpu']:.1f} GB, step {r['step_time_s']:.2f} s ({r['optimizer_share_of_step']:.0%} optimizer)")

        by = {}
        for r in oo["rows"]:
            by.setdefault((r["device"], r["framework"]), []).append(r)
        out.append(f"* **Optimizer offload** ({oo['model']}, {oo['layout']}; per GPU, by offloaded fraction): "
                   + "; ".join(f"{fw} on {dev} " + ", ".join(offload(r) for r in rows) for (dev, fw), rows in by.items())
                   + f" — the host's Adam update streams {oo['host_update_bytes_per_param']:g} bytes a parameter through the GPU's "
                   f"share of its server's DRAM (Paddle's tensor-wise offload copies {oo['tensorwise_round_trip_bytes_per_param']:g} a "
                   "parameter over the host link for a GPU update), so what offload frees on the GPU it pays for in step time.")
    fo = d.get("fsdp_cpu_offload")
    if fo:
        def fsdp_row(r: dict) -> str:
            return (f"peak {r['peak_memory_GB']:.1f} GB{'' if r['fits'] else ' (does not fit)'}"
                    + (f", host {r['host_memory_GB_per_gpu']:.0f} GB" if r["cpu_offload"] else "")
                    + f", step {r['step_time_s']:.1f} s (DP exposed {r['breakdown_s'].get('dp_comm_exposed', 0):.2f} s"
                    + (f", host copies exposed {r['breakdown_s'].get('offload_exposed', 0):.2f} s" if r["cpu_offload"] else "")
                    + f", optimizer {r['breakdown_s'].get('optimizer', 0):.2f} s)")

        out.append(f"* **CPU offload of the sharded state** ({fo['model']}, {fo['layout']}): "
                   + "; ".join(f"{r['framework']}, {r['microbatches']} micro-batch{'es' if r['microbatches'] > 1 else ''}, "
                               f"{'offloaded' if r['cpu_offload'] else 'on the GPU'}: {fsdp_row(r)}" for r in fo["rows"])
                   + " — one micro-batch hides the shard copies behind its compute; accumulating makes each gradient's copy "
                   "and the host's add synchronous.")
    ao = d.get("activation_offloading")
    if ao:
        def act_row(r: dict) -> str:
            what = "no recompute" if r["recompute"] == "none" else f"{r['recompute']} recompute"
            return _offload_row(f"{what}, {'offloaded' if r['activation_offloading'] else 'on the GPU'}", r, r["activation_offloading"])

        out.append(f"* **Activation offloading** ({ao['model']}, {ao['layout']}): " + "; ".join(act_row(r) for r in ao["rows"])
                   + " — under full recompute the copies are one hidden state a layer and hide; without it a layer's "
                   "activations outweigh its compute on the host link.")
    mo = d.get("megatron_module_offload")
    if mo:
        out.append(f"* **Megatron-Core's fine-grained activation offloading** ({mo['model']}, {mo['layout']}; by offloaded modules): "
                   + "; ".join(_offload_row(", ".join(r["offload_modules"]) or "none", r, bool(r["offload_modules"])) for r in mo["rows"])
                   + " — each module's saved tensors leave the GPU; once their copies outrun the layer's compute the step pays.")
    eb = d.get("eight_bit_adam")
    if eb:
        by = {}
        for r in eb["rows"]:
            by.setdefault((r["framework"], r["zero_stage"], r["master_weights"]), {})[r["optimizer"]] = r

        def eight(fw: str, z: int, master: bool, rows: dict) -> str:
            a, e = rows["adamw"], rows["adamw_8bit"]
            return (f"{fw} ZeRO-{z}{'' if master else ' pure bf16'}: optimizer state {a['optimizer_state_GB']:.1f} → {e['optimizer_state_GB']:.1f} GB, peak "
                    f"{a['peak_memory_GB']:.1f}{'' if a['fits'] else ' (does not fit)'} → {e['peak_memory_GB']:.1f} GB"
                    f"{'' if e['fits'] else ' (does not fit)'}, optimizer {a['breakdown_s'].get('optimizer', 0) * 1e3:.0f} → "
                    f"{e['breakdown_s'].get('optimizer', 0) * 1e3:.0f} ms")

        mixed = next(rows for (_, _, master), rows in by.items() if master)
        out.append(f"* **8-bit AdamW** ({eb['model']}, {eb['layout']}; AdamW → adamw_8bit): "
                   + "; ".join(eight(fw, z, master, rows) for (fw, z, master), rows in by.items())
                   + f" — a byte a moment instead of four; under mixed precision the step moves {mixed['adamw_8bit']['step_bytes_per_param']:.0f} "
                   f"bytes a parameter instead of {mixed['adamw']['step_bytes_per_param']:.0f}.")
    def grouped(rows: list[dict], key: Callable[[dict], str], row: Callable[[dict], str]) -> str:
        """Rows grouped by ``key(row)`` in order, each group "key: row; row." (the physics cases
        whose rows compare one setting across a few layouts)."""
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(key(r), []).append(r)
        return " ".join(f"{k}: " + "; ".join(row(r) for r in rs) + "." for k, rs in groups.items())

    mu = d.get("muon")
    if mu:
        def muon_row(r: dict) -> str:
            how = "Adam, distributed optimizer" if r["optimizer"] == "adam" else (
                "Muon, layer-wise distributed optimizer" if r["zero_stage"] == 1 else "Muon, no distributed optimizer")
            return (f"{how}: optimizer state {r['optimizer_state_GB']:.1f} GB, peak {r['peak_memory_GB']:.1f} GB"
                    f"{'' if r['fits'] else ' (does not fit)'}, optimizer {r['breakdown_s'].get('optimizer', 0) * 1e3:.0f} ms, "
                    f"exposed DP sync {r['breakdown_s'].get('dp_comm_exposed', 0) * 1e3:.0f} ms, step {r['step_time_s']:.2f} s")

        out.append(f"* **Muon** ({mu['layout']}): " + grouped(mu["rows"], lambda r: f"{r['model']} on {r['gpus']} H100", muon_row)
                   + " One fp32 momentum for the decoder's matrices instead of Adam's two moments; every rank orthogonalises "
                   "every matrix of its shard (five Newton-Schulz iterations) unless the layer-wise optimizer shares them, "
                   "whose gradients are all-reduced and weights all-gathered.")
    ob = d.get("optimizer_in_backward")
    if ob:
        def oib_row(r: dict) -> str:
            return (f"{'inside the backward' if r['optimizer_in_backward'] else 'after the backward'}: gradients {r['gradients_GB']:.1f} GB, "
                    f"peak {r['peak_memory_GB']:.1f} GB{'' if r['fits'] else ' (does not fit)'}, step {r['step_time_s']:.2f} s")

        out.append(f"* **Optimizer step inside the backward** ({ob['layout']}): "
                   + grouped(ob["rows"], lambda r: f"{r['model']} on 8 {r['device'].split('-')[0]}{' (pure bf16)' if r['pure_bf16'] else ''}",
                             oib_row)
                   + " torchtune's optimizer_in_bwd steps each parameter as its gradient is reduced and frees it, so no "
                   "gradient is held for the step; the step's time is unchanged.")
    dr = d.get("dpo_reference")
    if dr:
        def ref_row(r: dict) -> str:
            return (f"{'with' if r['reference_model'] else 'without'} the reference: weights {r['weights_GB']:.1f} GB, peak "
                    f"{r['peak_memory_GB']:.1f} GB, compute {r['breakdown_s'].get('compute', 0):.2f} s, step {r['step_time_s']:.2f} s")

        out.append(f"* **DPO's reference model** ({dr['model']}, {dr['layout']}): "
                   + grouped(dr["rows"], lambda r: f"{r['framework']} ZeRO-{r['zero_stage']}", ref_row)
                   + " The frozen copy adds its weights (sharded as the policy's under full sharding) and one forward a "
                   "micro-batch: about a quarter more step.")
    lo = d.get("lora")
    if lo:
        def lora_row(r: dict) -> str:
            return (f"{r['case']} — {r['trainable_params'] / 1e6:,.0f}M trainable, state {r['state_GB']:.2f} GB, activations "
                    f"{r['activations_GB']:.1f} GB, peak {r['peak_memory_GB']:.1f} GB{'' if r['fits'] else ' (does not fit)'}"
                    f"{', host ' + format(r['host_GB'], '.1f') + ' GB' if r.get('host_GB') else ''}, step {r['step_time_s']:.2f} s")

        by_model: dict[str, list[dict]] = {}
        for r in lo["rows"]:
            by_model.setdefault(f"{r['model']} ({'no' if r['recompute'] == 'none' else r['recompute']} recompute, micro-batch "
                                f"{r['micro_batch_size']})", []).append(r)
        out.append(f"* **LoRA** ({lo['layout']}): " + ". ".join(f"{m}: " + "; ".join(lora_row(r) for r in rows) for m, rows in by_model.items())
                   + " — the frozen weights drop their gradients, state and weight-gradient GEMMs, but the adapters' memory-bound "
                   "passes take back much of the time (a recompute runs them again), PEFT's dropout keeps a copy of every "
                   "adapter's input, and QLoRA's NF4 base holds the weights in about a quarter of the memory for a "
                   "dequantisation before every GEMM; offloaded (FSDP's CPU offload), the 4-bit shard and the adapters' state "
                   "leave the GPU for host memory, the shard copied back before each gather.")
    lk = d.get("loss_kernels")
    if lk:
        def kernel_rows(framework: str) -> str:
            return "; ".join(f"{r['loss_kernel']}: activations {r['activations_GB']:.1f} GB, peak {r['peak_memory_GB']:.1f} GB, "
                             f"step {r['step_time_s']:.3f} s" for r in lk["rows"] if r["framework"] == framework)
        out.append(f"* **Loss kernels** ({lk['model']}, {lk['layout']}): FSDP: {kernel_rows('fsdp')}. Megatron-Core: "
                   f"{kernel_rows('megatron-core')} — the unfused loss holds the logits and their fp32 copy (6 bytes a vocabulary "
                   "entry a token), torchtune's chunked loss the fp32 log-probabilities (4), Transformer Engine's the 16-bit logits "
                   "(2, its gradient written over them), torch.compile's the 16-bit logits (2, the softmax recomputed); Liger's chunks and Cut Cross-Entropy's on-chip blocks hold neither, the "
                   "latter at the price of computing the logits again.")
    def case_rows(title: str, sec: dict, memory: str, why: str) -> str:
        """One bullet of a case-per-row section: each row's ``memory`` figure (weights, activations), peak and step."""
        rows = "; ".join(f"{r['case']}: {memory} {r[memory + '_GB']:.1f} GB, peak {r['peak_memory_GB']:.1f} GB, step {r['step_time_s']:.2f} s"
                         for r in sec["rows"])
        return f"* **{title}** ({sec['model']}, {sec['layout']}): {rows} — {why}"

    # the case-per-row sections: (results key, title, the memory figure each row shows, why)
    for key, title, memory, why in (
        ("fp8_weights", "FP8 weights", "weights", "FP8 training keeps each 16-bit weight's FP8 cast and its transpose over the step "
         "(2 bytes a weight more); FP8 weights (--fp8-param-gather) replace the 16-bit ones and halve the weights' all-gathers; "
         "torchao's float8 under FSDP2 keeps no cast, and its FP8 all-gather halves the gathers and the gathered layers."),
        ("fp8_attention_output", "A fused attention's output under FP8", "activations", "in BF16 the attention kernel's saved output "
         "is the output projection's saved input; in FP8 the projection keeps an FP8 copy and the 16-bit output stays too, which "
         "Megatron-Core's attention-core checkpoint drops — its FlashAttention forward runs again either way."),
        ("grouped_recompute", "Grouped recompute", "activations", "uniform groups keep one checkpoint a group for the full "
         "recompute's time, but hold a whole group's activations while its backward runs, so the saving turns into a cost as the "
         "group grows; block recompute trades memory for time instead."),
        ("pipeline_schedules", "Several pipeline schedules a step", "activations", "torchtitan's and NeMo Automodel's gradient "
         "accumulation runs a whole pipeline schedule per accumulation step: each fills and drains the pipeline and syncs its "
         "gradients, so the bubble and the exposed sync grow with the schedules while a 1F1B schedule's in-flight micro-batches "
         "(pp) and the step's compute stay the same."),
        ("submodule_checkpointing", "Full recompute by submodule", "activations", "NeMo-RL's DTensor policy wraps the "
         "attention, the MLP and both norms apart, each keeping its input: four hidden-size tensors a layer where a whole-layer "
         "checkpoint keeps one, for the same recompute; its backward holds one recomputed submodule at a time."),
        ("paddle_full_attn", "Paddle's recompute granularity", "activations", "core_attn redoes FlashAttention's forward for no "
         "memory in 16 bits; full_attn also frees Q, K, V and the projection's input for the projections' forward and the "
         "attention's TP collective again; full keeps only each layer's input."),
        ("fsdp_selective_checkpointing", "FSDP checkpointing a fraction of the blocks", "activations", "fms-fsdp's "
         "selective_checkpointing p trades memory for time linearly in p (the first checkpointed block brings its recompute "
         "working set), so the smallest p that fits is the fastest."),
        ("interleaved_microbatch_groups", "Interleaved micro-batch groups", "activations", "a larger group lengthens every stage's "
         "warm-up by (v − 1) chunk micro-batches per extra micro-batch, held until their backward, for the same step per "
         "micro-batch; a count pp does not divide runs in the smallest group that takes it."),
    ):
        if d.get(key):
            out.append(case_rows(title, d[key], memory, why))
    ds = d.get("deepspeed_stage3_single_source")
    if ds:
        z2, z3 = (next(r for r in ds["rows"] if r["zero_stage"] == z) for z in (2, 3))
        out.append(f"* **DeepSpeed ZeRO-3 on one source** ({ds['model']}, {ds['layout']}): ZeRO-2 {z2['step_time_s']:.2f} s "
                   f"(p10–p90 {z2['step_time_s_p10']:.2f}–{z2['step_time_s_p90']:.2f}); ZeRO-3 {z3['step_time_s']:.2f} s at the stage-3 constants "
                   f"fitted on Narayanan et al. 2021's ZeRO-3 runs alone, {z3['step_time_s_at_priors']:.2f} s at their priors, so its interval is "
                   f"{z3['step_time_s_p10']:.2f}–{z3['step_time_s_p90']:.2f} s and its estimate says why.")
    mi = d.get("memory_interval_state_dominated")
    if mi:
        out.append(f"* **Memory interval of a state-dominated layout** ({mi['model']}, {mi['layout']}): {mi['state_GB']:.1f} GB of sharded "
                   f"state, {mi['reserve_GB']:.1f} GB of fragmentation reserve, peak {mi['peak_memory_GB']:.1f} GB, p10–p90 "
                   f"{mi['peak_memory_GB_p10']:.1f}–{mi['peak_memory_GB_p90']:.1f} GB (the fragmentation range widens the reserve only; "
                   f"widening the whole peak would put the p10 at {mi['p10_whole_peak_widened_GB']:.1f} GB"
                   + (", below the state itself)" if mi["p10_whole_peak_widened_GB"] < mi["state_GB"] else ")")
                   + (": tight on 80 GB, more likely than not to run out of memory." if mi["tight"]
                      else ": refused on 80 GB, its p10 above the device." if not mi["fits"] else "."))
    return "\n".join(out)


def acceptance() -> str | None:
    """The planner-acceptance figures (bench/acceptance.py) as the README paragraph."""
    d = _load("acceptance.json")
    if not d:
        return None
    sm = d["summary"]
    tight = len(sm.get("tight_accepted") or [])
    rejected = "; ".join(f"`{r['id']}`: {r['error']['message']}" for r in sm.get("rejected") or [])
    oom_fit = ", ".join(f"`{r['id']}` (predicted {r['peak_memory_GB']:.1f} GB)" for r in sm.get("ooms_accepted") or [])
    not_plannable = len(sm.get("not_plannable") or [])
    out = [
        "**Planner acceptance** (`make bench-acceptance`, `bench/results/acceptance.json`): every row planned with every knob it "
        "states pinned (tp, pp, dp, cp, ep, micro-batch, recompute, ZeRO stage, interleaving, sequence parallelism, framework): "
        f"**{sm['accepted']}/{sm['measured_runs']} measured runs accepted** ({tight} flagged memory-tight)"
        + (f"; rejected: {rejected}" if rejected else "")
        + f". **{sm['ooms_refused']} measured BLOOM OOMs refused**"
        + (f" (accepted: {oom_fit})" if oom_fit else "")
        + f". Peak memory against the {sm['memory_rows']} measured BLOOM peaks: median |error| {sm['memory_median_abs_error'] * 100:.1f}%, "
        f"p90 {sm['memory_p90_abs_error'] * 100:.1f}%, {sm['memory_within_10pct']} within 10% (the prediction is the device-level peak, "
        '`peak_memory_quantity: "max_reserved"`).'
        + _fragmentation_bases(sm.get("fragmentation_bases") or {})
        + (f" {not_plannable} rows are not plannable." if not_plannable else ""),
    ]
    rc = d.get("recipes")
    if rc:
        unpriced = "; ".join(f"`{r['id']}`: {r['why']}" for r in rc["expected_not_to_fit"])
        n = len(rc["expected_not_to_fit"])
        out.append(
            f"\n**Shipped recipes** (the same run, `cost_model/data/framework_recipes.json`: the layouts framework repositories and "
            "trainers ship as examples — torchtitan, Megatron-LM, the Megatron-MoE model zoo, NeMo, Megatron-Bridge, PaddleNLP, "
            "DeepSpeed-Chat, LLaMA-Factory, LLM Foundry, torchtune (LoRA among them), axolotl, accelerate, Megatron-DeepSpeed's Ulysses "
            "examples, verl's FSDP SFT trainer (Ulysses), OpenRLHF (ring attention on DeepSpeed), Pai-Megatron-Patch, "
            "NeMo-Framework-Launcher on A100, torchtitan on H200, TRL's 1M-token context-parallel SFT, open-r1, ERNIEKit, "
            "BigScience's BLOOM-176B layout, NeMo-RL's DTensor (checkpointing by submodule) and Megatron policies, verl's Megatron "
            "actor, PaddleFormers, the alignment-handbook, FastChat, Stanford Alpaca, llama-recipes, OLMo and OLMo 2, GPT-NeoX-20B, "
            "fms-fsdp, TinyLlama, NeMo Automodel, Qwen's finetuning scripts, XTuner, OLMo-core, LitGPT, Megatron-DeepSpeed's MoE "
            "examples, Megatron-Bridge's Qwen3-MoE and Kimi K2 presets, open-instruct, OpenRLHF, ERNIE-4.5's pre-training configs, Firefly, "
            "NeMo Automodel's benchmark configs, slime's GRPO actors, torchtitan's B200 presets, GLM-4, Yi, FlagPerf's A800 runs, "
            "PEFT's FSDP examples, DGX Cloud's Nemotron-4 recipes, Pythia's GPT-NeoX configs, OLMoE, EasyContext and "
            "360-LLaMA-Factory's ring attention, ArcticTraining's ALST, XTuner, OpenChat, "
            "and offloading layouts of DeepSpeedExamples, "
            f"ms-swift, slime and axolotl's gpt-oss examples; {len(rc['frameworks'])} frameworks — configurations "
            f"only, estimated as stated): **{rc['runs_accepted']}/{rc['runs']} accepted** ({rc['runs_tight']} flagged memory-tight: many "
            "recipes are tuned to the device's edge, and the memory interval outside Megatron-DeepSpeed is the fragmentation range's)"
            + (f"; {n} more rel{'ies' if n == 1 else 'y'} on what the cost model does not price and "
               f"{'is' if n == 1 else 'are'} predicted not to fit ({unpriced}). " if n else ". ")
            + "Offload to the host is priced where the framework has it: the optimizer state (`training.optimizer_offload_fraction`), "
            "the whole sharded state (`training.cpu_offload`) and the saved activations (`training.activation_offloading`); "
            "torchtune's distributed LoRA recipes run with `training.lora_rank`, LLaMA-Factory's FSDP-QLoRA with the base offloaded too."
        )
        over = [r for r in rc["rows"] if r["framework"] == "megatron-core" and r["verdict"] == "tight"]
        if over:
            out.append("\nMegatron-Core recipes kept only as tight (predicted peak per GPU): "
                       + ", ".join(f"`{r['id']}` {r['peak_memory_GB']:.1f} GB" for r in over) + ".")
    tight_runs = [r for r in d["rows"] if r.get("tight")]
    if tight_runs:
        out.append("\nMeasured runs kept only as tight (predicted peak per GPU, p10): "
                   + ", ".join(f"`{r['id']}` {r['peak_memory_GB']:.1f} GB (p10 {r['peak_memory_GB_p10']:.1f} GB)" for r in tight_runs) + ".")
    return "\n".join(out)


def _offload_row(label: str, r: dict, offloaded: bool) -> str:
    """One physics-case row of an activation offload: its activations, peak (and whether it
    fits), what the host holds and the copies' exposed time when offloaded, and the step."""
    return (f"{label}: activations {r['activations_GB']:.1f} GB, peak {r['peak_memory_GB']:.1f} GB{'' if r['fits'] else ' (does not fit)'}"
            + (f", host {r['host_memory_GB_per_gpu']:.1f} GB, copies exposed {r['breakdown_s'].get('offload_exposed', 0):.2f} s"
               if offloaded else "") + f", step {r['step_time_s']:.2f} s")


def _fragmentation_bases(bases: dict) -> str:
    """Which memory the allocator's fragmentation reserve is a fraction of, as the peaks say."""
    if not bases:
        return ""
    parts = [f"{name}: fraction {b['fraction']:.2f} (a true reserved/allocated of {1 + b['true_reserve']:.2f})"
             f", median {b['median_abs_error'] * 100:.1f}%, p90 {b['p90_abs_error'] * 100:.1f}%, "
             f"{b['within_10pct']} within 10%" for name, b in bases.items()]
    return " What fragments, each base with its own fitted fraction: " + "; ".join(parts) + "."


def plan() -> str | None:
    d = _load("plan.json")
    if not d:
        return None
    out = [
        "| case | plan wall time (median) | target | solver | exhaustive via `estimate` | speed-up | best plan |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for r in d["rows"]:
        s = r["best_strategy"]
        devs = "+".join(x.split("-")[0] for x in r["best_devices"])
        out.append(
            f"| {r['case']} | {r['plan_wall_s_median']:.2f} s | ≤ {r['target_s']:.0f} s | {r['solver_status']} "
            f"| ≈ {r['exhaustive_s']:,.0f} s ({r['exhaustive_candidates']:,} × {r['exhaustive_estimate_s_per_call'] * 1e3:.1f} ms) "
            f"| {r['speedup']:,.0f}× | tp {s['tp']} pp {s['pp']} dp {s['dp']} cp {s['cp']} on {devs}, MFU {r['best_mfu'] * 100:.0f}% |"
        )
    rp = d.get("replan")
    if rp:
        planner = f"planner {rp['planner_wall_s_median']:.2f} s of it; " if rp.get("planner_wall_s_median") is not None else ""
        out.append(f"| replan: {rp['case']} (HTTP, in-process) | {rp['replan_wall_s_median']:.2f} s | ≤ {rp['target_s']:.0f} s | | | | {planner}ranks moved {rp['ranks_moved']} |")
    for r in d.get("frontier") or []:
        s = r["best_strategy"]
        pod = next((b["crossed_by"] for b in r.get("boundaries") or [] if b["boundary"] == "pod"), None)
        nest = "<".join(s.get("nesting") or ["tp", "cp", "dp", "pp"])
        out.append(
            f"| {r['case']} | {r['plan_wall_s_median']:.2f} s | ≤ {r['target_s']:.0f} s | {r['solver_status']} | {r['candidates']:,} candidates (layouts; × nesting orders where costed) | "
            f"| tp {s['tp']} pp {s['pp']} dp {s['dp']} cp {s['cp']} ep {s['ep']}, nesting {nest}, across pods: {', '.join(pod) if pod else 'nothing'}, MFU {r['best_mfu'] * 100:.0f}% |"
        )
    fh = d.get("frontier_http")
    if fh:
        modes = f"search mode {', '.join(sorted(set(m for m in fh['replan_modes'] if m)))}; " if fh.get("replan_modes") else ""
        out.append(f"| replan: 98,304 GPUs, one node down (HTTP, in-process) | {fh['replan_wall_s_median']:.2f} s | ≤ {fh['replan_target_s']:.0f} s | | | | {modes}planner {fh['replan_planner_s_runs']} s |")
        first = f"first GET {fh['get_plan_first_s']:.2f} s, later GETs from the kept body; " if "get_plan_first_s" in fh else ""
        out.append(f"| GET a plan of {fh['ranks']:,} ranks (HTTP, gzip) | {fh['get_plan_s_median']:.2f} s | ≤ {fh['get_target_s']:.0f} s | | | | {first}{fh['get_plan_bytes_on_wire']:,} bytes on the wire |")
    load = d.get("loadavg")
    note = f" Load average during the run: {load}." if load else ""
    out += ["", f"Median of {d.get('repeats', '?')} runs on a {d.get('cpu_count', '?')}-core machine, process start excluded; "
            "the exhaustive time is the measured per-call time of `estimate` on a random sample of the same candidates times their number." + note
            + " The machines here are shared: that per-call time is the run's yardstick of the host's speed, so compare runs by "
            "their speed-ups, and read a wall time over its target beside it."]
    return "\n".join(out)


def service() -> str | None:
    d = _load("service.json")
    if not d:
        return None
    cfg = d.get("config", {})
    out = [
        f"{cfg.get('clients', '?')} concurrent clients on loopback, {cfg.get('duration_s_per_scenario', '?')} s per scenario, one server process:",
        "",
        "| scenario | SQLite req/s | p50 / p99 ms | PostgreSQL req/s | p50 / p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    by_db = {r["database"]: r["scenarios"] for r in d["results"]}
    names = list(next(iter(by_db.values())).keys())
    for n in names:
        cells = []
        errs = 0
        for db in ("sqlite", "postgresql"):
            sc = by_db.get(db, {}).get(n)
            if sc:
                cells += [f"{sc['requests_per_s']:.0f}", f"{sc['p50_ms']:.0f} / {sc['p99_ms']:.0f}"]
                errs += sc["errors"]
            else:
                cells += ["–", "–"]
        out.append(f"| {n.replace('_', ' ')} | " + " | ".join(cells) + f" | {errs} |")
    m = d.get("machine", {})
    out += ["", f"Load average {m.get('loadavg_1m_before', '?')} → {m.get('loadavg_1m_after', '?')} during the run (shared 2-core machine)."]
    fl = d.get("flood")
    if fl:
        posts = fl["posts"]
        out += ["", f"Flood ({posts['posts']} distinct expensive POSTs from {posts['clients']} clients, {posts['planned']} planned in "
                f"{posts['wall_s']:.0f} s, 429/503 retried; searches in {fl.get('search_workers', '?')} worker processes), p99 of two probe clients:", "",
                "| probe | idle p99 ms | flood p99 ms | ratio (goal ≤ 5×) |", "|---|---:|---:|---:|"]
        for k, label in (("healthz", "`GET /healthz`"), ("get_plan", "`GET /v1/plans/{id}`")):
            out.append(f"| {label} | {fl['idle'][k]['p99_ms']:.1f} | {fl['flood'][k]['p99_ms']:.1f} | {fl['p99_ratio'][k]:.1f}× |")
        earlier = fl.get("earlier_runs") or []
        if earlier:
            out += ["", "Earlier runs on the same shared machine, searches at a higher priority: " + "; ".join(
                f"nice {r['search_nice']}: {r['p99_ratio']['healthz']:.1f}× / {r['p99_ratio']['get_plan']:.1f}×" for r in earlier)
                + " (the ratio moves with the other jobs' load; the searches now run at nice 19)."]
    up = d.get("upload_memory")
    if up:
        out += ["", f"Upload memory: {up['uploads']} concurrent uploads of a {up['file_bytes'] / 1e6:.0f} MB ONNX file (weights in the file): "
                f"server RSS {up['rss_before_MB']:.0f} MB → peak {up['rss_peak_MB']:.0f} MB, **+{up['rss_added_peak_MB']:.0f} MB** (goal < 600 MB), "
                f"statuses {', '.join(str(x) for x in up['statuses'])}, {up['wall_s']:.0f} s."]
    return "\n".join(out)


def service_check() -> str | None:
    d = _load("service.json")
    c = (d or {}).get("check")
    if not c:
        return None
    st = c.get("schemathesis", {})
    dbs = st.get("databases", {})
    names = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    out = ["| database | schemathesis cases | responses ≥ 500 | schema violations | bad inputs as expected |", "|---|---:|---:|---:|---:|"]
    for db in ("sqlite", "postgresql"):
        s, b = dbs.get(db, {}), c["bad_input"].get(db, {})
        if s or b:
            out.append(f"| {names[db]} | {s.get('cases', 0):,} | {s.get('responses_5xx', '–')} | {s.get('schema_violations', '–')} | "
                       f"{b.get('as_expected', '–')} of {b.get('inputs', '–')} |")
    statuses = ", ".join(f"{k} ×{v}" for k, v in dbs.get("sqlite", {}).get("status_counts", {}).items())
    out += ["", f"({st.get('cases_per_operation', '?')} cases per operation, fixed seed, as `tests/api/test_schemathesis.py` runs in CI with "
            f"auth on ({st.get('wall_s', '?')} s for both databases here); statuses on SQLite: {statuses}. Schema violations: an undocumented "
            "status code, body, content type or response header. The bad-input table, with the status and field of every input: "
            "[docs/BAD_INPUT.md](docs/BAD_INPUT.md).)"]
    return "\n".join(out)


def cpu() -> str | None:
    d = _load("cpu_validation.json")
    if not d:
        return None
    sm = d["summary"]
    out = ["| case | processes | measured step (s) | predicted with profile (s) | error | predicted without (s) | error |", "|---|---:|---:|---:|---:|---:|---:|"]
    for c in d["cases"]:
        w = c.get("predicted_with_profile") or {}
        wo = c.get("predicted_without_profile") or {}
        fmt = lambda x: f"{x * 100:+.0f}%" if isinstance(x, (int, float)) else "–"  # noqa: E731
        out.append(
            f"| {c['case']} ({c['config']['layers']}×h{c['config']['hidden']}, s {c['config']['seq']}, b {c['config']['micro_batch']}) "
            f"| {c['dp']} | {c['measured_step_s']:.3f} | {w.get('step_time_s', float('nan')):.3f} | {fmt(c.get('error_with_profile'))} "
            f"| {wo.get('step_time_s', float('nan')):.3f} | {fmt(c.get('error_without_profile'))} |"
        )
    with_ = sm.get("median_abs_error_with_profile")
    without = sm.get("median_abs_error_without_profile")
    out += ["", f"Median |error| with the fitted profile **{with_ * 100:.0f}%**" + (f", with catalog defaults **{without * 100:.0f}%**." if without is not None else ".")]
    by_dp = {}
    for c in d["cases"]:
        if isinstance(c.get("error_with_profile"), (int, float)):
            by_dp.setdefault(c["dp"], []).append(abs(c["error_with_profile"]))
    if len(by_dp) > 1:
        parts = [f"{'one process' if dp == 1 else f'{dp} DDP processes'} {statistics.median(v) * 100:.0f}%" for dp, v in sorted(by_dp.items())]
        out[-1] += " By setting, with the profile: " + ", ".join(parts) + "."
    ew, gemm_GFLOPs = [], {}
    for c in d["cases"]:
        path = ROOT / c["profile"]["file"] if c.get("profile") else None
        if path and path.exists():
            rates = json.loads(path.read_text())["fit"]["rates"]
            ew.append(rates.get("elementwise") or {})
            if rates.get("gemm_tflops", {}).get("fp32"):
                gemm_GFLOPs.setdefault(c["threads_per_process"], []).append(rates["gemm_tflops"]["fp32"] * 1e3)
    faults = [(c["case"], c["page_faulted_bytes_per_step"]) for c in d["cases"] if c.get("page_faulted_bytes_per_step") is not None]
    if faults:
        out.append("")
        out.append("Memory page-faulted in per measured step (one process, minor faults × page size): "
                   + ", ".join(f"{name} {b / 1e6:.0f} MB" for name, b in faults) + ".")
    host = d.get("host") or {}
    if host:
        speeds = ", ".join(f"{min(v):.0f}–{max(v):.0f} GFLOP/s with {t} thread{'s' if t > 1 else ''}" for t, v in sorted(gemm_GFLOPs.items()))
        out.append("")
        out.append(f"Host: {host.get('cpu', '?')}, {host.get('cores', '?')} cores, torch {host.get('torch', '?')}"
                   + (f"; profiled fp32 GEMM rate {speeds}." if speeds else "."))
    if ew:
        def span(key: str, scale: float, unit: str) -> str:
            vals = [e[key] * scale for e in ew if e.get(key)]
            return f"{min(vals):.2g}–{max(vals):.2g} {unit}" if vals else "0"
        out.append("")
        out.append(f"Per-element costs the {len(ew)} profiles fitted on this CPU: dropout random numbers {span('rng_s_per_element', 1e9, 'ns')}, "
                   f"exp/erf {span('transcendental_s_per_element', 1e9, 'ns')}, first touch of fresh tensors ≥ 32 MiB "
                   f"{span('first_touch_s_per_byte', 1e9, 'ns/byte')} (all zero on GPUs).")
    lo = _load("lora_cpu.json")
    if lo:
        w, lr = lo["rows"]["whole"], lo["rows"]["lora"]
        out.append("")
        out.append(f"**LoRA on this CPU** (`make bench-lora-cpu`, `bench/results/lora_cpu.json`; {lo['host']['cpu']}): case L trained whole "
                   f"and as PEFT's LoRA trains it (rank {lo['lora_rank']} on every linear layer, the rest frozen), alternately: "
                   f"**LoRA / whole step measured {lo['measured_ratio']:.3f}, predicted {lo['predicted_ratio']:.3f}** "
                   f"(pairs {min(lo['measured_pair_ratios']):.3f}–{max(lo['measured_pair_ratios']):.3f}); whole {w['measured_step_s']:.3f} s "
                   f"measured, {w['predicted_step_s']:.3f} s predicted ({w['error'] * 100:+.0f}%), LoRA {lr['measured_step_s']:.3f} s "
                   f"against {lr['predicted_step_s']:.3f} s ({lr['error'] * 100:+.0f}%) — the frozen layers' weight gradients saved, "
                   "the adapters' GEMMs and passes added back.")
    return "\n".join(out)


def graph() -> str | None:
    d = _load("graph.json")
    if not d:
        return None
    reps = d.get("repeats", 1)
    out = [f"| model | operators | parameters | plan wall time (median of {reps}) | CPU time | predicted step | layout | proved |",
           "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in d["rows"]:
        s = r.get("strategy", {})
        emb = r.get("embeddings") or {}
        where = f", tables {', '.join(sorted(set(str(v) for v in emb.values())))}" if emb else ""
        gap = r.get("gap")
        proof = {"proved_optimal": "optimal", "within_gap": f"within {gap:.3%} of optimal" if gap is not None else "within 1%"}.get(
            r.get("optimality", ""), f"gap ≤ {gap:.1%} to the bound" if gap is not None else "no bound (time limit)")
        cpu = f"{r['plan_cpu_s']:.1f} s" if "plan_cpu_s" in r else "-"
        out.append(
            f"| {r['case']} | {r['operators']:,} | {r['params'] / 1e9:.2f} B | {r['plan_wall_s']:.1f} s | {cpu} | {r['step_time_s'] * 1e3:.1f} ms "
            f"| dp {s.get('dp')} tp {s.get('tp')} pp {s.get('pp')}{where} | {proof} |"
        )
    loads = [r["load_average"] for r in d["rows"] if "load_average" in r]
    if loads:
        out.append("")
        out.append(f"Load average on the shared {d['machine']['cpus']}-core machine during the runs: "
                   f"{min(loads):.1f}–{max(loads):.1f}; each case's {reps} runs gave the same plan"
                   f"{'' if all(r.get('runs_identical', True) for r in d['rows']) else ' (except: see graph.json)'}.")
    return "\n".join(out)


def reproducibility() -> str | None:
    d = _load("reproducibility.json")
    if not d:
        return None
    out = [
        "| README example | runs | distinct plans | solver | search work (deterministic s) | search wall time (min–max) |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for c in d["cases"]:
        work = ", ".join(f"{w:.2f}" for w in c["search_work_s"]) or "—"
        out.append(f"| `{c['command']}` | {c['runs']} | {c['distinct_plans']} | {', '.join(c['solver_status'])} | {work} | "
                   f"{c['search_wall_time_s_min']:.2f}–{c['search_wall_time_s_max']:.2f} s |")
    out.append("")
    out.append(f"Each run a fresh process; every other run shares the {d['host_cpus']}-core host with a busy process, so the "
               "clock differs while the work does not. A plan is compared byte for byte as `--json` prints it, less "
               "`search.wall_time_s`. Run: `make bench-repro`.")
    return "\n".join(out)


SECTIONS = {"fidelity": fidelity, "physics": physics, "acceptance": acceptance, "plan": plan, "service_check": service_check, "service": service, "cpu": cpu, "graph": graph, "reproducibility": reproducibility}


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    for name, fn in SECTIONS.items():
        body = fn()
        if body is None:
            continue
        pattern = re.compile(rf"(<!-- bench:{name} -->\n).*?(<!-- /bench:{name} -->)", re.S)
        if not pattern.search(text):
            print(f"README has no markers for {name}", file=sys.stderr)
            continue
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    readme.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
