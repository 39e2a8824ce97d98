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
    if (s.vpp > 1) parts.push(`vpp${s.vpp}`);
    parts.push(`mbs${s.micro_batch_size}`);
    if (s.sequence_parallel) parts.push("SP");
    if (s.recompute && s.recompute !== "none") parts.push(`recompute:${s.recompute}`);
    parts.push(`ZeRO-${s.zero_stage}`);
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

  async function api(method, path, body) {
    const init = { method, headers: { Accept: "application/json" } };
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
    const totalTokens = num("#total-tokens");
    if (totalTokens !== undefined) body.training.total_tokens = totalTokens;
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
    const constraints = {};
    for (const [id, key] of [["#c-tp", "tp"], ["#c-pp", "pp"], ["#c-max-tp", "max_tp"], ["#c-max-pp", "max_pp"], ["#c-headroom", "memory_headroom_fraction"]]) {
      const v = num(id);
      if (v !== undefined) constraints[key] = v;
    }
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
    const tr = h(
      "tr",
      { class: "clickable", "data-plan-id": p.id },
      h("td", {}, link),
      h("td", { class: "nowrap" }, fmt.date(p.created_at)),
      h("td", { class: "nowrap" }, p.model.name, h("span", { class: "hint" }, ` ${fmt.params(p.model.params)}`)),
      h("td", {}, p.cluster_name || "–"),
      h("td", {}, `${p.num_devices} GPUs`, (p.device_types || []).map((t) => h("div", { class: "nowrap hint" }, t))),
      h("td", { class: "mono" }, compactStrategy(p.strategy)),
      h("td", { class: "num" }, fmt.time(p.step_time_s)),
      h("td", { class: "num" }, fmt.int(p.tokens_per_s)),
      h("td", { class: "num" }, fmt.pct(p.mfu)),
      h("td", {}, p.status, p.parent_id ? h("span", { class: "hint" }, ` replan of ${fmt.shortId(p.parent_id)}`) : null)
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

  const BREAKDOWN_KEYS = ["compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm_exposed", "bubble", "optimizer"];

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

  function renderPlan(plan) {
    const best = plan.best;
    const pred = best.prediction;
    const s = best.strategy;
    const peak = Math.max(...best.stages.map((x) => x.peak_memory_GB));
    const explanation = plan.explanation || {};
    const warnings = Array.from(new Set([...(plan.warnings || []), ...(pred.warnings || [])]));
    const whyLost = explanation.alternatives || [];
    $("#plan-title").textContent = `Plan ${fmt.shortId(plan.id)}: ${plan.model.name} on ${plan.cluster.name}`;

    const cards = h(
      "div",
      { class: "cards", "data-section": "prediction" },
      [
        ["Step time", fmt.time(pred.step_time_s)],
        ["Tokens/s", fmt.int(pred.tokens_per_s)],
        ["Samples/s", pred.samples_per_s.toFixed(1)],
        ["MFU", fmt.pct(pred.mfu)],
        ["Model TFLOP/s per GPU", pred.model_tflops_per_gpu.toFixed(1)],
        ["Peak memory (max stage)", fmt.gb(peak)],
        ...derived(plan),
      ].map(([k, v]) => h("div", { class: "card" }, h("div", { class: "card-label" }, k), h("div", { class: "card-value" }, v)))
    );

    const strategy = section(
      "Strategy",
      "strategy",
      h("dl", { class: "knobs", id: "strategy" },
        [
          ["data parallel (dp)", s.dp], ["tensor parallel (tp)", s.tp], ["pipeline parallel (pp)", s.pp],
          ["context parallel (cp)", s.cp], ["expert parallel (ep)", s.ep], ["virtual stages (vpp)", s.vpp],
          ["micro-batch size", s.micro_batch_size], ["micro-batches per step", pred.num_microbatches],
          ["sequence parallel", s.sequence_parallel ? "yes" : "no"], ["recompute", s.recompute], ["ZeRO stage", s.zero_stage],
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
        ["Training", `batch ${plan.training.global_batch_size} × ${plan.training.sequence_length} tokens, ${plan.training.dtype}, ${plan.training.optimizer}`],
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
      alts.length
        ? table(
            "Alternative plans",
            ["#", "Strategy", "Step time", "Tokens/s", "MFU", "Peak memory", "Versus the best"],
            alts.map((a, i) =>
              h("tr", {},
                h("td", {}, String(i + 1)),
                h("td", { class: "mono" }, compactStrategy(a.strategy)),
                h("td", { class: "num" }, fmt.time(a.prediction.step_time_s)),
                h("td", { class: "num" }, fmt.int(a.prediction.tokens_per_s)),
                h("td", { class: "num" }, fmt.pct(a.prediction.mfu)),
                h("td", { class: "num" }, fmt.gb(Math.max(...a.prediction.peak_memory_GB))),
                h("td", {}, versusBest(best, a))
              )
            ),
            { id: "alternatives-table" }
          )
        : h("p", {}, "No alternatives were kept (top_k = 0).")
    );

    const search = plan.search || {};
    setChildren($("#plan-body"),
      cards,
      warnings.length ? section("Warnings", "warnings", h("ul", { class: "warnings" }, warnings.map((w) => h("li", {}, w)))) : null,
      plan.diff ? diffSection(plan.diff) : null,
      strategy,
      section("Where the step time goes", "breakdown", ...breakdownBar(pred.breakdown_s)),
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
    form.addEventListener("submit", submitPlan);
    $$('input[name="model-kind"], input[name="cluster-kind"]').forEach((el) => el.addEventListener("change", syncFormParts));
    $$('input[name="mode"]').forEach((el) => el.addEventListener("change", syncMode));
    $("#preset").addEventListener("change", updatePresetInfo);
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
    addGroup({ name: "g0", device: "A100-SXM4-80GB", count: 1, gpus_per_node: 8 });
    syncFormParts();
    document.body.dataset.ready = "true";
    await route();
  }

  start();
})();
