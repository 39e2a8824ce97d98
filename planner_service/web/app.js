// The planner's web page: compose a plan request, show a plan, list stored plans.
// Plain JavaScript, no dependencies; talks only to this origin's /v1 API.
// Views are chosen by the URL hash: #/new, #/plans[?filters], #/plans/<id>.
"use strict";

(() => {
  // ───────────── small helpers ─────────────

  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

  /** h("td", {class: "num"}, "text", node, ...): build an element; text is never parsed as HTML. */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k in el && typeof v !== "string") el[k] = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  /** el.replaceChildren(...) that skips null/false (parts of a view that do not apply). */
  function setChildren(el, ...children) {
    el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  }

  const delay = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // Observed peaks are stored in GB of 10^9 bytes; predictions and device memories are in the
// units the allocator prints (binary: an "80 GB" GPU holds 80 GiB), so the observed peak is
// shown in those too, as the service converted it (peak_memory_as_printed_GB).
function observedPeak(printedGB, observedGB, predictedGB) {
  if (observedGB == null) return `observed –, predicted ${fmt.gb(predictedGB)}`;
  return `observed ${printedGB.toFixed(1)} GiB as printed (${fmt.gb(observedGB)}), predicted ${fmt.gb(predictedGB)}`;
}

const fmt = {
    int: (n) => (n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US")),
    pct: (f, d = 1) => (f === null || f === undefined ? "–" : (f * 100).toFixed(d) + "%"),
    gb: (x) => (x === null || x === undefined ? "–" : x.toFixed(x < 10 ? 2 : 1) + " GB"),
    time(s) {
      if (s === null || s === undefined) return "–";
      if (Math.abs(s) < 1e-9) return "0"; // float noise below a nanosecond
      if (s < 1e-3) return (s * 1e6).toPrecision(3) + " µs";
      if (s < 1) return (s * 1e3).toPrecision(3) + " ms";
      if (s < 600) return s.toPrecision(3) + " s";
      if (s < 2 * 86400) return (s / 3600).toFixed(1) + " h";
      return (s / 86400).toFixed(1) + " days";
    },
    params(n) {
      if (!n) return "–";
      if (n >= 1e9) return (n / 1e9).toFixed(n >= 1e10 ? 0 : 1) + "B";
      return (n / 1e6).toFixed(0) + "M";
    },
    date: (iso) => (iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("Z", " UTC") : "–"),
    money: (x) => "$" + x.toFixed(x < 10 ? 2 : 0),
    shortId: (id) => (id || "").slice(0, 8),
  };

  function compactStrategy(s) {
    const parts = [`dp${s.dp}`, `tp${s.tp}`, `pp${s.pp}`];
    if (s.cp > 1) parts.push(`cp${s.cp}`);
    if (s.ep > 1) parts.push(`ep${s.ep}`);
    if (s.etp) parts.push(`etp${s.etp}`);
    if (s.vpp > 1) parts.push(`vpp${s.vpp}`);
    parts.push(`mbs${s.micro_batch_size}`);
    if (s.sequence_parallel) parts.push("SP");
    if (s.recompute && s.recompute !== "none") parts.push(`recompute:${s.recompute}` + (s.recompute_num_layers ? `(${s.recompute_num_layers}/chunk)` : "")
      + (s.recompute_modules ? `(${s.recompute_modules.join("+")})` : ""));
    parts.push(`ZeRO-${s.zero_stage}` + (s.dp_shard ? `(shard ${s.dp_shard}×${s.dp / s.dp_shard})` : ""));
    return parts.join(" ");
  }

  function clusterSummary(cluster) {
    return (cluster.node_groups || [])
      .map((g) => `${g.count} × ${g.gpus_per_node} ${typeof g.device === "string" ? g.device : g.device.name || "custom"}`)
      .join(" + ");
  }

  // ───────────── API ─────────────

  /** A 4xx/5xx answer (or a network failure, status 0) with the API's {code, message, field}. */
  class ApiError extends Error {
    constructor(status, code, message, field) {
      super(message);
      this.status = status;
      this.code = code;
      this.field = field || null;
    }
  }

  // The API key (PLANNER_AUTH=enabled servers): typed into the header's key field, kept in
  // sessionStorage (gone when the tab closes), sent as Authorization: Bearer on every call.
  const KEY_STORAGE = "planner.apiKey";

  function apiKey() {
    try {
      return sessionStorage.getItem(KEY_STORAGE) || "";
    } catch (exc) {
      return "";
    }
  }

  function setupKeyField() {
    const input = document.getElementById("api-key");
    if (!input) return;
    input.value = apiKey();
    input.addEventListener("change", () => {
      try {
        if (input.value.trim()) sessionStorage.setItem(KEY_STORAGE, input.value.trim());
        else sessionStorage.removeItem(KEY_STORAGE);
      } catch (exc) {
        /* storage unavailable: the key lasts for this page only */
      }
    });
  }

  async function api(method, path, body) {
    const init = { method, headers: { Accept: "application/json" } };
    const key = apiKey() || (document.getElementById("api-key") || {}).value;
    if (key) init.headers.Authorization = `Bearer ${key.trim()}`;
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (exc) {
      throw new ApiError(0, "network", `cannot reach the server (${exc.message})`, null);
    }
    const text = await resp.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!resp.ok) {
      const err = (data && data.error) || {};
      throw new ApiError(resp.status, err.code || "http_" + resp.status, err.message || `${resp.status} ${resp.statusText}`, err.field);
    }
    return { status: resp.status, data };
  }

  // ───────────── state ─────────────

  const state = {
    presets: [],
    devices: [],
    clusters: [],
    plans: new Map(), // id → plan JSON (plans are immutable, so a cache never goes stale)
    flash: null,
    listSeq: 0,
    launchTargets: ($('meta[name="planner-launch-targets"]').content || "").split(",").filter((t) => t && !t.startsWith("__")),
  };

  function setFlash(message) {
    state.flash = message;
  }

  function showFlash() {
    const el = $("#flash");
    el.textContent = state.flash || "";
    el.hidden = !state.flash;
    state.flash = null;
  }

  // ───────────── inline errors ─────────────

  /** The visible element of ``root`` that stands for an API error field such as
   *  "cluster.node_groups[0].count": the exact data-field, else the nearest enclosing path. */
  function fieldElement(root, field) {
    let path = field;
    while (path) {
      const found = $$(`[data-field="${CSS.escape(path)}"]`, root).filter((el) => !el.closest("[hidden]"));
      const control = found.find((el) => /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName));
      if (control || found.length) return control || found[0];
      const cut = Math.max(path.lastIndexOf("."), path.lastIndexOf("["));
      path = cut > 0 ? path.slice(0, cut) : "";
    }
    return null;
  }

  function clearErrors(root, box) {
    $$(".field-error", root).forEach((el) => el.remove());
    $$("[aria-invalid]", root).forEach((el) => {
      el.removeAttribute("aria-invalid");
      el.removeAttribute("aria-describedby");
    });
    $$(".invalid", root).forEach((el) => el.classList.remove("invalid"));
    box.hidden = true;
    setChildren(box);
  }

  let errorSeq = 0;

  /** Show ``err`` in ``box`` ("field: message") and next to the field it names, then focus it. */
  function showError(root, box, err) {
    const field = err.field || null;
    setChildren(box,
      h("strong", {}, field ? `${field}: ` : err.status ? `Error ${err.status}: ` : "Error: "),
      err.message
    );
    box.hidden = false;
    const el = field ? fieldElement(root, field) : null;
    if (!el) {
      box.focus();
      return;
    }
    const id = "field-error-" + ++errorSeq;
    const note = h("span", { class: "field-error", id }, field === el.dataset.field ? err.message : `${field}: ${err.message}`);
    if (/^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName)) {
      el.setAttribute("aria-invalid", "true");
      el.setAttribute("aria-describedby", id);
      el.insertAdjacentElement("afterend", note);
    } else {
      el.classList.add("invalid");
      (el.tagName === "TBODY" ? el.closest("table") : el).insertAdjacentElement(el.tagName === "FIELDSET" ? "beforeend" : "afterend", note);
    }
    const details = el.closest("details");
    if (details) details.open = true;
    if (typeof el.focus === "function" && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName)) el.focus();
    else box.focus();
  }

  // ───────────── views and routing ─────────────

  function showView(name, title) {
    for (const v of $$(".view")) v.hidden = v.id !== "view-" + name;
    document.title = `${title} · Auto-parallel planner`;
    for (const [nav, view] of [["#nav-new", "new"], ["#nav-plans", "plans"]]) {
      if (name === view) $(nav).setAttribute("aria-current", "page");
      else $(nav).removeAttribute("aria-current");
    }
    showFlash();
  }

  function focusHeading(id) {
    const el = $(id);
    if (el) el.focus({ preventScroll: false });
  }

  function route() {
    const hash = location.hash || "#/new";
    const one = hash.match(/^#\/plans\/([^/?]+)$/);
    if (one) return showPlan(decodeURIComponent(one[1]));
    if (hash === "#/plans" || hash.startsWith("#/plans?")) return showList(new URLSearchParams(hash.split("?")[1] || ""));
    return showNew();
  }

  function go(hash) {
    if (location.hash === hash) route();
    else location.hash = hash;
  }

  // ───────────── new plan ─────────────

  const form = $("#plan-form");

  function fillCatalogs() {
    const preset = $("#preset");
    setChildren(preset,
      ...state.presets.map((p) => h("option", { value: p.name }, `${p.name} (${fmt.params(p.params)} params)`))
    );
    setChildren($("#preset-names"), ...state.presets.map((p) => h("option", { value: p.name })));
    setChildren($("#f-device"),
      h("option", { value: "" }, "any"),
      ...state.devices.map((d) => h("option", { value: d.name }, d.name))
    );
    setChildren($("#c-devices"), ...state.devices.map((d) => h("option", { value: d.name }, d.name)));
    updatePresetInfo();
  }

  function fillSavedClusters() {
    const sel = $("#saved-cluster");
    const current = sel.value;
    if (!state.clusters.length) {
      setChildren(sel, h("option", { value: "" }, "(no saved clusters: save one with POST /v1/clusters)"));
    } else {
      setChildren(sel, ...state.clusters.map((c) => h("option", { value: c.name }, c.name)));
      if (current && state.clusters.some((c) => c.name === current)) sel.value = current;
    }
    updateSavedInfo();
  }

  function updatePresetInfo() {
    const p = state.presets.find((x) => x.name === $("#preset").value);
    $("#preset-info").textContent = p
      ? `${p.num_hidden_layers} layers, hidden ${p.hidden_size}, ${p.num_attention_heads} heads` +
        (p.num_local_experts > 1 ? `, ${p.num_local_experts} experts` : "") +
        `, vocab ${p.vocab_size.toLocaleString("en-US")}`
      : "";
  }

  /** What each training.framework can run: written into the page by the server from the rule
   *  table the search applies (cost_model.frameworks.describe). */
  const FRAMEWORK_INFO = (() => {
    try {
      return JSON.parse($('meta[name="planner-frameworks"]').content);
    } catch {
      return {}; // the page opened without the server (the placeholder is not JSON)
    }
  })();

  function updateFrameworkInfo() {
    const info = FRAMEWORK_INFO[$("#framework").value];
    $("#framework-info").textContent = "Decides which layouts the search may propose and which pins it accepts. " + (info || "");
  }

  function updateSavedInfo() {
    const c = state.clusters.find((x) => x.name === $("#saved-cluster").value);
    $("#saved-info").textContent = c ? clusterSummary(c.cluster) : "";
  }

  function deviceOptions(selected) {
    return state.devices.map((d) =>
      h("option", { value: d.name, selected: d.name === selected }, `${d.name} (${d.memory_GB} GB)`)
    );
  }

  function renumberGroups() {
    $$("#groups tr").forEach((tr, i) => {
      for (const el of $$("[data-key]", tr)) {
        el.dataset.field = `cluster.node_groups[${i}].${el.dataset.key}`;
        el.setAttribute("aria-label", `Group ${i + 1} ${el.dataset.label}`);
      }
    });
    const rows = $$("#groups tr");
    rows.forEach((tr) => ($("button", tr).disabled = rows.length === 1));
  }

  function addGroup(g) {
    const n = $$("#groups tr").length;
    const input = (key, label, attrs) => h("input", { "data-key": key, "data-label": label, ...attrs });
    const tr = h(
      "tr",
      {},
      h("td", {}, input("name", "name", { type: "text", value: g.name || `g${n}`, size: 8 })),
      h("td", {}, h("select", { "data-key": "device", "data-label": "device" }, deviceOptions(g.device || "A100-SXM4-80GB"))),
      h("td", {}, input("count", "nodes", { type: "number", min: 1, step: 1, value: g.count || 1, class: "short" })),
      h("td", {}, input("gpus_per_node", "GPUs per node", { type: "number", min: 1, step: 1, value: g.gpus_per_node || 8, class: "short" })),
      h("td", {}, input("hostnames", "hostnames", { type: "text", placeholder: "node-0, node-1", value: (g.hostnames || []).join(", ") })),
      h("td", {}, input("price_per_gpu_hour", "price per GPU-hour", { type: "number", min: 0, step: "any", class: "short" })),
      h("td", {}, h("button", { type: "button", class: "secondary small", onclick: () => { tr.remove(); renumberGroups(); } }, "Remove"))
    );
    $("#groups").append(tr);
    renumberGroups();
    return tr;
  }

  function radioValue(name) {
    return $(`input[name="${name}"]:checked`).value;
  }

  function syncFormParts() {
    const transformer = radioValue("model-kind") === "transformer";
    $("#model-preset-row").hidden = transformer;
    $("#model-config-row").hidden = !transformer;
    const saved = radioValue("cluster-kind") === "saved";
    $("#cluster-describe").hidden = saved;
    $("#cluster-saved").hidden = !saved;
  }

  /** A problem found before sending (e.g. config.json that is not JSON), shaped like an API error. */
  const localError = (field, message) => new ApiError(0, "invalid_input", message, field);

  function num(id) {
    const v = $(id).value.trim();
    return v === "" ? undefined : Number(v);
  }

  function parseJsonObject(text, field) {
    let value;
    try {
      value = JSON.parse(text);
    } catch (exc) {
      throw localError(field, `is not valid JSON (${exc.message})`);
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) throw localError(field, "must be a JSON object");
    return value;
  }

  /** Constraint inputs: [element id, constraints key].  An empty input or "not pinned" leaves
   *  the key out (the planner searches that knob). */
  const CONSTRAINT_NUMBERS = [
    ["#c-dp", "dp"], ["#c-tp", "tp"], ["#c-pp", "pp"], ["#c-cp", "cp"], ["#c-ep", "ep"], ["#c-vpp", "vpp"],
    ["#c-mbs", "micro_batch_size"], ["#c-recompute-layers", "recompute_num_layers"], ["#c-dp-shard", "dp_shard"], ["#c-etp", "etp"],
    ["#c-max-tp", "max_tp"], ["#c-max-pp", "max_pp"], ["#c-max-devices", "max_devices"], ["#c-headroom", "memory_headroom_fraction"],
  ];
  const CONSTRAINT_CHOICES = [
    ["#c-sp", "sequence_parallel", (v) => v === "true"],
    ["#c-recompute", "recompute", (v) => v],
    ["#c-recompute-method", "recompute_method", (v) => v],
    ["#c-zero", "zero_stage", Number],
    ["#c-split-emb", "account_for_embedding_in_pipeline_split", (v) => v === "true"],
    ["#c-split-loss", "account_for_loss_in_pipeline_split", (v) => v === "true"],
    ["#c-tight", "tight_memory", (v) => v],
  ];

  /** "More training options": [element id, training key, the contract's default (as the
   *  select's value), parse].  A control at the default leaves its key out, so a request that
   *  does not touch them is unchanged (same body, same hash). */
  const TRAINING_CHOICES = [
    ["#t-attention", "attention", "flash", (v) => v],
    ["#t-fused-kernels", "fused_kernels", "true", (v) => v === "true"],
    ["#t-tp-overlap", "tp_comm_overlap", "false", (v) => v === "true"],
    ["#t-grad-overlap", "grad_reduce_overlap", "true", (v) => v === "true"],
    ["#t-cp-comm", "cp_comm_type", "", (v) => v],
    ["#t-grad-accum", "grad_accum_dtype", "", (v) => v],
    ["#t-precision-aware", "precision_aware_optimizer", "false", (v) => v === "true"],
    ["#t-main-grads", "main_grads_dtype", "fp32", (v) => v],
    ["#t-master-weights", "master_weights", "true", (v) => v === "true"],
    ["#t-cpu-offload", "cpu_offload", "false", (v) => v === "true"],
    ["#t-fp8-param-gather", "fp8_param_gather", "false", (v) => v === "true"],
    ["#t-act-offload", "activation_offloading", "false", (v) => v === "true"],
    ["#t-submodule-ckpt", "submodule_checkpointing", "false", (v) => v === "true"],
    ["#t-opt-in-bwd", "optimizer_in_backward", "false", (v) => v === "true"],
    ["#t-ref-model", "reference_model", "false", (v) => v === "true"],
    ["#t-lora-base", "lora_base_dtype", "", (v) => v],
    ["#t-loss-kernel", "loss_kernel", "unfused", (v) => v],
    ["#t-main-params", "main_params_dtype", "fp32", (v) => v],
    ["#t-exp-avg", "exp_avg_dtype", "fp32", (v) => v],
    ["#t-exp-avg-sq", "exp_avg_sq_dtype", "fp32", (v) => v],
    ["#t-moe-dispatcher", "moe_token_dispatcher", "alltoall", (v) => v],
    ["#t-moe-overlap", "moe_comm_overlap", "false", (v) => v === "true"],
  ];

  function trainingOptionsFromForm() {
    const out = {};
    for (const [id, key, byDefault, parse] of TRAINING_CHOICES) {
      const v = $(id).value;
      if (v !== byDefault) out[key] = parse(v);
    }
    // empty: dropless (the contract's None), left out
    const capacity = num("#t-moe-capacity");
    if (capacity !== undefined) out.moe_capacity_factor = capacity;
    // empty: no hierarchical context parallelism (the contract's None), left out
    const cpA2a = num("#t-cp-a2a");
    if (cpA2a !== undefined) out.cp_a2a_size = cpA2a;
    // empty or 0: pp, or the smallest group that runs (the contract's 0), left out
    const mbGroup = num("#t-mb-group");
    if (mbGroup !== undefined && mbGroup !== 0) out.microbatch_group_size_per_vp_stage = mbGroup;
    // empty or 1: one pipeline schedule a step (the contract's default), left out
    const schedules = num("#t-pp-schedules");
    if (schedules !== undefined && schedules !== 1) out.pipeline_schedules_per_step = schedules;
    // none selected: every saved tensor when activation offloading is on (the contract's default), left out
    const offloadModules = Array.from($("#t-offload-modules").selectedOptions, (o) => o.value);
    if (offloadModules.length) out.offload_modules = offloadModules;
    // empty or 0: nothing offloaded (the contract's default), left out
    const offload = num("#t-offload");
    if (offload !== undefined && offload !== 0) out.optimizer_offload_fraction = offload;
    // LoRA: empty or 0 is full finetuning (the contract's default), left out; no layer selected
    // is every decoder linear layer, and dropout empty or 0 none — both left out
    const loraRank = num("#t-lora-rank");
    if (loraRank !== undefined && loraRank !== 0) out.lora_rank = loraRank;
    const loraModules = Array.from($("#t-lora-modules").selectedOptions, (o) => o.value);
    if (loraModules.length) out.lora_target_modules = loraModules;
    const loraDropout = num("#t-lora-dropout");
    if (loraDropout !== undefined && loraDropout !== 0) out.lora_dropout = loraDropout;
    return out;
  }

  function constraintsFromForm() {
    const out = {};
    for (const [id, key] of CONSTRAINT_NUMBERS) {
      const v = num(id);
      if (v !== undefined) out[key] = v;
    }
    for (const [id, key, parse] of CONSTRAINT_CHOICES) {
      const v = $(id).value;
      if (v !== "") out[key] = parse(v);
    }
    // none selected: every node group's device (the key left out)
    const devices = Array.from($("#c-devices").selectedOptions, (o) => o.value);
    if (devices.length) out.allowed_device_types = devices;
    // none selected: not pinned (the search keeps Megatron-Core's default or offers the lean set)
    const modules = Array.from($("#c-recompute-modules").selectedOptions, (o) => o.value);
    if (modules.length) out.recompute_modules = modules;
    const layers = $("#c-layers").value.trim();
    if (layers) {
      const parts = layers.split(/[\s,]+/).filter(Boolean);
      if (!parts.every((x) => /^\d+$/.test(x))) throw localError("constraints.layers_per_stage", "must be whole numbers separated by commas, one per stage (or per model chunk when interleaved)");
      out.layers_per_stage = parts.map(Number);
    }
    return out;
  }

  /** The POST /v1/plans body described by the form.  Empty optional inputs are left out, so the
   *  server's defaults apply and a missing required value is reported by the server, by field. */
  function requestFromForm() {
    const body = {};
    if (radioValue("model-kind") === "preset") {
      body.model = { preset: $("#preset").value };
    } else {
      const text = $("#hf-config").value.trim();
      if (!text) throw localError("model.transformer", "paste the model's config.json");
      body.model = { transformer: parseJsonObject(text, "model.transformer") };
      const name = $("#model-name").value.trim();
      if (name) body.model.name = name;
    }
    body.training = {
      global_batch_size: num("#global-batch"),
      sequence_length: num("#seq-len"),
      dtype: $("#dtype").value,
      optimizer: $("#optimizer").value,
    };
    // The default framework is left out, so a request that does not choose one is unchanged.
    if ($("#framework").value !== "megatron-core") body.training.framework = $("#framework").value;
    const totalTokens = num("#total-tokens");
    if (totalTokens !== undefined) body.training.total_tokens = totalTokens;
    Object.assign(body.training, trainingOptionsFromForm());
    if (radioValue("cluster-kind") === "saved") {
      body.cluster = $("#saved-cluster").value;
    } else {
      body.cluster = {
        name: $("#cluster-name").value.trim(),
        node_groups: $$("#groups tr").map((tr) => {
          const get = (key) => $(`[data-key="${key}"]`, tr).value.trim();
          const group = { name: get("name"), device: get("device") };
          for (const key of ["count", "gpus_per_node"]) if (get(key) !== "") group[key] = Number(get(key));
          const hosts = get("hostnames").split(",").map((x) => x.trim()).filter(Boolean);
          if (hosts.length) group.hostnames = hosts;
          if (get("price_per_gpu_hour") !== "") group.price_per_gpu_hour = Number(get("price_per_gpu_hour"));
          return group;
        }),
      };
    }
    const constraints = constraintsFromForm();
    if (Object.keys(constraints).length) body.constraints = constraints;
    body.objective = $("#objective").value;
    const topK = num("#top-k");
    if (topK !== undefined) body.top_k = topK;
    if ($("#async").checked) body.async = true;
    if ($("#force").checked) body.force = true;
    return body;
  }

  function syncMode() {
    const json = radioValue("mode") === "json";
    if (json && !$("#request-json").value.trim()) {
      try {
        $("#request-json").value = JSON.stringify(requestFromForm(), null, 2);
      } catch (_) {
        /* the form is incomplete: leave the text area empty */
      }
    }
    $("#form-fields").hidden = json;
    $("#json-fields").hidden = !json;
  }

  function setProgress(children) {
    setChildren($("#plan-progress"), ...children);
  }

  /** Poll a job until it ends; resolves to its plan id, rejects with its error.  ``show`` gets
   *  the job on every poll (to draw progress). */
  async function waitForJob(job, show) {
    for (;;) {
      show(job);
      if (job.status === "succeeded") return job.plan_id;
      if (job.status === "failed") {
        const e = job.error || {};
        throw new ApiError(422, e.code || "job_failed", e.message || "the job failed", e.field);
      }
      if (job.status === "cancelled") throw new ApiError(0, "cancelled", `job ${job.id} was cancelled`, null);
      await delay(400);
      job = (await api("GET", `/v1/jobs/${encodeURIComponent(job.id)}`)).data;
    }
  }

  function jobProgress(job) {
    return [
      h("progress", { max: 1, value: job.progress || 0, "aria-label": "Job progress" }),
      ` job ${fmt.shortId(job.id)}: ${job.status} ${Math.round((job.progress || 0) * 100)}% `,
      job.status === "queued" || job.status === "running"
        ? h("button", {
            type: "button",
            class: "secondary small",
            onclick: () => api("DELETE", `/v1/jobs/${encodeURIComponent(job.id)}`).catch(() => {}),
          }, "Cancel job")
        : null,
    ];
  }

  async function submitPlan(ev) {
    ev.preventDefault();
    const box = $("#form-error");
    clearErrors(form, box);
    let body;
    try {
      body = radioValue("mode") === "json" ? parseJsonObject($("#request-json").value, "body") : requestFromForm();
    } catch (err) {
      showError(form, box, err);
      return;
    }
    const button = $("#submit-plan");
    button.disabled = true;
    setProgress(["Planning…"]);
    try {
      const r = await api("POST", "/v1/plans", body);
      if (r.status === 202) {
        const planId = await waitForJob(r.data, (job) => setProgress(jobProgress(job)));
        setFlash(`Planned by job ${r.data.id}.`);
        go("#/plans/" + encodeURIComponent(planId));
      } else {
        state.plans.set(r.data.id, r.data);
        setFlash(
          r.status === 200
            ? "An identical request was planned before: this is the stored plan (tick “force” to plan again)."
            : "Planned."
        );
        go("#/plans/" + encodeURIComponent(r.data.id));
      }
      setProgress([]);
    } catch (err) {
      setProgress([]);
      showError(form, box, err);
    } finally {
      button.disabled = false;
    }
  }

  async function showNew() {
    showView("new", "New plan");
    focusHeading("#new-title");
    try {
      state.clusters = (await api("GET", "/v1/clusters")).data.items;
      fillSavedClusters();
    } catch (_) {
      /* the form still works with a described cluster */
    }
  }

  // ───────────── plans list ─────────────

  const LIST_PAGE = 25;

  function listQuery(params, cursor) {
    const q = new URLSearchParams();
    for (const key of ["model", "cluster", "device", "min_tokens_per_s", "sort"]) if (params.get(key)) q.set(key, params.get(key));
    q.set("limit", params.get("limit") || String(LIST_PAGE));
    if (cursor) q.set("cursor", cursor);
    return "/v1/plans?" + q.toString();
  }

  function planRow(p) {
    const link = h("a", { href: "#/plans/" + encodeURIComponent(p.id), title: p.id }, fmt.shortId(p.id));
    const [day, time] = fmt.date(p.created_at).split(" ");
    const tr = h(
      "tr",
      { class: "clickable", "data-plan-id": p.id },
      h("td", {}, link),
      h("td", { class: "created col-created", title: fmt.date(p.created_at) }, day, " ", time ? h("span", { class: "hint nowrap" }, `${time} UTC`) : null),
      h("td", { class: "nowrap" }, p.model.name, h("span", { class: "hint" }, ` ${fmt.params(p.model.params)}`)),
      h("td", { class: "col-cluster" }, p.cluster_name || "–"),
      h("td", {}, `${p.num_devices} GPUs`, (p.device_types || []).map((t) => h("div", { class: "nowrap hint" }, t))),
      h("td", { class: "mono col-strategy" }, compactStrategy(p.strategy)),
      h("td", { class: "num" }, fmt.time(p.step_time_s)),
      h("td", { class: "num" }, fmt.int(p.tokens_per_s)),
      h("td", { class: "num" }, fmt.pct(p.mfu)),
      h("td", { class: "col-status" }, p.status, p.parent_id ? h("span", { class: "hint" }, ` replan of ${fmt.shortId(p.parent_id)}`) : null)
    );
    tr.addEventListener("click", (ev) => {
      if (!ev.target.closest("a")) go("#/plans/" + encodeURIComponent(p.id));
    });
    return tr;
  }

  async function loadPage(params, cursor) {
    const seq = ++state.listSeq;
    const box = $("#list-error");
    const more = $("#plans-more");
    more.disabled = true;
    try {
      const { data } = await api("GET", listQuery(params, cursor));
      if (seq !== state.listSeq) return; // a newer query replaced this one
      if (!cursor) setChildren($("#plans-body"));
      $("#plans-body").append(...data.items.map(planRow));
      $("#plans-empty").hidden = $("#plans-body").children.length > 0;
      more.hidden = !data.next_cursor;
      $("#plans-body").dataset.query = listQuery(params, null);
      more.onclick = () => loadPage(params, data.next_cursor);
    } catch (err) {
      if (seq !== state.listSeq) return;
      showError($("#filter-form"), box, err);
    } finally {
      more.disabled = false;
    }
  }

  function showList(params) {
    showView("plans", "Plans");
    clearErrors($("#filter-form"), $("#list-error"));
    $("#f-model").value = params.get("model") || "";
    $("#f-device").value = params.get("device") || "";
    $("#f-min-tps").value = params.get("min_tokens_per_s") || "";
    $("#f-sort").value = params.get("sort") || "-created_at";
    setChildren($("#plans-body"));
    delete $("#plans-body").dataset.query;
    $("#plans-empty").hidden = true;
    $("#plans-more").hidden = true;
    focusHeading("#plans-title");
    return loadPage(params, null);
  }

  function submitFilters(ev) {
    ev.preventDefault();
    const q = new URLSearchParams();
    const set = (key, v) => v && q.set(key, v);
    set("model", $("#f-model").value.trim());
    set("device", $("#f-device").value);
    set("min_tokens_per_s", $("#f-min-tps").value.trim());
    if ($("#f-sort").value !== "-created_at") q.set("sort", $("#f-sort").value);
    const qs = q.toString();
    go("#/plans" + (qs ? "?" + qs : ""));
  }

  // ───────────── one plan ─────────────

  const BREAKDOWN_KEYS = ["compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm_exposed", "offload_exposed", "bubble", "optimizer"];

  function section(title, key, ...children) {
    const id = "sec-" + key;
    return h("section", { class: "panel", "data-section": key, "aria-labelledby": id }, h("h2", { id }, title), ...children);
  }

  function kv(pairs) {
    return h("dl", { class: "kv" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  function table(caption, headers, rows, attrs) {
    return h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "data", ...(attrs || {}) },
        h("caption", { class: "sr-only" }, caption),
        h("thead", {}, h("tr", {}, headers.map((c) => h("th", { scope: "col", class: /^(Time|Step|Tokens|MFU|Peak|GPUs|Fwd)/.test(c) ? "num" : null }, c)))),
        h("tbody", {}, rows)
      )
    );
  }

  function breakdownBar(breakdown) {
    const total = BREAKDOWN_KEYS.reduce((s, k) => s + (breakdown[k] || 0), 0) || 1;
    const nonzero = BREAKDOWN_KEYS.filter((k) => breakdown[k] / total > 1e-6);
    const label = "Step time breakdown: " + nonzero.map((k) => `${k} ${fmt.pct(breakdown[k] / total)}`).join(", ");
    const bar = h("div", { class: "bar", role: "img", "aria-label": label });
    for (const k of nonzero) {
      const seg = h("span", { class: "seg seg-" + k, title: `${k}: ${fmt.time(breakdown[k])} (${fmt.pct(breakdown[k] / total)})` });
      seg.style.width = ((breakdown[k] / total) * 100).toFixed(3) + "%";
      bar.append(seg);
    }
    const legend = h(
      "ul",
      { class: "legend" },
      BREAKDOWN_KEYS.map((k) =>
        h("li", { class: nonzero.includes(k) ? null : "zero" }, h("span", { class: "swatch seg-" + k, "aria-hidden": "true" }), `${k} ${fmt.time(breakdown[k] || 0)} (${fmt.pct((breakdown[k] || 0) / total)})`)
      )
    );
    return [bar, legend];
  }

  /** How an alternative differs from the best plan: its knobs, its step time, and the term of
   *  the breakdown that grew most. */
  function versusBest(best, alt) {
    const knobs = Object.keys(alt.strategy)
      .filter((k) => JSON.stringify(alt.strategy[k]) !== JSON.stringify(best.strategy[k]))
      .map((k) => {
        const v = alt.strategy[k];
        if (Array.isArray(v)) return `${k}=${v.join("/")}`;
        return v !== null && typeof v === "object" ? `other ${k}` : `${k}=${v}`;
      });
    let change = alt.prediction.step_time_s / best.prediction.step_time_s - 1;
    if (Math.abs(change) < 5e-4) change = 0; // shows as +0.0%, not -0.0%
    let grew = null;
    for (const k of BREAKDOWN_KEYS) {
      const inc = (alt.prediction.breakdown_s[k] || 0) - (best.prediction.breakdown_s[k] || 0);
      if (inc > 1e-9 && (!grew || inc > grew.inc)) grew = { k, inc };
    }
    return (
      `${knobs.join(", ") || "same knobs"}: step ${change >= 0 ? "+" : ""}${fmt.pct(change)}` +
      (grew ? `, most of it ${grew.k} (+${fmt.time(grew.inc)})` : "")
    );
  }

  function memoryCell(used, capacity) {
    const frac = capacity ? Math.min(1, used / capacity) : 0;
    const fill = h("span", { class: frac > 0.9 ? "fill tight" : "fill" });
    fill.style.width = (frac * 100).toFixed(1) + "%";
    return h("td", { class: "num" }, `${fmt.gb(used)} / ${fmt.gb(capacity)}`, h("span", { class: "mem", "aria-hidden": "true" }, fill));
  }

  function stagesTable(stages) {
    return table(
      "Pipeline stages",
      ["Stage", "Layers", "Device", "Node group", "Hosts", "GPUs", "Fwd + bwd per micro-batch", "Peak memory"],
      stages.map((s) =>
        h(
          "tr",
          {},
          h("td", {}, String(s.index)),
          h("td", {}, `${s.first_layer}–${s.last_layer} (${s.num_layers})`, s.has_embedding ? h("span", { class: "hint" }, " +embedding") : null, s.has_head ? h("span", { class: "hint" }, " +head") : null),
          h("td", {}, s.device),
          h("td", {}, s.node_group || "–"),
          h("td", { class: "hosts" }, (s.hosts || []).join(", ")),
          h("td", { class: "num" }, String(s.num_gpus ?? "–")),
          h("td", { class: "num" }, `${fmt.time(s.time_per_microbatch_s)} (${fmt.time(s.forward_s)} + ${fmt.time(s.backward_s)})`),
          memoryCell(s.peak_memory_GB, s.memory_capacity_GB)
        )
      ),
      { id: "stages-table" }
    );
  }

  /** Figures the plan implies but does not state: cost per hour and time to train. */
  function derived(plan) {
    const out = [];
    const pred = plan.best.prediction;
    const total = plan.training && plan.training.total_tokens;
    if (total && pred.tokens_per_s) out.push(["Time to train (total tokens ÷ tokens/s)", fmt.time(total / pred.tokens_per_s)]);
    const price = new Map((plan.cluster.node_groups || []).map((g) => [g.name, g.price_per_gpu_hour]));
    const ranks = plan.best.ranks || [];
    if (ranks.length && ranks.every((r) => typeof price.get(r.node_group) === "number")) {
      const perHour = ranks.reduce((s, r) => s + price.get(r.node_group), 0);
      out.push(["Cost per hour (GPUs used × price)", fmt.money(perHour)]);
      if (pred.tokens_per_s) out.push(["Cost per million tokens", fmt.money((perHour / (pred.tokens_per_s * 3600)) * 1e6)]);
    }
    return out;
  }

  function diffSection(diff) {
    const changes = Object.entries(diff.strategy_changes || {});
    return section(
      "Change from the parent plan",
      "diff",
      kv([
        ["Parent", h("a", { href: "#/plans/" + encodeURIComponent(diff.parent_id) }, fmt.shortId(diff.parent_id))],
        ["Tokens/s", `${fmt.int(diff.tokens_per_s_before)} → ${fmt.int(diff.tokens_per_s_after)} (${diff.tokens_per_s_change_fraction >= 0 ? "+" : ""}${fmt.pct(diff.tokens_per_s_change_fraction)})`],
        ["Step time", `${fmt.time(diff.step_time_s_before)} → ${fmt.time(diff.step_time_s_after)}`],
        ["Ranks moved", `${diff.ranks_moved} (ranks ${diff.ranks_before} → ${diff.ranks_after})`],
        ["Chosen", `${diff.selected} among ${diff.candidates_within_tolerance} plans within ${fmt.pct(diff.tolerance_fraction, 0)} of the best`],
      ]),
      changes.length
        ? table("Strategy changes", ["Knob", "Before", "After"], changes.map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, JSON.stringify(v.from)), h("td", {}, JSON.stringify(v.to)))), { id: "diff-table" })
        : h("p", {}, "The strategy did not change.")
    );
  }

  function launchSection(plan) {
    const targets = state.launchTargets.length ? state.launchTargets : ["torchrun", "slurm", "rankmap"];
    const out = h("div", { id: "launch-output", "aria-live": "polite" });
    const box = h("div", { class: "error-box", role: "alert", hidden: true, tabindex: -1 });
    const field = (label, key, attrs) => h("label", {}, label, h("input", { type: "text", "data-field": key, "data-key": key, ...(attrs || {}) }));
    const lform = h(
      "form",
      { id: "launch-form", class: "launch" },
      box,
      h("div", { class: "grid" },
        h("label", {}, "Target", h("select", { id: "launch-target", "data-field": "target", "data-key": "target" }, targets.map((t) => h("option", { value: t }, t)))),
        field("Container image (Kubernetes targets)", "image", { placeholder: "nvcr.io/nvidia/pytorch:24.05-py3" }),
        field("Job name", "job_name"),
        field("Namespace", "namespace", { placeholder: "default" }),
        field("Queue / partition", "queue"),
        field("Training command", "command", { placeholder: "train.py --config cfg.yaml" })
      ),
      h("div", { class: "row" },
        h("label", {}, h("input", { type: "checkbox", "data-key": "smoke_test" }), " NCCL smoke test before training"),
        h("button", { type: "submit", id: "launch-submit" }, "Get launch files")
      )
    );
    lform.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(lform, box);
      const q = new URLSearchParams();
      for (const el of $$("[data-key]", lform)) {
        if (el.type === "checkbox") {
          if (el.checked) q.set(el.dataset.key, "true");
        } else if (el.value.trim()) q.set(el.dataset.key, el.value.trim());
      }
      const base = `/v1/plans/${encodeURIComponent(plan.id)}/launch`;
      setChildren(out, "Rendering…");
      try {
        const { data } = await api("GET", `${base}?${q}`);
        const files = Object.keys(data.files);
        files.sort((a, b) => (a === data.primary ? -1 : b === data.primary ? 1 : 0));
        setChildren(out,
          data.notes && data.notes.length ? h("ul", { class: "notes" }, data.notes.map((n) => h("li", {}, n))) : null,
          data.warnings && data.warnings.length ? h("ul", { class: "warnings" }, data.warnings.map((n) => h("li", {}, n))) : null,
          ...files.map((name) => {
            const raw = new URLSearchParams(q);
            raw.set("format", "raw");
            raw.set("file", name);
            const pre = h("pre", { class: "file", tabindex: 0 }, data.files[name]);
            return h(
              "details",
              { class: "launch-file", "data-name": name, open: name === data.primary },
              h("summary", {}, name, name === data.primary ? h("span", { class: "hint" }, " (primary)") : null),
              h("div", { class: "file-actions" },
                h("a", { href: `${base}?${raw}`, download: name.replace(/^\./, "_") }, "Download"),
                h("button", {
                  type: "button",
                  class: "secondary small",
                  onclick: (e) => navigator.clipboard && navigator.clipboard.writeText(data.files[name]).then(() => (e.target.textContent = "Copied"), () => {}),
                }, "Copy")
              ),
              pre
            );
          })
        );
      } catch (err) {
        setChildren(out);
        showError(lform, box, err);
      }
    });
    return section("Launch", "launch", lform, out);
  }

  function replanSection(plan) {
    const nodes =
      plan.cluster.nodes && plan.cluster.nodes.length
        ? plan.cluster.nodes
        : (plan.cluster.node_groups || []).flatMap((g) => (g.hostnames || []).map((hn) => ({ hostname: hn, group: g.name, available: true })));
    const box = h("div", { class: "error-box", role: "alert", hidden: true, tabindex: -1 });
    const status = h("span", { class: "progress", role: "status", "aria-live": "polite" });
    const list = h(
      "fieldset",
      { class: "nodes", "data-field": "unavailable_nodes" },
      h("legend", {}, "Nodes that are down"),
      nodes.map((n) =>
        h("label", {},
          h("input", { type: "checkbox", value: n.hostname, checked: n.available === false, disabled: n.available === false }),
          ` ${n.hostname} `,
          h("span", { class: "hint" }, n.available === false ? `(${n.group}, already down)` : `(${n.group})`)
        )
      )
    );
    const rform = h("form", { id: "replan-form" }, box, list, h("div", { class: "row" }, h("button", { type: "submit", id: "replan-submit" }, "Replan without these nodes"), status));
    rform.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(rform, box);
      const down = $$("input:checked:not(:disabled)", list).map((el) => el.value);
      const button = $("#replan-submit", rform);
      button.disabled = true;
      setChildren(status, "Replanning…");
      try {
        const r = await api("POST", `/v1/plans/${encodeURIComponent(plan.id)}/replan`, { unavailable_nodes: down });
        let id = r.data.id;
        if (r.status === 202) id = await waitForJob(r.data, (job) => setChildren(status, ...jobProgress(job)));
        else state.plans.set(id, r.data);
        setFlash(`Replanned without ${down.join(", ")}.`);
        go("#/plans/" + encodeURIComponent(id));
      } catch (err) {
        setChildren(status);
        showError(rform, box, err);
      } finally {
        button.disabled = false;
      }
    });
    return section("Replan after a cluster change", "replan", h("p", { class: "hint" }, "Mark the nodes that went down; the request is planned again on the rest and stored as a new plan with a diff."), rform);
  }

  function ranksSection(ranks) {
    const LIMIT = 512;
    const shown = ranks.slice(0, LIMIT);
    return h(
      "details",
      { class: "panel", "data-section": "ranks" },
      h("summary", {}, `Ranks (${ranks.length})`),
      table("Rank placement", ["Rank", "Host", "GPU", "Device", "Stage", "dp", "pp", "tp", "cp"],
        shown.map((r) => h("tr", {}, [r.rank, r.host, r.gpu, r.device, r.stage, r.dp, r.pp, r.tp, r.cp].map((v) => h("td", {}, String(v ?? "–")))))),
      ranks.length > LIMIT ? h("p", { class: "hint" }, `First ${LIMIT} of ${ranks.length}; the launch target "rankmap" has them all.`) : null
    );
  }

  // ───────────── plan pictures: placement map, pipeline schedule, memory, alternatives ─────────────

  const SVG_NS = "http://www.w3.org/2000/svg";

  /** svg("rect", {x: 1}, child, ...): an SVG element; "text" sets its textContent. */
  function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, String(v));
    }
    for (const c of children.flat(Infinity)) if (c) el.append(c);
    return el;
  }

  const STAGE_COLORS = ["#2f6fde", "#e8890c", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#b7950b", "#2c3e50", "#e84393", "#0984e3", "#6c5ce7", "#d35400"];
  function stageColor(i, n) {
    return n <= STAGE_COLORS.length ? STAGE_COLORS[i % STAGE_COLORS.length] : `hsl(${Math.round((i * 330) / n)}, 62%, 46%)`;
  }

  /** Arrow keys move the focus among ``items`` (one tab stop for the whole set). */
  function rovingFocus(container, selector, columns) {
    const items = () => $$(selector, container);
    items().forEach((el, i) => (el.tabIndex = i === 0 ? 0 : -1));
    container.addEventListener("keydown", (ev) => {
      const list = items();
      const i = list.indexOf(document.activeElement);
      if (i < 0) return;
      const step = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: columns(list[i]), ArrowUp: -columns(list[i]), Home: -i, End: list.length - 1 - i }[ev.key];
      if (step === undefined) return;
      ev.preventDefault();
      const next = list[Math.max(0, Math.min(list.length - 1, i + step))];
      list[i].tabIndex = -1;
      next.tabIndex = 0;
      next.focus();
    });
  }

  function deviceName(d) {
    return typeof d === "string" ? d : (d && d.name) || "custom";
  }

  /** Every host of the cluster in order (named, or the planner's default <group>-<i>), with
   *  its group, device, GPU count and whether it is down; hosts only the ranks name go last. */
  function clusterHosts(plan) {
    const cluster = plan.cluster || {};
    const nodes = new Map((cluster.nodes || []).map((n) => [n.hostname, n]));
    const groups = new Map((cluster.node_groups || []).map((g) => [g.name, g]));
    const hosts = [];
    const seen = new Set();
    const add = (hostname, g) => {
      if (seen.has(hostname)) return;
      seen.add(hostname);
      const node = nodes.get(hostname);
      hosts.push({ host: hostname, group: g ? g.name : "", device: g ? deviceName(g.device) : "", gpus: g ? g.gpus_per_node : 0, down: !!node && node.available === false });
    };
    for (const g of groups.values()) {
      const names = g.hostnames && g.hostnames.length ? g.hostnames : Array.from({ length: g.count || 0 }, (_, i) => `${g.name}-${i}`);
      names.forEach((hn) => add(hn, g));
    }
    for (const n of nodes.values()) add(n.hostname, groups.get(n.group));
    for (const r of plan.best.ranks || []) add(r.host, groups.get(r.node_group));
    return hosts;
  }

  const MAP_GPU_LIMIT = 512; // above this many GPUs the map shows one cell per host

  function rankText(r) {
    const mesh = ["dp", "pp", "tp", "cp", "ep"].filter((k) => r[k] !== undefined && r[k] !== null).map((k) => `${k} ${r[k]}`).join(", ");
    return `Rank ${r.rank} on ${r.host} GPU ${r.gpu} (${r.device}, node group ${r.node_group}): stage ${r.stage}; mesh ${mesh}`;
  }

  function gpuCell(r, host, gpu, nStages) {
    if (!r) {
      const label = host.down ? `${host.host} GPU ${gpu}: node unavailable` : `${host.host} GPU ${gpu}: not used by this plan`;
      return h("button", { type: "button", class: host.down ? "gpu down" : "gpu idle", title: label, "aria-label": label, "data-detail": label }, "");
    }
    const label = rankText(r);
    const cell = h("button", { type: "button", class: "gpu" + (r.dp % 2 ? " dp-odd" : ""), title: label, "aria-label": label, "data-detail": label, "data-rank": r.rank, "data-stage": r.stage, "data-dp": r.dp }, String(r.rank));
    cell.style.backgroundColor = stageColor(r.stage, nStages);
    return cell;
  }

  /** One host's GPUs; consecutive GPUs of one tensor-parallel group share an outline. */
  function hostCells(host, byGpu, nStages, outline) {
    const out = h("div", { class: "map-cells" });
    const count = Math.max(host.gpus, byGpu.size ? Math.max(...byGpu.keys()) + 1 : 0);
    let group = null;
    let key = null;
    for (let g = 0; g < count; g++) {
      const r = byGpu.get(g);
      const k = r && outline ? `${r.stage}/${r.dp}/${r.cp}/${r.ep ?? 0}` : null;
      if (!r || k !== key || !group) {
        group = k ? h("span", { class: "tp-group", "data-tp-group": k }) : null;
        if (group) out.append(group);
        key = k;
      }
      (group || out).append(gpuCell(r, host, g, nStages));
      if (!k) group = null;
    }
    return out;
  }

  function placementSection(plan) {
    const ranks = plan.best.ranks || [];
    const nStages = plan.best.stages.length;
    const outline = (plan.best.strategy.tp || 1) > 1; // one GPU per TP group needs no outline
    const hosts = clusterHosts(plan);
    const byHost = new Map(hosts.map((x) => [x.host, new Map()]));
    for (const r of ranks) byHost.get(r.host).set(r.gpu, r);
    const detail = h("p", { id: "map-detail", class: "map-detail", "aria-live": "polite" }, "Point at or select a GPU to see its rank, mesh coordinates and device.");
    const hostDetail = h("div", { id: "host-detail", class: "host-detail" });
    const totalGpus = hosts.reduce((s, x) => s + Math.max(x.gpus, byHost.get(x.host).size), 0);
    const aggregated = totalGpus > MAP_GPU_LIMIT;
    const map = h("div", { class: aggregated ? "map aggregated" : "map", id: "placement-map", "data-hosts": hosts.length, "data-gpus": totalGpus, "data-mode": aggregated ? "node" : "gpu" });
    const show = (ev) => {
      const el = ev.target.closest("[data-detail]");
      if (el) detail.textContent = el.dataset.detail;
    };
    for (const el of [map, hostDetail]) for (const type of ["mouseover", "focusin", "click"]) el.addEventListener(type, show);
    map.addEventListener("click", (ev) => {
      const el = ev.target.closest(".host-cell");
      if (!el) return;
      const host = hosts.find((x) => x.host === el.dataset.host);
      setChildren(hostDetail, h("h3", {}, `${host.host}: ${host.device}, node group ${host.group}${host.down ? " (unavailable)" : ""}`), h("div", { class: "map-row" }, hostCells(host, byHost.get(host.host), nStages, outline)));
    });
    if (!aggregated) {
      for (const x of hosts) {
        map.append(h("div", { class: "map-row" + (x.down ? " down" : ""), "data-host": x.host },
          h("div", { class: "map-host" }, x.host, h("span", { class: "hint" }, x.down ? " unavailable" : ` ${x.device}`)),
          hostCells(x, byHost.get(x.host), nStages, outline)));
      }
      rovingFocus(map, "button.gpu", (el) => Math.max(1, $$("button.gpu", el.closest(".map-row")).length));
    } else {
      const groups = new Map();
      for (const x of hosts) (groups.get(x.group) || groups.set(x.group, []).get(x.group)).push(x);
      for (const [name, list] of groups) {
        const cells = h("div", { class: "host-cells" });
        for (const x of list) {
          const gpus = [...byHost.get(x.host).values()];
          const stages = [...new Set(gpus.map((r) => r.stage))].sort((a, b) => a - b);
          const label = x.down
            ? `${x.host}: unavailable`
            : gpus.length
              ? `${x.host} (${x.device}): ranks ${Math.min(...gpus.map((r) => r.rank))}–${Math.max(...gpus.map((r) => r.rank))}, stage ${stages.join(", ")}`
              : `${x.host} (${x.device}): not used by this plan`;
          const cell = h("button", { type: "button", class: "host-cell" + (x.down ? " down" : gpus.length ? "" : " idle"), title: label, "aria-label": label, "data-detail": label, "data-host": x.host, "data-stage": stages.join(",") });
          if (stages.length === 1) cell.style.backgroundColor = stageColor(stages[0], nStages);
          else if (stages.length > 1) cell.style.backgroundImage = `linear-gradient(90deg, ${stages.map((st, i) => `${stageColor(st, nStages)} ${(i * 100) / stages.length}% ${((i + 1) * 100) / stages.length}%`).join(", ")})`;
          cells.append(cell);
        }
        map.append(h("div", { class: "map-group", "data-group": name }, h("div", { class: "map-host" }, `${name}: ${list.length} nodes × ${list[0].gpus} ${list[0].device}`), cells));
      }
      rovingFocus(map, "button.host-cell", (el) => Math.max(1, Math.floor(el.parentElement.clientWidth / Math.max(1, el.offsetWidth + 2))));
    }
    const legend = h("ul", { class: "legend" },
      nStages <= 16
        ? plan.best.stages.map((st, i) => { const sw = h("span", { class: "swatch", "aria-hidden": "true" }); sw.style.backgroundColor = stageColor(i, nStages); return h("li", {}, sw, `stage ${i} (${st.device})`); })
        : h("li", {}, `${nStages} stages, coloured from stage 0 to stage ${nStages - 1}`),
      aggregated || !outline ? null : h("li", {}, h("span", { class: "swatch tp-swatch", "aria-hidden": "true" }), `outline: one tensor-parallel group (tp ${plan.best.strategy.tp})`),
      aggregated ? null : h("li", {}, h("span", { class: "swatch dp-swatch", "aria-hidden": "true" }), "striped: odd data-parallel replica"),
      h("li", {}, h("span", { class: "swatch down-swatch", "aria-hidden": "true" }), "unavailable node"),
      h("li", {}, h("span", { class: "swatch idle-swatch", "aria-hidden": "true" }), "not used")
    );
    const note = aggregated
      ? h("p", { class: "hint" }, `${totalGpus.toLocaleString("en-US")} GPUs on ${hosts.length} nodes: one cell per node, by node group. Select a node to see its GPUs.`)
      : h("p", { class: "hint" }, "One row per host, one cell per GPU (the number is its rank). Arrow keys move between GPUs.");
    return section("Placement", "placement", note, map, legend, detail, hostDetail);
  }

  /** The sizes of the micro-batch groups an interleaved schedule runs ``m`` micro-batches in:
   *  the prediction's ``microbatch_groups`` (the first group, then groups of ``later``, the last
   *  holding the rest), as the cost model priced them; groups of pp for a plan stored without it. */
  function groupsOf(pred, p) {
    return pred.microbatch_groups || { first: p, later: p };
  }

  function microbatchGroups(pred, m, p) {
    const groups = groupsOf(pred, p);
    const out = [Math.min(groups.first, m)];
    for (let done = out[0]; done < m; done += groups.later) out.push(Math.min(groups.later, m - done));
    return out;
  }

  /** How many of a step's ``m`` micro-batches the chart draws under a cap on its passes: all of
   *  them, else whole groups (as the schedule runs them; groups of pp under 1F1B; pp at the least). */
  function drawnMicrobatches(pred, m, p, cap) {
    if (m <= cap) return m;
    const groups = groupsOf(pred, p);
    if (groups.first >= cap) return Math.min(m, Math.max(p, groups.first));
    return groups.first + Math.floor((cap - groups.first) / groups.later) * groups.later;
  }

  /** The order in which a stage runs its forward and backward passes in one step (Megatron's
   *  1F1B, interleaved over ``v`` model chunks in the micro-batch ``groups``: each group's
   *  micro-batches on chunk 0, then on chunk 1, ...), as [kind, micro-batch, chunk]. */
  function stageOrder(i, p, m, v, groups) {
    const total = m * v;
    const table = [];
    let start = 0;
    for (const size of groups) {
      for (let chunk = 0; chunk < v; chunk++) for (let mb = start; mb < start + size; mb++) table.push([mb, chunk]);
      start += size;
    }
    const at = (k, backward) => {
      if (v === 1) return [k, 0];
      const [mb, chunk] = table[k];
      return [mb, backward ? v - 1 - chunk : chunk];
    };
    const warmup = Math.min(total, v === 1 ? p - i - 1 : (p - i - 1) * 2 + (v - 1) * groups[0]);
    const ops = [];
    let f = 0;
    let b = 0;
    for (; f < warmup; f++) ops.push(["F", ...at(f, false)]);
    while (f < total) {
      ops.push(["F", ...at(f++, false)]);
      ops.push(["B", ...at(b++, true)]);
    }
    while (b < total) ops.push(["B", ...at(b++, true)]);
    return ops;
  }

  /** Start and end of every pass of one step, from the stages' forward and backward times per
   *  micro-batch: a pass waits for the previous pass on its stage and for the same micro-batch
   *  on the neighbouring model chunk.  null if the order deadlocks (it does not for 1F1B). */
  function simulateSchedule(stages, m, v, groups) {
    const p = stages.length;
    const orders = stages.map((_, i) => stageOrder(i, p, m, v, groups));
    const done = new Map();
    const ptr = new Array(p).fill(0);
    const free = new Array(p).fill(0);
    const ops = [];
    const dep = (kind, i, mb, chunk) => {
      const g = chunk * p + i;
      if (kind === "F") return g === 0 ? 0 : done.get(`F:${g - 1}:${mb}`);
      return g === p * v - 1 ? done.get(`F:${g}:${mb}`) : done.get(`B:${g + 1}:${mb}`);
    };
    let remaining = orders.reduce((s, o) => s + o.length, 0);
    while (remaining > 0) {
      let progressed = false;
      for (let i = 0; i < p; i++) {
        while (ptr[i] < orders[i].length) {
          const [kind, mb, chunk] = orders[i][ptr[i]];
          const ready = dep(kind, i, mb, chunk);
          if (ready === undefined) break;
          const start = Math.max(free[i], ready);
          const end = start + (kind === "F" ? stages[i].forward_s : stages[i].backward_s) / v;
          done.set(`${kind}:${chunk * p + i}:${mb}`, end);
          ops.push({ stage: i, kind, mb, chunk, start, end });
          free[i] = end;
          ptr[i]++;
          remaining--;
          progressed = true;
        }
      }
      if (!progressed) return null;
    }
    return { ops, makespan: Math.max(...free) };
  }

  const SCHEDULE_MAX_PASSES = 6000;

  function scheduleSection(plan) {
    const best = plan.best;
    const stages = best.stages;
    const pred = best.prediction;
    const p = stages.length;
    const v = best.strategy.vpp || 1;
    // a step of several pipeline schedules (the prediction's pipeline_schedules): one of them is drawn
    const k = pred.pipeline_schedules || 1;
    const m = Math.max(1, Math.floor((pred.num_microbatches || 1) / k));
    const cap = Math.floor(SCHEDULE_MAX_PASSES / (2 * v * p));
    const drawnM = drawnMicrobatches(pred, m, p, cap);
    if (!stages.every((st) => typeof st.forward_s === "number" && typeof st.backward_s === "number")) {
      return section("Pipeline schedule", "schedule", h("p", {}, "This plan's stages carry no forward and backward times."));
    }
    const sim = simulateSchedule(stages, drawnM, v, microbatchGroups(pred, drawnM, p));
    if (!sim) return section("Pipeline schedule", "schedule", h("p", {}, "The schedule could not be laid out."));
    const bd = pred.breakdown_s || {};
    const dpSync = (bd.dp_comm_exposed || 0) / k;  // each schedule ends in its own data-parallel sync
    const optimizer = bd.optimizer || 0;
    const total = sim.makespan + dpSync + optimizer;
    const W = 1000, left = 92, rowH = 24, top = 8, axisH = 28;
    const H = top + p * rowH + axisH;
    const x = (t) => left + ((W - left - 8) * t) / total;
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "gantt", id: "schedule-chart", role: "img", "data-passes": sim.ops.length, "data-microbatches": drawnM,
      "aria-label": `Pipeline schedule of one step: ${p} stages, ${drawnM} micro-batches${v > 1 ? `, ${v} chunks per stage` : ""}` });
    for (let i = 0; i < p; i++) {
      const y = top + i * rowH;
      chart.append(
        svg("text", { x: left - 6, y: y + rowH / 2 + 4, "text-anchor": "end", class: "gantt-label", text: `stage ${i}` }),
        svg("rect", { x: left, y: y + 2, width: x(sim.makespan) - left, height: rowH - 4, class: "gantt-idle" }, svg("title", { text: `stage ${i}: idle (pipeline bubble)` }))
      );
    }
    for (const op of sim.ops) {
      const y = top + op.stage * rowH;
      const w = Math.max(0.5, x(op.end) - x(op.start));
      const what = `${op.kind === "F" ? "forward" : "backward"} of micro-batch ${op.mb}${v > 1 ? `, chunk ${op.chunk}` : ""}`;
      chart.append(svg("rect", { x: x(op.start), y: y + 2, width: w, height: rowH - 4, class: `gantt-op gantt-${op.kind === "F" ? "fwd" : "bwd"} chunk-${op.chunk % 4}`, "data-kind": op.kind },
        svg("title", { text: `stage ${op.stage}: ${what}, ${fmt.time(op.end - op.start)} (${fmt.time(op.start)} → ${fmt.time(op.end)})` })));
      if (w > 18) chart.append(svg("text", { x: x(op.start) + w / 2, y: y + rowH / 2 + 4, "text-anchor": "middle", class: "gantt-mb", text: String(op.mb) }));
    }
    const tail = [["gantt-dp", "exposed data-parallel gradient sync", sim.makespan, dpSync], ["gantt-opt", "optimizer step", sim.makespan + dpSync, optimizer]];
    for (const [cls, what, start, dur] of tail) {
      if (dur <= 0) continue;
      chart.append(svg("rect", { x: x(start), y: top + 2, width: Math.max(1, x(start + dur) - x(start)), height: p * rowH - 4, class: cls }, svg("title", { text: `${what}: ${fmt.time(dur)}` })));
    }
    for (let k = 0; k <= 5; k++) {
      const t = (total * k) / 5;
      chart.append(svg("line", { x1: x(t), x2: x(t), y1: top, y2: top + p * rowH + 4, class: "gantt-grid" }),
        svg("text", { x: x(t), y: H - 8, "text-anchor": k === 0 ? "start" : k === 5 ? "end" : "middle", class: "gantt-axis", text: fmt.time(t) }));
    }
    const busy = sim.ops.reduce((s, op) => s + op.end - op.start, 0);
    const bubble = 1 - busy / (p * sim.makespan);
    const legend = h("ul", { class: "legend" },
      h("li", {}, h("span", { class: "swatch sw-fwd", "aria-hidden": "true" }), "forward (number: micro-batch)"),
      h("li", {}, h("span", { class: "swatch sw-bwd", "aria-hidden": "true" }), "backward"),
      h("li", {}, h("span", { class: "swatch sw-idle", "aria-hidden": "true" }), `bubble ${fmt.pct(bubble)} of the pipeline time`),
      h("li", { class: dpSync > 0 ? null : "zero" }, h("span", { class: "swatch sw-dp", "aria-hidden": "true" }), `exposed DP sync ${fmt.time(dpSync)}`),
      h("li", { class: optimizer > 0 ? null : "zero" }, h("span", { class: "swatch sw-opt", "aria-hidden": "true" }), `optimizer ${fmt.time(optimizer)}`)
    );
    const note = h("p", { class: "hint", id: "schedule-note" },
      `${v > 1 ? `Interleaved 1F1B, ${v} model chunks per stage` : "1F1B"}, drawn from each stage's forward and backward time per micro-batch: ${fmt.time(total)} for ` +
        (k > 1 ? `one of the step's ${k} pipeline schedules (the step runs them one after another, each with its data-parallel sync; the optimizer steps after the last), ` : "") +
        (drawnM === m ? `${k > 1 ? "its" : "the step's"} ${m === 1 ? "one micro-batch" : `${m} micro-batches`}`
          : `${drawnM} of ${k > 1 ? "its" : "the step's"} ${m} micro-batches (the steady state repeats)`) +
        `; the cost model's step time is ${fmt.time(pred.step_time_s)}.`);
    return section("Pipeline schedule", "schedule", note, h("div", { class: "chart-wrap" }, chart), legend);
  }

  const MEMORY_KEYS = ["weights", "gradients", "optimizer_state", "activations", "workspace"];

  function memorySection(plan) {
    const stages = plan.best.stages;
    const keys = [...MEMORY_KEYS, ...[...new Set(stages.flatMap((st) => Object.keys(st.memory_GB || {})))].filter((k) => !MEMORY_KEYS.includes(k))];
    const scale = Math.max(...stages.map((st) => Math.max(st.memory_capacity_GB || 0, st.peak_memory_GB))) || 1;
    const rows = stages.map((st) => {
      const parts = st.memory_GB || {};
      const bar = h("div", { class: "mem-bar", role: "img",
        "aria-label": `Stage ${st.index}: ${keys.filter((k) => parts[k]).map((k) => `${k} ${fmt.gb(parts[k])}`).join(", ")}; peak ${fmt.gb(st.peak_memory_GB)} of ${fmt.gb(st.memory_capacity_GB)}` });
      for (const k of keys) {
        if (!(parts[k] > 0)) continue;
        const seg = h("span", { class: `mem-seg mem-${k}`, title: `${k}: ${fmt.gb(parts[k])}`, "data-key": k });
        seg.style.width = ((parts[k] / scale) * 100).toFixed(3) + "%";
        bar.append(seg);
      }
      if (st.memory_capacity_GB) {
        const cap = h("span", { class: "mem-cap", title: `capacity ${fmt.gb(st.memory_capacity_GB)}` });
        cap.style.left = ((st.memory_capacity_GB / scale) * 100).toFixed(3) + "%";
        bar.append(cap);
      }
      const frac = st.memory_capacity_GB ? st.peak_memory_GB / st.memory_capacity_GB : 0;
      return h("div", { class: "mem-row" + (frac > 0.9 ? " tight" : ""), "data-stage": st.index },
        h("div", { class: "mem-label" }, `stage ${st.index}`, h("span", { class: "hint" }, ` ${st.device}`)),
        bar,
        h("div", { class: "mem-value" }, `${fmt.gb(st.peak_memory_GB)} / ${fmt.gb(st.memory_capacity_GB)} (${fmt.pct(frac, 0)})`));
    });
    const legend = h("ul", { class: "legend" },
      keys.map((k) => h("li", {}, h("span", { class: `swatch mem-${k}`, "aria-hidden": "true" }), k.replace("_", " "))),
      h("li", {}, h("span", { class: "swatch cap-swatch", "aria-hidden": "true" }), "device memory"));
    return section("Memory per stage (one GPU)", "memory", h("div", { class: "mem-chart", id: "memory-chart" }, rows), legend);
  }

  function niceTicks(lo, hi, n) {
    const span = hi - lo || Math.abs(hi) || 1;
    const step0 = span / n;
    const mag = 10 ** Math.floor(Math.log10(step0));
    const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => s >= step0) || 10 * mag;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
    return ticks;
  }

  function alternativesChart(plan, best, alts, whyLost) {
    const points = [{ i: -1, a: best }, ...alts.map((a, i) => ({ i, a }))].map((pt) => ({ ...pt, mem: Math.max(...pt.a.prediction.peak_memory_GB), t: pt.a.prediction.step_time_s }));
    const W = 640, H = 300, L = 70, R = 16, T = 14, B = 42;
    const mems = points.map((pt) => pt.mem), times = points.map((pt) => pt.t);
    const pad = (lo, hi) => { const d = (hi - lo) * 0.08 || Math.abs(hi) * 0.05 || 1; return [Math.max(0, lo - d), hi + d]; };
    const [x0, x1] = pad(Math.min(...mems), Math.max(...mems));
    const [y0, y1] = pad(Math.min(...times), Math.max(...times));
    const X = (v) => L + ((W - L - R) * (v - x0)) / (x1 - x0);
    const Y = (v) => H - B - ((H - T - B) * (v - y0)) / (y1 - y0);
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "scatter", id: "alternatives-chart", role: "group", "aria-label": "Step time against peak memory of the best plan and its alternatives" });
    for (const t of niceTicks(x0, x1, 5)) chart.append(svg("line", { x1: X(t), x2: X(t), y1: T, y2: H - B, class: "grid" }), svg("text", { x: X(t), y: H - B + 16, "text-anchor": "middle", class: "axis", text: `${+t.toPrecision(4)}` }));
    for (const t of niceTicks(y0, y1, 5)) chart.append(svg("line", { x1: L, x2: W - R, y1: Y(t), y2: Y(t), class: "grid" }), svg("text", { x: L - 6, y: Y(t) + 4, "text-anchor": "end", class: "axis", text: fmt.time(t) }));
    chart.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-title", text: "peak memory per GPU, tightest stage (GB)" }),
      svg("text", { x: 14, y: (T + H - B) / 2, "text-anchor": "middle", transform: `rotate(-90 14 ${(T + H - B) / 2})`, class: "axis-title", text: "step time" }));
    const detail = h("div", { id: "alt-detail", class: "alt-detail", "aria-live": "polite" }, "Select a point to see its strategy and why it lost.");
    const describe = (pt) => {
      const a = pt.a;
      const head = pt.i < 0 ? "The best plan" : `Alternative ${pt.i + 1}`;
      setChildren(detail,
        h("h3", {}, `${head}: ${compactStrategy(a.strategy)}`),
        kv([
          ["Step time", `${fmt.time(pt.t)}${pt.i < 0 ? "" : ` (${fmt.pct(pt.t / best.prediction.step_time_s - 1)} vs the best)`}`],
          ["Tokens/s", fmt.int(a.prediction.tokens_per_s)],
          ["Peak memory", fmt.gb(pt.mem)],
          pt.i < 0 ? ["Why it won", (plan.explanation || {}).summary || "–"] : ["Why it lost", whyLost[pt.i] || versusBest(best, a)],
          pt.i < 0 ? null : ["Difference", versusBest(best, a)],
        ]));
      $$(".pt", chart).forEach((el) => el.setAttribute("aria-pressed", String(el === pt.el)));
    };
    for (const pt of [...points].reverse()) {
      const cx = X(pt.mem), cy = Y(pt.t);
      const label = `${pt.i < 0 ? "best" : `alternative ${pt.i + 1}`}: ${compactStrategy(pt.a.strategy)}, ${fmt.time(pt.t)}, ${fmt.gb(pt.mem)}`;
      const shape = pt.i < 0
        ? svg("path", { d: `M${cx},${cy - 10} L${cx + 3},${cy - 3} L${cx + 10},${cy - 3} L${cx + 4.5},${cy + 2} L${cx + 6.5},${cy + 9} L${cx},${cy + 5} L${cx - 6.5},${cy + 9} L${cx - 4.5},${cy + 2} L${cx - 10},${cy - 3} L${cx - 3},${cy - 3} Z`, class: "pt-best" })
        : svg("circle", { cx, cy, r: 6, class: "pt-alt" });
      const g = svg("g", { class: pt.i < 0 ? "pt best" : "pt", tabindex: 0, role: "button", "aria-label": label, "aria-pressed": "false", "data-index": pt.i }, svg("title", { text: label }), shape,
        pt.i < 0 ? svg("text", { x: cx + 12, y: cy - 8, class: "pt-label", text: "best" }) : svg("text", { x: cx + 9, y: cy + 4, class: "pt-label", text: String(pt.i + 1) }));
      pt.el = g;
      g.addEventListener("click", () => describe(pt));
      g.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          describe(pt);
        }
      });
      chart.append(g);
    }
    return [h("div", { class: "chart-wrap scatter-wrap" }, chart), detail];
  }

  /** What the reader should know before trusting the plan: the API's warnings, a search that
   *  was not proved optimal, stages close to their memory. */
  function planWarnings(plan) {
    const pred = plan.best.prediction;
    const out = [...new Set([...(plan.warnings || []), ...(pred.warnings || [])])].map((w) => ({ kind: "api", text: w }));
    const search = plan.search || {};
    // a stored plan says whether the search proved it optimal; a bare result has only the solver's word
    const proved = plan.status ? plan.status === "optimal" : !search.solver_status || search.solver_status === "OPTIMAL";
    if (!proved) {
      out.unshift({ kind: "search", text: `Not proved optimal: the search stopped at its limit (solver ${search.solver_status}); a better plan may exist. Plan again with “force” and a larger solver budget.` });
    }
    for (const st of plan.best.stages) {
      const frac = st.memory_capacity_GB ? st.peak_memory_GB / st.memory_capacity_GB : 0;
      if (frac > 0.9) out.push({ kind: "memory", text: `Stage ${st.index} needs ${fmt.gb(st.peak_memory_GB)} of ${fmt.gb(st.memory_capacity_GB)} (${fmt.pct(frac, 0)}): little room for fragmentation or a longer sequence.` });
    }
    return out;
  }

  /** The request's pins and limits as "name value" pairs; the ones left unset are omitted. */
  function constraintsSummary(constraints) {
    const set = Object.entries(constraints || {}).filter(([, v]) => v !== null && v !== undefined);
    if (!set.length) return "none: the search chose every knob";
    return set.map(([k, v]) => `${k} ${Array.isArray(v) ? v.join("/") : v}`).join(", ");
  }

  function renderPlan(plan) {
    const best = plan.best;
    const pred = best.prediction;
    const s = best.strategy;
    const peak = Math.max(...best.stages.map((x) => x.peak_memory_GB));
    const explanation = plan.explanation || {};
    const warnings = planWarnings(plan);
    const whyLost = explanation.alternatives || [];
    $("#plan-title").textContent = `Plan ${fmt.shortId(plan.id)}: ${plan.model.name} on ${plan.cluster.name}`;

    /** The recompute knob in words: Megatron-Core's block depth (the first N layers of each
     *  chunk) or uniform groups, another framework's N layers without a pipeline (which ones does
     *  not change the cost), or the selective modules. */
    function recomputeText(s, framework) {
      const n = s.recompute_num_layers;
      if (n && s.recompute_method === "uniform") return `${s.recompute}, uniform groups of ${n} layers`;
      if (n) return (framework || "megatron-core") === "megatron-core"
        ? `${s.recompute}, first ${n} layers of each chunk (block)` : `${s.recompute}, ${n} layers (the others keep their activations)`;
      return s.recompute_modules ? `${s.recompute}: ${s.recompute_modules.join(", ")}` : s.recompute;
    }

    const cards = h(
      "div",
      { class: "cards", "data-section": "prediction" },
      [
        // the interval from the regime's cross-validated residuals (or the cluster's own fit)
        ["Step time", fmt.time(pred.step_time_s) + (pred.step_time_s_p10 != null && pred.step_time_s_p90 != null
          ? ` (p10–p90 ${fmt.time(pred.step_time_s_p10)}–${fmt.time(pred.step_time_s_p90)})` : "")],
        ["Tokens/s", fmt.int(pred.tokens_per_s)],
        ["Samples/s", pred.samples_per_s.toFixed(1)],
        ["MFU", fmt.pct(pred.mfu)],
        ["Model TFLOP/s per GPU", pred.model_tflops_per_gpu.toFixed(1)],
        ["Peak memory (max stage)", fmt.gb(peak) + (pred.peak_memory_GB_p10 != null && pred.peak_memory_GB_p90 != null
          ? ` (p10–p90 ${fmt.gb(pred.peak_memory_GB_p10)}–${fmt.gb(pred.peak_memory_GB_p90)}`
            + (pred.memory_interval_basis === "fragmentation-bounds" ? ", no measured peaks for this framework: bounded" : "") + ")" : "")],
        // Memory against the interval: tight = the p90 peak exceeds usable memory (kept, flagged);
        // over the device's memory at the predicted peak itself, more likely than not to run out.
        ["Memory", !pred.tight ? "fits" : best.stages.some((st) => st.peak_memory_GB > st.memory_capacity_GB)
          ? "tight: more likely than not to run out of memory" : "tight: may run out of memory"],
        ...derived(plan),
      ].map(([k, v]) => h("div", { class: "card" }, h("div", { class: "card-label" }, k), h("div", { class: "card-value" }, v)))
    );

    const strategy = section(
      "Strategy",
      "strategy",
      h("dl", { class: "knobs", id: "strategy" },
        [
          ["data parallel (dp)", s.dp], ["tensor parallel (tp)", s.tp], ["pipeline parallel (pp)", s.pp],
          ["context parallel (cp)", s.cp], ["expert parallel (ep)", s.ep],
          ...(s.etp || s.ep > 1 ? [["experts' tensor parallel (etp)", s.etp ? s.etp : "the framework's default"]] : []),
          ["virtual stages (vpp)", s.vpp],
          ["micro-batch size", s.micro_batch_size], ["micro-batches per step", pred.num_microbatches],
          ["sequence parallel", s.sequence_parallel ? "yes" : "no"], ["recompute", recomputeText(s, plan.training.framework)],
          ["ZeRO stage", s.dp_shard ? `${s.zero_stage}, sharded over ${s.dp_shard} dp ranks, ${s.dp / s.dp_shard} replicas (HSDP)` : s.zero_stage],
          ["layers per stage", s.layers_per_stage ? s.layers_per_stage.join(", ") : "even"],
        ].map(([k, v]) => h("div", { "data-knob": k }, h("dt", {}, k), h("dd", {}, String(v))))
      )
    );

    const overview = section(
      "Request",
      "overview",
      kv([
        ["Plan id", h("code", {}, plan.id)],
        ["Status", `${plan.status} (revision ${plan.revision})`],
        ["Created", fmt.date(plan.created_at)],
        ["Model", `${plan.model.name} (${fmt.params(plan.model.params)} parameters)`],
        ["Cluster", `${plan.cluster.name}: ${clusterSummary(plan.cluster)}; this plan uses ${best.ranks ? best.ranks.length : plan.summary.num_devices} GPUs`],
        ["Training", `batch ${plan.training.global_batch_size} × ${plan.training.sequence_length} tokens, ${plan.training.dtype}, ${plan.training.optimizer}` + (plan.training.framework ? `, ${plan.training.framework}` : "")],
        ["Constraints", constraintsSummary(plan.constraints)],
        ["Objective", plan.objective],
        plan.parent_id ? ["Replan of", h("a", { href: "#/plans/" + encodeURIComponent(plan.parent_id) }, fmt.shortId(plan.parent_id))] : null,
        ["Request hash", h("code", { title: plan.request_hash }, plan.request_hash.slice(0, 16) + "…")],
        ["JSON", h("a", { href: `/v1/plans/${encodeURIComponent(plan.id)}` }, `/v1/plans/${fmt.shortId(plan.id)}…`)],
      ])
    );

    const explain = section(
      "Explanation",
      "explanation",
      h("p", { id: "explanation-summary" }, explanation.summary || ""),
      kv([
        ["Bottleneck", explanation.bottleneck || pred.bottleneck],
        ["Largest overhead", explanation.largest_overhead || "–"],
        ["Memory headroom", `${fmt.gb(explanation.memory_headroom_GB)}` + (explanation.tightest_stage === undefined ? "" : ` on the tightest stage (${explanation.tightest_stage})`)],
        explanation.sharding_summary
          ? ["Operator shardings", Object.entries(explanation.sharding_summary).map(([k, n]) => `${k} ${n}`).join(", ")]
          : null,
      ]),
      explanation.notes && explanation.notes.length ? h("ul", { class: "notes" }, explanation.notes.map((n) => h("li", {}, n))) : null,
      whyLost.length ? [h("h3", {}, "Why the alternatives lost"), h("ul", {}, whyLost.map((w) => h("li", {}, w)))] : null
    );

    const alts = plan.alternatives || [];
    const alternatives = section(
      "Alternatives",
      "alternatives",
      alts.length ? alternativesChart(plan, best, alts, whyLost) : null,
      alts.length
        ? table(
            "Alternative plans",
            ["#", "Strategy", "Step time", "Tokens/s", "MFU", "Peak memory", "Versus the best"],
            alts.map((a, i) =>
              h("tr", { "data-index": i },
                h("td", {}, h("button", {
                  type: "button",
                  class: "secondary small",
                  "aria-label": `Show alternative ${i + 1} on the chart`,
                  onclick: () => {
                    const pt = $(`#alternatives-chart .pt[data-index="${i}"]`);
                    pt.dispatchEvent(new MouseEvent("click", { bubbles: true }));
                    pt.focus();
                  },
                }, String(i + 1))),
                h("td", { class: "mono" }, compactStrategy(a.strategy)),
                h("td", { class: "num" }, fmt.time(a.prediction.step_time_s)),
                h("td", { class: "num" }, fmt.int(a.prediction.tokens_per_s)),
                h("td", { class: "num" }, fmt.pct(a.prediction.mfu)),
                h("td", { class: "num", "data-tight": a.prediction.tight ? "true" : "false" },
                  fmt.gb(Math.max(...a.prediction.peak_memory_GB)) + (a.prediction.tight ? " (tight)" : "")),
                h("td", {}, versusBest(best, a))
              )
            ),
            { id: "alternatives-table" }
          )
        : h("p", {}, "No alternatives were kept (top_k = 0).")
    );

    const search = plan.search || {};
    setChildren($("#plan-body"),
      warnings.length
        ? h("section", { class: "panel warn-panel", "data-section": "warnings", "aria-labelledby": "sec-warnings", role: "region" },
            h("h2", { id: "sec-warnings" }, warnings.length === 1 ? "Warning" : `Warnings (${warnings.length})`),
            h("ul", { class: "warnings" }, warnings.map((w) => h("li", { "data-kind": w.kind }, w.text))))
        : null,
      cards,
      plan.diff ? diffSection(plan.diff) : null,
      observedSection(plan),
      strategy,
      placementSection(plan),
      scheduleSection(plan),
      section("Where the step time goes", "breakdown", ...breakdownBar(pred.breakdown_s)),
      memorySection(plan),
      section("Pipeline stages", "stages", stagesTable(best.stages)),
      explain,
      alternatives,
      launchSection(plan),
      replanSection(plan),
      overview,
      section(
        "Search",
        "search",
        kv([
          ["Candidates", fmt.int(search.candidates)],
          ["Pruned", fmt.int(search.pruned)],
          ["Refined", search.refined === undefined ? null : fmt.int(search.refined)],
          ["Solver status", search.solver_status],
          ["Wall time", fmt.time(search.wall_time_s)],
        ].filter(([, v]) => v !== null))
      ),
      ranksSection(best.ranks || [])
    );
    $("#plan-body").dataset.planId = plan.id;
  }

  // ───────────── observed runs: predicted vs observed, residuals over time ─────────────

  /** Predicted step (tick) with its p10–p90 interval (bar) and each observed step (dot). */
  function observedPlot(obs) {
    const rows = obs.history || [];
    const lo = obs.predicted_step_time_s_p10, hi = obs.predicted_step_time_s_p90;
    const values = rows.flatMap((r) => [r.step_time_s, r.predicted_step_time_s]).concat([lo, hi]).filter((v) => typeof v === "number");
    if (!values.length) return null;
    const vmin = Math.min(...values) * 0.9, vmax = Math.max(...values) * 1.1;
    const W = 560, rowH = 22, left = 90, top = 18, H = top + rows.length * rowH + 24;
    const x = (v) => left + ((v - vmin) / (vmax - vmin || 1)) * (W - left - 20);
    const items = [];
    rows.forEach((r, i) => {
      const y = top + i * rowH + rowH / 2;
      items.push(svg("text", { x: 4, y: y + 4, class: "axis-label", text: `#${i + 1} v${r.calibration_version}` }));
      if (typeof lo === "number" && typeof hi === "number")
        items.push(svg("rect", { x: x(lo), y: y - 4, width: Math.max(1, x(hi) - x(lo)), height: 8, fill: "#2f6fde", opacity: 0.25 },
          svg("title", { text: `plan's 80% interval ${fmt.time(lo)} – ${fmt.time(hi)}` })));
      if (typeof r.predicted_step_time_s === "number")
        items.push(svg("line", { x1: x(r.predicted_step_time_s), x2: x(r.predicted_step_time_s), y1: y - 7, y2: y + 7, stroke: "#2f6fde", "stroke-width": 2 },
          svg("title", { text: `predicted ${fmt.time(r.predicted_step_time_s)}` })));
      items.push(svg("circle", { cx: x(r.step_time_s), cy: y, r: 4, fill: "#e8890c", "data-observed": r.step_time_s },
        svg("title", { text: `observed ${fmt.time(r.step_time_s)} (${fmt.date(r.created_at)})` })));
    });
    items.push(svg("text", { x: left, y: H - 6, class: "axis-label", text: fmt.time(vmin) }));
    items.push(svg("text", { x: W - 70, y: H - 6, class: "axis-label", text: fmt.time(vmax) }));
    return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": "Predicted (blue tick, interval bar) and observed (orange dot) step time of each observation", id: "observed-plot" }, items);
  }

  /** The cluster's residuals (log predicted/observed at the latest fit and with the public
   *  calibration) in time order, with the calibration versions marked. */
  function residualPlot(cal) {
    const res = cal.residuals || [];
    if (!res.length) return h("p", {}, "No residuals yet.");
    const W = 560, H = 200, left = 44, right = 10, top = 10, bottom = 28;
    const ys = res.flatMap((r) => [r.log_residual, r.public_log_residual]).filter((v) => typeof v === "number");
    const ymax = Math.max(0.05, ...ys.map(Math.abs)) * 1.15;
    const x = (i) => left + (res.length === 1 ? 0.5 : i / (res.length - 1)) * (W - left - right);
    const y = (v) => top + ((ymax - v) / (2 * ymax)) * (H - top - bottom);
    const items = [
      svg("line", { x1: left, x2: W - right, y1: y(0), y2: y(0), stroke: "#888" }),
      svg("text", { x: 2, y: y(ymax) + 10, class: "axis-label", text: "+" + fmt.pct(Math.expm1(ymax), 0) }),
      svg("text", { x: 2, y: y(-ymax), class: "axis-label", text: fmt.pct(Math.expm1(-ymax), 0) }),
    ];
    let last = null;
    res.forEach((r, i) => {
      const v = r.calibration_version_at_observation;
      if (v !== last) {
        items.push(svg("line", { x1: x(i) - 4, x2: x(i) - 4, y1: top, y2: H - bottom, stroke: "#8e44ad", "stroke-dasharray": "3 3" }));
        items.push(svg("text", { x: x(i) - 2, y: H - 10, class: "axis-label", text: `v${v}` }));
        last = v;
      }
      if (typeof r.public_log_residual === "number")
        items.push(svg("circle", { cx: x(i), cy: y(r.public_log_residual), r: 3, fill: "none", stroke: "#c0392b" },
          svg("title", { text: `public calibration: ${fmt.pct(Math.expm1(r.public_log_residual))}` })));
      items.push(svg("circle", { cx: x(i), cy: y(r.log_residual), r: 4, fill: "#27ae60", "data-residual": r.log_residual },
        svg("title", { text: `v${cal.version}: ${fmt.pct(Math.expm1(r.log_residual))} (observed ${fmt.time(r.observed_step_s)}, ${fmt.date(r.created_at)})` })));
    });
    return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", id: "residual-plot",
      "aria-label": "Step-time error of every observation of the cluster in time order: green at the latest calibration, red circles with the public one; dashed lines mark the calibration version each observation was predicted with" }, items);
  }

  function observedSection(plan) {
    const obs = plan.observed;
    const cal = plan.calibration || {};
    if (!obs) return null;
    const residuals = h("div", { id: "residuals" }, h("p", {}, "Loading the cluster's calibration…"));
    api("GET", `/v1/clusters/${encodeURIComponent(cal.cluster || plan.cluster?.name || "")}/calibration`)
      .then((r) => setChildren(residuals,
        kv([["Calibration", `version ${r.data.version} from ${r.data.n_observations} observation(s)`],
            ["CV median |error|", fmt.pct(r.data.cross_validation?.median_abs_step_error)],
            ["…with the public calibration", fmt.pct(r.data.cross_validation?.median_abs_step_error_public)]]),
        residualPlot(r.data)))
      .catch((err) => setChildren(residuals, h("p", {}, `No calibration: ${err.message}`)));
    return section("Predicted vs observed", "observed",
      kv([
        ["Observed step", `${fmt.time(obs.step_time_s)} (${obs.observations} run${obs.observations === 1 ? "" : "s"}, ${obs.format})`],
        ["Predicted step", `${fmt.time(obs.predicted_step_time_s)} (80%: ${fmt.time(obs.predicted_step_time_s_p10)} – ${fmt.time(obs.predicted_step_time_s_p90)})`],
        ["Error", `${fmt.pct(obs.step_error_fraction)}${obs.within_interval === false ? " — outside the interval" : ""}`],
        ["Peak memory", observedPeak(obs.peak_memory_as_printed_GB, obs.peak_memory_reserved_GB ?? obs.peak_memory_allocated_GB,
          obs.predicted_peak_memory_GB)],
        ["Costed with", `calibration version ${cal.version ?? 0} (${cal.source || "public"})`],
      ]),
      observedPlot(obs),
      h("h3", {}, "Residuals of the cluster over time"),
      residuals);
  }

  async function showPlan(id) {
    showView("plan", "Plan " + fmt.shortId(id));
    const box = $("#plan-error");
    box.hidden = true;
    const body = $("#plan-body");
    delete body.dataset.planId;
    setChildren(body);
    $("#plan-title").textContent = "Plan " + fmt.shortId(id);
    focusHeading("#plan-title");
    try {
      let plan = state.plans.get(id);
      if (!plan) {
        setChildren(body, h("p", {}, "Loading…"));
        plan = (await api("GET", `/v1/plans/${encodeURIComponent(id)}`)).data;
        state.plans.set(id, plan);
      }
      if (location.hash !== "#/plans/" + encodeURIComponent(id)) return; // navigated away meanwhile
      renderPlan(plan);
    } catch (err) {
      setChildren(body);
      setChildren(box, h("strong", {}, err.field ? `${err.field}: ` : "Error: "), err.message);
      box.hidden = false;
    }
  }

  // ───────────── start ─────────────

  async function start() {
    setupKeyField();
    form.addEventListener("submit", submitPlan);
    $$('input[name="model-kind"], input[name="cluster-kind"]').forEach((el) => el.addEventListener("change", syncFormParts));
    $$('input[name="mode"]').forEach((el) => el.addEventListener("change", syncMode));
    $("#preset").addEventListener("change", updatePresetInfo);
    $("#framework").addEventListener("change", updateFrameworkInfo);
    $("#saved-cluster").addEventListener("change", updateSavedInfo);
    $("#add-group").addEventListener("click", () => $("input", addGroup({ name: `g${$$("#groups tr").length}` })).focus());
    $("#filter-form").addEventListener("submit", submitFilters);
    window.addEventListener("hashchange", route);
    try {
      const [presets, devices, clusters] = await Promise.all([
        api("GET", "/v1/presets"),
        api("GET", "/v1/devices"),
        api("GET", "/v1/clusters"),
      ]);
      state.presets = presets.data.items;
      state.devices = devices.data.items;
      state.clusters = clusters.data.items;
    } catch (err) {
      setFlash(`Could not load the catalogs: ${err.message}`);
    }
    fillCatalogs();
    fillSavedClusters();
    updateFrameworkInfo();
    addGroup({ name: "g0", device: "A100-SXM4-80GB", count: 1, gpus_per_node: 8 });
    syncFormParts();
    document.body.dataset.ready = "true";
    await route();
  }

  start();
})();
