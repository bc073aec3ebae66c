/* autopar web UI: one script, no build step. It reads location.pathname, fetches the JSON API and
 * draws the page; charts are Chart.js (vendored, /static/vendor/chartjs). Units as `autopar plan`
 * prints them: memory in GiB (2^30 bytes), times in seconds, throughput in tokens/s per GPU (the
 * whole job's tokens/s beside it where both are shown). When a page has finished drawing,
 * <body data-ready="1"> is set (the browser test waits for it). */
"use strict";

const GIB = 2 ** 30;
const CONFIG = JSON.parse(document.body.dataset.config || "{}");
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const POLL_MS = 2000;
const MEMORY_PARTS = [
  ["parameters_bytes", "parameters", "#2a5db0"], ["gradients_bytes", "gradients", "#5b8def"],
  ["optimizer_bytes", "optimizer", "#9cb8f2"], ["activations_bytes", "activations", "#e07b39"],
  ["logits_bytes", "logits", "#f2b134"], ["comm_buffers_bytes", "comm buffers", "#6aa84f"],
  ["reserve_bytes", "allocator reserve", "#b7b7b7"],
];
const PALETTE = ["#2a5db0", "#e07b39", "#6aa84f", "#a64d79", "#f2b134", "#45818e", "#cc4125", "#674ea7"];
const charts = {};
window.autoparCharts = charts;

if (window.Chart) {
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
}

// ---- helpers ------------------------------------------------------------------------------------
function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function num(x, digits = 2) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return Number(x).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}
const gib = (bytes) => (bytes === null || bytes === undefined ? "–" : num(bytes / GIB, 2));
const pct = (x, digits = 1) => (x === null || x === undefined ? "–" : `${num(100 * x, digits)}%`);
const signedPct = (x) => (x === null || x === undefined ? "–" : `${x >= 0 ? "+" : ""}${num(100 * x, 1)}%`);
const when = (iso) => (iso ? esc(iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", " UTC")) : "–");
const app = () => document.getElementById("app");

function token() {
  return localStorage.getItem("autopar.token") || "";
}

class NeedToken extends Error {}

async function api(path, { auth = false } = {}) {
  const headers = { Accept: "application/json" };
  if (auth) {
    if (!token()) throw new NeedToken("runs need an API token");
    headers.Authorization = `Bearer ${token()}`;
  }
  const response = await fetch(path, { headers });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      message = body.detail.map((d) => d.msg).join("; ");
    } catch (_) { /* not a JSON error body */ }
    throw new Error(`${path}: ${message}`);
  }
  return response.json();
}

function chart(id, config) {
  if (charts[id]) charts[id].destroy();
  const canvas = document.getElementById(id);
  charts[id] = new Chart(canvas, config);
  return charts[id];
}
function destroyCharts() {
  for (const id of Object.keys(charts)) {
    charts[id].destroy();
    delete charts[id];
  }
}
const axis = (title, extra = {}) => ({ title: { display: true, text: title }, ...extra });

function ready() {
  document.body.dataset.ready = "1";
}
function fail(error) {
  if (error instanceof NeedToken) {
    app().innerHTML = `<h1>Runs</h1><p class="notice">Reading runs needs an API token: create one with
      <code>autopar tokens create --name me</code> and paste it in the box at the top right.</p>`;
  } else {
    app().innerHTML = `<p class="error">${esc(error.message || error)}</p>`;
  }
  ready();
}

function describe(l) {
  const parts = [`dp${l.dp}`, `tp${l.tp}`, `pp${l.pp}`];
  if (l.vpp > 1) parts.push(`vpp${l.vpp}`);
  if (l.cp > 1) parts.push(`cp${l.cp}`);
  if (l.ep > 1) parts.push(`ep${l.ep}`);
  parts.push(`zero${l.zero_stage}`);
  if (l.dp_shard && l.dp_shard < l.dp && l.zero_stage > 0) parts.push(`shard${l.dp_shard}`);
  parts.push(`mb${l.micro_batch}`, `ga${l.grad_accum}`);
  if (l.recompute !== "none") parts.push(`rc:${l.recompute}${l.recompute_layers ? `(${l.recompute_layers})` : ""}`);
  if (l.pp > 1) parts.push(l.schedule);
  if (l.sp) parts.push("sp");
  if (l.offload_optimizer) parts.push("offload");
  return parts.join(" ");
}
function methodLabel(training, short = false) {
  // full training, or the frozen-base methods as `autopar plan` names them (LoRA / QLoRA; with the whole
  // TrainingSpec, the adapter rank and the base's format too)
  const m = (training && training.method) || "full";
  if (m === "full") return "full";
  const name = m === "qlora" ? "QLoRA" : "LoRA";
  if (short) return name;
  const rank = training.lora_rank ? ` r${training.lora_rank}` : "";
  const base = m === "qlora" ? ` ${training.quant_format || "nf4_double"}` : "";
  return `${name}${rank}${base}`;
}
const gpusText = (n) => `${n} GPU${n === 1 ? "" : "s"}`;
const perGpu = (tokensPerS, gpus) => (tokensPerS === null || tokensPerS === undefined || !gpus ? null : tokensPerS / gpus);
function tieNote(cands) {
  // the CLI's note under its table: row 1 chosen over faster rows by the planner's tie-break
  const best = cands[0].estimate.step_s;
  const faster = cands.map((c, i) => [i + 1, c.estimate.step_s]).filter(([i, s]) => i > 1 && s < best);
  if (!faster.length) return "";
  const gap = Math.max(...faster.map(([, s]) => best / s - 1));
  return `<p class="muted" id="tie-note">* #1 is predicted up to ${num(100 * gap, 1)}% slower than row${faster.length > 1 ? "s" : ""}
    ${faster.map(([i]) => i).join(", ")}: within the model's resolution (a quarter of the error band), a tie, broken towards
    fewer moving parts (lower cp, fewer virtual stages, the default rank order) and more memory headroom.</p>`;
}
function runLength(values) {
  // [4, 4, 4, 3] -> "4 ×3, 3": layers per pipeline chunk, in pipeline order
  const out = [];
  for (const v of values) {
    const last = out[out.length - 1];
    if (last && last[0] === v) last[1] += 1;
    else out.push([v, 1]);
  }
  return out.map(([v, n]) => (n > 1 ? `${v} ×${n}` : `${v}`)).join(", ");
}
const cards = (items) =>
  `<div class="cards">${items.map(([k, v]) => `<div class="card"><div class="k">${esc(k)}</div><div class="v">${v}</div></div>`).join("")}</div>`;
function table(headers, rows, { numeric = [] } = {}) {
  const th = headers.map((h, i) => `<th class="${numeric.includes(i) ? "num" : ""}">${esc(h)}</th>`).join("");
  const body = rows.map((r) => `<tr>${r.map((c, i) => `<td class="${numeric.includes(i) ? "num" : ""}">${c}</td>`).join("")}</tr>`).join("");
  return `<table><thead><tr>${th}</tr></thead><tbody>${body}</tbody></table>`;
}
function progressBar(run) {
  const p = run.progress;
  const done = run.status === "succeeded" ? run.steps : p ? p.step : 0;
  const total = (p && p.steps) || run.steps;
  const frac = total ? Math.min(1, done / total) : 0;
  return `<div class="progress" title="${done}/${total} steps"><div style="width:${(100 * frac).toFixed(1)}%"></div></div>
    <span class="muted">${done}/${total} steps</span>`;
}
const pill = (status) => `<span class="pill ${esc(status)}">${esc(status)}</span>`;
function usableBytes(plan) {
  const est = plan.best.estimate;
  return est.memory.capacity_bytes * (1 - (plan.inputs.constraints.memory_headroom || 0));
}

// ---- plan list ----------------------------------------------------------------------------------
async function plansPage() {
  const q = new URLSearchParams(location.search);
  const sort = q.get("sort") || "-created_at";
  const limit = 50;
  const offset = Number(q.get("offset") || 0);
  const query = new URLSearchParams({ sort, limit, offset });
  for (const key of ["model", "cluster", "gpus", "feasible"]) if (q.get(key)) query.set(key, q.get(key));
  const page = await api(`/v1/plans?${query}`);
  const picked = new Set((q.get("pick") || "").split(","));
  const sortHeader = (key, label, align = "num") => {
    const active = sort.replace("-", "") === key;
    const next = active && sort.startsWith("-") ? key : `-${key}`;
    const arrow = active ? (sort.startsWith("-") ? " ▼" : " ▲") : "";
    const u = new URLSearchParams(q); u.set("sort", next); u.delete("offset");
    return `<th class="${align} sortable"><a href="?${u}" data-sort="${key}">${label}${arrow}</a></th>`;
  };
  const rows = page.items.map((p) => `<tr>
      <td><input type="checkbox" class="pick" value="${p.id}" ${picked.has(String(p.id)) ? "checked" : ""}></td>
      <td><a href="/ui/plans/${p.id}">#${p.id}</a></td><td>${when(p.created_at)}</td>
      <td>${esc(p.model)}</td><td>${esc(p.cluster)}</td><td class="num">${p.gpus}</td>
      <td class="num">${p.seq_len}</td><td class="num">${p.global_batch}</td><td>${esc(p.precision)}</td>
      <td class="method">${esc(methodLabel({ method: p.method }, true))}</td>
      <td>${p.feasible ? '<span class="good">fits</span>' : '<span class="bad">no layout fits</span>'}</td>
      <td class="num">${num(p.step_s, 3)}</td><td class="num">${num(perGpu(p.tokens_per_s, p.gpus), 0)}</td><td class="num">${pct(p.mfu)}</td>
      <td class="muted">${esc(p.calibration)}</td></tr>`).join("");
  const opt = (v, label, cur) => `<option value="${v}" ${cur === v ? "selected" : ""}>${label}</option>`;
  const prev = new URLSearchParams(q); prev.set("offset", Math.max(0, offset - limit));
  const next = new URLSearchParams(q); next.set("offset", offset + limit);
  app().innerHTML = `<h1>Plans</h1>
    <form class="filters" id="filters">
      <label>model<input name="model" value="${esc(q.get("model") || "")}" size="14"></label>
      <label>cluster<input name="cluster" value="${esc(q.get("cluster") || "")}" size="14"></label>
      <label>GPUs<input name="gpus" type="number" min="1" value="${esc(q.get("gpus") || "")}" style="width:6rem"></label>
      <label>fits<select name="feasible">${opt("", "any", q.get("feasible") || "")}${opt("true", "fits", q.get("feasible"))}${opt("false", "does not fit", q.get("feasible"))}</select></label>
      <label>sort<select name="sort">${[["-created_at", "newest"], ["created_at", "oldest"], ["-tokens_per_s", "most tokens/s (whole job)"], ["tokens_per_s", "fewest tokens/s (whole job)"], ["-mfu", "highest MFU"], ["mfu", "lowest MFU"]].map(([v, l]) => opt(v, l, sort)).join("")}</select></label>
      <button type="submit">Filter</button>
      <button type="button" id="compare" disabled>Compare selected</button>
    </form>
    <p class="muted">${page.total} plan(s); showing ${page.items.length ? offset + 1 : 0}–${offset + page.items.length}.
      ${offset > 0 ? `<a href="?${prev}">previous</a>` : ""} ${offset + limit < page.total ? `<a href="?${next}">next</a>` : ""}</p>
    <table id="plans"><thead><tr><th></th><th>plan</th>${sortHeader("created_at", "created", "")}<th>model</th><th>cluster</th><th class="num">GPUs</th>
      <th class="num">seq</th><th class="num">global batch</th><th>precision</th><th>method</th><th>fits</th>
      <th class="num">step s</th><th class="num">tokens/s/GPU</th>${sortHeader("mfu", "MFU")}<th>calibration</th></tr></thead>
      <tbody>${rows || '<tr><td colspan="15" class="muted">No plans yet: POST /v1/plans (see /docs).</td></tr>'}</tbody></table>`;
  document.getElementById("filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const u = new URLSearchParams();
    for (const [k, v] of new FormData(ev.target)) if (v) u.set(k, v);
    location.search = u.toString();
  });
  const picks = [...document.querySelectorAll("input.pick")];
  const button = document.getElementById("compare");
  const chosen = () => picks.filter((p) => p.checked).map((p) => p.value);
  picks.forEach((p) => p.addEventListener("change", () => { button.disabled = chosen().length < 2; }));
  button.disabled = chosen().length < 2;
  button.addEventListener("click", () => { location.href = `/ui/compare?ids=${chosen().join(",")}`; });
  ready();
}

// ---- one plan -----------------------------------------------------------------------------------
// Horizontal reference lines across the whole plot (GPU capacity, usable memory, a prediction),
// labelled on the line (under it with `below`): options.plugins.hlines.lines = [{value, label, color, dash, below}].
const hlines = {
  id: "hlines",
  afterDatasetsDraw(c, _args, opts) {
    const { ctx, chartArea, scales } = c;
    for (const line of opts.lines || []) {
      const y = scales.y.getPixelForValue(line.value);
      ctx.save();
      ctx.strokeStyle = ctx.fillStyle = line.color || "#b42318";
      ctx.lineWidth = 2;
      ctx.setLineDash(line.dash || []);
      ctx.beginPath();
      ctx.moveTo(chartArea.left, y);
      ctx.lineTo(chartArea.right, y);
      ctx.stroke();
      ctx.font = "11px system-ui, sans-serif";
      ctx.textAlign = "right";
      ctx.fillText(line.label, chartArea.right - 4, line.below ? y + 13 : y - 4);
      ctx.restore();
    }
  },
};

function memoryChart(id, labels, stages, capacity, usable) {
  chart(id, {
    type: "bar",
    plugins: [hlines],
    data: {
      labels,
      datasets: MEMORY_PARTS.map(([key, label, color]) => ({ label, data: stages.map((s) => (s[key] || 0) / GIB), backgroundColor: color, stack: "mem" })),
    },
    options: {
      scales: { x: { stacked: true }, y: axis("GiB per GPU (worst rank)", { stacked: true, beginAtZero: true, suggestedMax: (capacity / GIB) * 1.08 }) },
      plugins: {
        hlines: {
          lines: [
            { value: capacity / GIB, label: `GPU capacity ${num(capacity / GIB, 1)} GiB` },
            { value: usable / GIB, label: `usable ${num(usable / GIB, 1)} GiB (after headroom)`, dash: [6, 4], below: true },
          ],
        },
      },
    },
  });
}
function timeBreakdownChart(id, breakdown) {
  const entries = Object.entries(breakdown).filter(([, v]) => v > 0);
  chart(id, {
    type: "bar",
    data: { labels: entries.map(([k]) => k.replace(/_s$/, "")), datasets: [{ label: "seconds per step (critical path)", data: entries.map(([, v]) => v), backgroundColor: "#2a5db0" }] },
    options: { indexAxis: "y", scales: { x: axis("seconds", { beginAtZero: true }) }, plugins: { legend: { display: false } } },
  });
}
const paretoPoint = (c) => ({ x: c.estimate.memory.peak_bytes / GIB, y: c.estimate.tokens_per_s_per_gpu, layout: describe(c.layout) });
function paretoChart(id, datasets) {
  chart(id, {
    type: "scatter",
    data: { datasets },
    options: {
      scales: { x: axis("peak memory, GiB per GPU"), y: axis("tokens/s per GPU") },
      plugins: { tooltip: { callbacks: { label: (ctx) => `${ctx.raw.layout}: ${num(ctx.raw.y, 0)} tokens/s/GPU, ${num(ctx.raw.x, 1)} GiB` } } },
    },
  });
}

async function planPage(id) {
  const [record, profiles, runs] = await Promise.all([
    api(`/v1/plans/${id}`), api(`/v1/plans/${id}/profiles?limit=200`),
    token() ? api(`/v1/runs?plan_id=${id}&limit=50`, { auth: true }) : Promise.resolve(null),
  ]);
  const plan = record.plan;
  const inp = plan.inputs;
  const best = plan.best;
  let html = `<h1>Plan #${record.id}: ${esc(inp.model.name)} on ${gpusText(inp.gpus)} of ${esc(inp.cluster.name)}</h1>
    <p class="muted">seq ${inp.training.seq_len}, global batch ${inp.training.global_batch} sequences, ${esc(inp.training.precision)},
      method <span id="plan-method">${esc(methodLabel(inp.training))}</span>, framework ${esc(inp.constraints.framework)};
      created ${when(record.created_at)}; calibration: ${esc(plan.calibration)}.
      <a href="/ui/plans?pick=${record.id}">compare with…</a></p>
    <ul class="why">${plan.why.map((w) => `<li>${esc(w)}</li>`).join("")}</ul>`;
  if (best) {
    const e = best.estimate;
    const l = best.layout;
    const band = e.error_band;
    html += cards([
      ["step time", `${num(e.step_s, 3)} s`], ["throughput", `${num(e.tokens_per_s_per_gpu, 0)} tokens/s/GPU`],
      ["whole job", `${num(e.tokens_per_s, 0)} tokens/s`],
      ["MFU", pct(e.mfu) + (band ? ` <span class="muted">(${num(100 * band.mfu_low, 0)}-${num(100 * band.mfu_high, 0)})</span>` : "")],
      ["method", esc(methodLabel(inp.training))],
      ["peak memory", `${gib(e.memory.peak_bytes)} of ${gib(usableBytes(plan))} GiB usable`], ["pipeline bubble", pct(e.bubble_fraction)],
    ]);
    html += `<h2>Layout</h2>${table(
      ["dp", "dp shard", "tp", "sp", "pp", "vpp", "cp", "ep", "ZeRO", "micro batch", "grad accum", "recompute", "schedule", "offload optimizer", "rank order", "layers per chunk"],
      [[l.dp, l.dp_shard, l.tp, l.sp ? "on" : "off", l.pp, l.vpp, l.cp, l.ep, l.zero_stage, l.micro_batch, l.grad_accum,
        esc(l.recompute + (l.recompute_layers ? ` (${l.recompute_layers} layers)` : "")), esc(l.schedule), l.offload_optimizer ? "yes" : "no", esc(l.order), esc(runLength(best.partition))]],
    )}`;
    if (best.placement) {
      html += `<h2>Placement on the topology</h2>${table(
        ["dimension", "size", "stride", "tier", "bus bandwidth (GB/s)", "latency (µs)"],
        best.placement.groups.map((g) => [esc(g.dim), g.size, g.stride, esc(g.tier), num(g.bus_bandwidth_bytes_per_s / 1e9, 1), num(g.latency_s * 1e6, 1)]),
        { numeric: [1, 2, 4, 5] },
      )}`;
    }
    html += `<h2>Export</h2><p id="exports">${(CONFIG.export_formats || []).map((f) =>
      `<a class="export" href="/v1/plans/${record.id}/export/${esc(f)}" download>${esc(f)}</a>`).join(" · ")}</p>
      <div class="grid2">
        <div class="panel"><h2>Memory per pipeline stage (worst rank)</h2><div class="chart"><canvas id="chart-memory"></canvas></div></div>
        <div class="panel"><h2>Step-time breakdown</h2><div class="chart"><canvas id="chart-time"></canvas></div></div>
        <div class="panel"><h2>Pareto front: throughput vs memory</h2><div class="chart"><canvas id="chart-pareto"></canvas></div></div>
      </div>
      <h2>Best and runner-up layouts</h2>${table(
        ["#", "layout", "step s", "tokens/s/GPU", "MFU", "peak GiB", "bubble"],
        [best, ...plan.alternatives].map((c, i, all) => [i === 0 && tieNote(all) ? "1*" : i + 1, esc(describe(c.layout)), num(c.estimate.step_s, 3), num(c.estimate.tokens_per_s_per_gpu, 0),
          pct(c.estimate.mfu), gib(c.estimate.memory.peak_bytes), pct(c.estimate.bubble_fraction)]),
        { numeric: [0, 2, 3, 4, 5, 6] },
      )}${tieNote([best, ...plan.alternatives])}
      <p class="muted">MFU in brackets: the 10th-90th percentile of what held-out published runs of the regime measured relative to
        their own predictions, applied to this one (it need not contain the prediction: a regime whose runs all beat their
        prediction puts the prediction below it).</p>`;
  } else if (plan.closest_miss) {
    const miss = plan.closest_miss;
    html += `<h2>Closest miss</h2>
      <p>${esc(describe(miss.layout))}: needs ${gib(miss.peak_bytes)} GiB on pipeline stage ${miss.worst_stage},
        ${gib(miss.over_by_bytes)} GiB over the ${gib(miss.usable_bytes)} GiB usable per GPU.</p>
      <div class="grid2"><div class="panel"><h2>Memory of the closest miss (worst stage)</h2>
        <div class="chart"><canvas id="chart-miss"></canvas></div></div></div>`;
  }
  if (plan.rejections.length) {
    const rejected = plan.rejections.reduce((n, r) => n + r.count, 0);
    html += `<details id="rejections"><summary><h2>Rejected layouts</h2> <span class="muted">${num(rejected, 0)} layouts,
      ${plan.rejections.length} reason${plan.rejections.length === 1 ? "" : "s"} (click to show)</span></summary>${table(["count", "reason", "example"],
      plan.rejections.map((r) => [num(r.count, 0), esc(r.reason), esc(r.example)]), { numeric: [0] })}</details>`;
  }
  html += `<h2>Predicted vs measured</h2>`;
  html += profiles.items.length
    ? profileTable(profiles.items, plan)
    : `<p class="muted">No run has reported a profile for this plan yet.</p>`;
  html += `<h2>Runs of this plan</h2>`;
  if (runs) {
    html += runs.items.length
      ? table(["run", "cluster", "status", "progress", "created"], runs.items.map((r) => [`<a href="/ui/runs/${r.id}">#${r.id}</a>`,
        esc(r.cluster), pill(r.status), progressBar(r), when(r.created_at)]))
      : `<p class="muted">None queued: POST /v1/plans/${record.id}/runs (README, "Queue a stored plan").</p>`;
  } else {
    html += `<p class="muted">Paste an API token at the top right to see this plan's runs.</p>`;
  }
  html += `<h2>Search</h2><p class="muted">${num(plan.stats.generated, 0)} layouts generated, ${num(plan.stats.invalid, 0)} invalid,
    ${num(plan.stats.pruned, 0)} pruned, ${num(plan.stats.priced, 0)} priced, ${num(plan.stats.feasible, 0)} fit${plan.stats.dominated ? `, ${num(plan.stats.dominated, 0)} of them bounded, not timed (slower than the best and dominated)` : ''}; ${num(plan.stats.seconds, 2)} s.</p>`;
  app().innerHTML = html;
  if (!best && plan.closest_miss) {
    const miss = plan.closest_miss;
    const capacity = inp.cluster.gpu.memory_bytes;
    memoryChart("chart-miss", [`stage ${miss.worst_stage}`], [miss.breakdown], capacity, miss.usable_bytes);
  }
  if (best) {
    const stages = best.estimate.memory.stages;
    memoryChart("chart-memory", stages.map((_, i) => `stage ${i}`), stages, best.estimate.memory.capacity_bytes, usableBytes(plan));
    timeBreakdownChart("chart-time", best.estimate.time.breakdown);
    const alt = plan.alternatives.map(paretoPoint);
    paretoChart("chart-pareto", [
      { label: "Pareto front", data: [...plan.pareto].map(paretoPoint).sort((a, b) => a.x - b.x), showLine: true, borderColor: "#2a5db0", backgroundColor: "#2a5db0" },
      { label: "runner-up layouts", data: alt, backgroundColor: "#e07b39", pointRadius: 4 },
      { label: "chosen", data: [paretoPoint(best)], backgroundColor: "#b42318", pointRadius: 8, pointStyle: "star", borderColor: "#b42318" },
    ]);
  }
  ready();
}

function memoryComparable(p, plan) {
  // a CPU run's live-storage tracker against a GPU plan's prediction measures another device: no error to show
  const source = (p.profile.profile && p.profile.profile.memory_source) || "";
  const vendor = plan && plan.inputs.cluster.gpu.vendor;
  return !(source.includes("CPU") && vendor && vendor !== "cpu");
}
function profileTable(items, plan) {
  const gpus = plan ? plan.inputs.gpus : null;
  return table(
    ["run", "attempt", "step s (pred / meas)", "step error", "tokens/s/GPU (pred / meas)", "MFU (pred / meas)", "peak GiB (worst stage pred / max rank meas)", "memory error"],
    items.map((p) => {
      const comparable = memoryComparable(p, plan);
      return [
        `<a href="/ui/runs/${p.profile.run_id}">#${p.profile.run_id}</a>`, p.profile.attempt,
        `${num(p.predicted.step_s, 3)} / ${num(p.measured.step_s, 3)}`, signedPct(p.error.step_s_rel),
        `${num(perGpu(p.predicted.tokens_per_s, gpus), 0)} / ${num(perGpu(p.measured.tokens_per_s, gpus), 0)}`, `${pct(p.predicted.mfu)} / ${pct(p.measured.mfu)}`,
        `${gib(Math.max(...p.predicted.peak_bytes_per_stage, 0))} / ${gib(p.measured.peak_memory_bytes_max)}`,
        comparable ? signedPct(p.error.peak_memory_rel)
          : `<span class="muted memory-not-compared" title="measured by the CPU live-storage tracker, predicted for ${esc(plan.inputs.cluster.gpu.name)}">not compared: CPU run, ${esc(plan.inputs.cluster.gpu.name)} plan</span>`,
      ];
    }),
    { numeric: [1, 3] },
  );
}

// ---- compare ------------------------------------------------------------------------------------
async function comparePage() {
  const ids = (new URLSearchParams(location.search).get("ids") || "").split(",").map((s) => s.trim()).filter((s) => /^\d+$/.test(s));
  if (ids.length < 2) {
    app().innerHTML = `<h1>Compare plans</h1><p>Pick two or more plans on the <a href="/ui/plans">plan list</a>
      (tick them, then "Compare selected"), or open <code>/ui/compare?ids=1,2</code>.</p>`;
    ready();
    return;
  }
  const records = await Promise.all(ids.map((i) => api(`/v1/plans/${i}`)));
  const label = (r) => `#${r.id} ${r.model} / ${r.gpus}×${r.plan.inputs.cluster.gpu.name}`;
  const rows = [
    ["model", (r) => esc(r.model)], ["cluster", (r) => esc(r.cluster)], ["GPUs", (r) => r.gpus],
    ["seq × global batch", (r) => `${r.seq_len} × ${r.global_batch}`], ["precision", (r) => esc(r.precision)],
    ["method", (r) => esc(methodLabel(r.plan.inputs.training))],
    ["layout", (r) => (r.plan.best ? esc(describe(r.plan.best.layout)) : '<span class="bad">no layout fits</span>')],
    ["step s", (r) => num(r.step_s, 3)],
    ["tokens/s/GPU", (r) => (r.plan.best ? num(r.plan.best.estimate.tokens_per_s_per_gpu, 0) : "–")],
    ["tokens/s (whole job)", (r) => num(r.tokens_per_s, 0)], ["MFU", (r) => pct(r.mfu)],
    ["peak GiB / usable GiB", (r) => (r.plan.best ? `${gib(r.plan.best.estimate.memory.peak_bytes)} / ${gib(usableBytes(r.plan))}` : "–")],
    ["pipeline bubble", (r) => (r.plan.best ? pct(r.plan.best.estimate.bubble_fraction) : "–")], ["calibration", (r) => esc(r.calibration)],
  ];
  app().innerHTML = `<h1>Compare plans</h1>
    <table id="compare-table"><thead><tr><th></th>${records.map((r) => `<th><a href="/ui/plans/${r.id}">${esc(label(r))}</a></th>`).join("")}</tr></thead>
    <tbody>${rows.map(([name, f]) => `<tr><th>${esc(name)}</th>${records.map((r) => `<td>${f(r)}</td>`).join("")}</tr>`).join("")}</tbody></table>
    <div class="grid2">
      <div class="panel"><h2>Step-time breakdown</h2><div class="chart"><canvas id="chart-compare-time"></canvas></div></div>
      <div class="panel"><h2>Peak memory (worst stage) against capacity</h2><div class="chart"><canvas id="chart-compare-memory"></canvas></div></div>
      <div class="panel"><h2>Pareto fronts: throughput vs memory</h2><div class="chart"><canvas id="chart-compare-pareto"></canvas></div></div>
    </div>`;
  const feasible = records.filter((r) => r.plan.best);
  const labels = feasible.map(label);
  const components = [...new Set(feasible.flatMap((r) => Object.keys(r.plan.best.estimate.time.breakdown)))]
    .filter((k) => feasible.some((r) => r.plan.best.estimate.time.breakdown[k] > 0));
  chart("chart-compare-time", {
    type: "bar",
    data: { labels, datasets: components.map((k, i) => ({ label: k.replace(/_s$/, ""), data: feasible.map((r) => r.plan.best.estimate.time.breakdown[k] || 0), backgroundColor: PALETTE[i % PALETTE.length], stack: "t" })) },
    options: { scales: { x: { stacked: true }, y: axis("seconds per step", { stacked: true, beginAtZero: true }) } },
  });
  const worst = (r) => r.plan.best.estimate.memory.stages[r.plan.best.estimate.memory.worst_stage];
  chart("chart-compare-memory", {
    type: "bar",
    data: {
      labels,
      datasets: [
        ...MEMORY_PARTS.map(([key, name, color]) => ({ label: name, data: feasible.map((r) => (worst(r)[key] || 0) / GIB), backgroundColor: color, stack: "m" })),
        { type: "line", label: "usable (after headroom)", stack: "usable", data: feasible.map((r) => usableBytes(r.plan) / GIB), borderColor: "#b42318", borderDash: [6, 4], pointRadius: 5, showLine: false },
      ],
    },
    options: { scales: { x: { stacked: true }, y: axis("GiB per GPU", { stacked: true, beginAtZero: true }) } },
  });
  paretoChart("chart-compare-pareto", feasible.map((r, i) => ({
    label: label(r), data: r.plan.pareto.map(paretoPoint).sort((a, b) => a.x - b.x), showLine: true,
    borderColor: PALETTE[i % PALETTE.length], backgroundColor: PALETTE[i % PALETTE.length],
  })));
  ready();
}

// ---- runs ---------------------------------------------------------------------------------------
let pollTimer = null;
function poll(fn) {
  clearTimeout(pollTimer);
  pollTimer = setTimeout(() => fn().catch(fail), POLL_MS);
}

async function runsPage() {
  const q = new URLSearchParams(location.search);
  const query = new URLSearchParams({ limit: 100 });
  for (const key of ["status", "cluster", "plan_id"]) if (q.get(key)) query.set(key, q.get(key));
  const page = await api(`/v1/runs?${query}`, { auth: true });
  const live = page.items.some((r) => !TERMINAL.has(r.status));
  const statuses = ["", "queued", "leased", "running", "succeeded", "failed", "cancelled"];
  app().innerHTML = `<h1>Runs</h1>
    <form class="filters" id="run-filters">
      <label>status<select name="status">${statuses.map((v) => `<option value="${v}" ${q.get("status") === v ? "selected" : ""}>${v || "any"}</option>`).join("")}</select></label>
      <label>cluster<input name="cluster" value="${esc(q.get("cluster") || "")}" size="14"></label>
      <label>plan<input name="plan_id" type="number" min="1" value="${esc(q.get("plan_id") || "")}" style="width:6rem"></label>
      <button type="submit">Filter</button>
    </form>
    <p class="muted">${page.total} run(s). ${live ? "Live: refreshed every 2 s while a run is queued or running." : ""}</p>
    ${table(["run", "plan", "cluster", "status", "progress", "loss", "attempt", "created", "finished"],
      page.items.map((r) => [`<a href="/ui/runs/${r.id}">#${r.id}</a>`, `<a href="/ui/plans/${r.plan_id}">#${r.plan_id}</a>`, esc(r.cluster),
        pill(r.status), progressBar(r), r.progress && r.progress.loss !== null ? num(r.progress.loss, 3) : "–", `${r.attempt}/${r.max_attempts}`,
        when(r.created_at), when(r.finished_at)]), { numeric: [5] })}`;
  if (!page.items.length) app().insertAdjacentHTML("beforeend", `<p class="muted">No runs: queue one with POST /v1/plans/{id}/runs.</p>`);
  document.getElementById("run-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const u = new URLSearchParams();
    for (const [k, v] of new FormData(ev.target)) if (v) u.set(k, v);
    location.search = u.toString();
  });
  ready();
  if (live) poll(runsPage);
}

async function runPage(id) {
  const run = await api(`/v1/runs/${id}`, { auth: true });
  const [record, profiles] = await Promise.all([api(`/v1/plans/${run.plan_id}`), api(`/v1/plans/${run.plan_id}/profiles?limit=200`)]);
  const mine = profiles.items.filter((p) => p.profile.run_id === run.id);
  const p = run.progress;
  const message = TERMINAL.has(run.status) ? run.status : (p && p.message) || run.status;
  let html = `<h1>Run #${run.id} of <a href="/ui/plans/${run.plan_id}">plan #${run.plan_id}</a> on cluster ${esc(run.cluster)}</h1>
    ${cards([["status", pill(run.status)], ["progress", progressBar(run)], ["state", esc(message)],
      ["loss", p && p.loss !== null && p.loss !== undefined ? num(p.loss, 3) : "–"], ["attempt", `${run.attempt} of ${run.max_attempts}`],
      ["exit code", run.exit_code ?? "–"]])}
    ${run.failure_reason ? `<p class="error">${esc(run.failure_reason)}</p>` : ""}
    <p class="muted">${esc(record.model)} on ${gpusText(record.gpus)}; ${run.steps} steps, backend ${esc(run.launch.backend)}; created ${when(run.created_at)}
      ${run.finished_at ? `, finished ${when(run.finished_at)}` : ""}${TERMINAL.has(run.status) ? "" : " · refreshed every 2 s"}</p>
    <h2>Predicted vs measured</h2>`;
  html += mine.length ? profileTable(mine, record.plan) + `<div class="grid2">
      <div class="panel"><h2>Step times</h2><div class="chart"><canvas id="chart-run-steps"></canvas></div></div>
      <div class="panel"><h2>Peak memory per rank</h2><div class="chart"><canvas id="chart-run-memory"></canvas></div></div></div>`
    : `<p class="muted">${TERMINAL.has(run.status) ? "This run reported no profile." : "The profile arrives when the run ends."}</p>`;
  html += `<h2>Attempts</h2>${table(["attempt", "agent", "leased", "ended", "outcome"],
    run.attempts.map((a) => [a.attempt, a.agent_id, when(a.leased_at), when(a.ended_at), pill(a.outcome)]))}`;
  if (run.log_tail) html += `<h2>Log tail</h2><pre>${esc(run.log_tail)}</pre>`;
  app().innerHTML = html;
  if (mine.length) {
    const prof = mine[0];
    const steps = prof.profile.profile.step_times_s || [];
    chart("chart-run-steps", {
      type: "line",
      data: {
        labels: steps.map((_, i) => i + 1),
        datasets: [
          { label: "measured", data: steps, borderColor: "#2a5db0", backgroundColor: "#2a5db0" },
          { label: "predicted", data: steps.map(() => prof.predicted.step_s), borderColor: "#b42318", borderDash: [6, 4], pointRadius: 0 },
        ],
      },
      options: { scales: { x: axis("step"), y: axis("seconds", { beginAtZero: true }) } },
    });
    const ranks = prof.measured.peak_memory_bytes_per_rank;
    const predictedWorst = Math.max(...prof.predicted.peak_bytes_per_stage, 0);
    // the GPU prediction is drawn only against memory measured on that kind of device
    const lines = memoryComparable(prof, record.plan)
      ? [{ value: predictedWorst / GIB, label: `predicted ${num(predictedWorst / GIB, 2)} GiB (worst stage)`, dash: [6, 4] }] : [];
    chart("chart-run-memory", {
      type: "bar",
      data: {
        labels: ranks.map((_, i) => `rank ${i}`),
        datasets: [{ label: "measured peak", data: ranks.map((b) => (b === null ? null : b / GIB)), backgroundColor: "#2a5db0" }],
      },
      plugins: [hlines],
      options: {
        scales: { y: axis("GiB", { beginAtZero: true, suggestedMax: lines.length ? (predictedWorst / GIB) * 1.1 : undefined }) },
        plugins: { hlines: { lines } },
      },
    });
  }
  ready();
  if (!TERMINAL.has(run.status)) poll(() => runPage(id));
}

// ---- calibration --------------------------------------------------------------------------------
async function calibrationPage(cluster) {
  if (!cluster) {
    const page = await api("/v1/clusters?limit=200");
    app().innerHTML = `<h1>Calibration per cluster</h1>
      <p class="muted">Factors refitted from the profiles runs on a cluster reported (the global calibration when none;
      presets always keep the global calibration: register a team cluster to calibrate from profiles).
      Runs are queued under a cluster name; open it here:</p>
      <form class="filters" id="cluster-form"><label>cluster name<input name="cluster" required pattern="[A-Za-z0-9._-]{1,64}"></label><button>Open</button></form>
      ${table(["cluster", "GPU", "GPUs per node", "source"], page.items.map((c) => [`<a href="/ui/calibration/${encodeURIComponent(c.name)}">${esc(c.name)}</a>`, esc(c.gpu), c.gpus_per_node, esc(c.source)]), { numeric: [2] })}`;
    document.getElementById("cluster-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      location.href = `/ui/calibration/${encodeURIComponent(new FormData(ev.target).get("cluster"))}`;
    });
    ready();
    return;
  }
  const c = await api(`/v1/clusters/${encodeURIComponent(cluster)}/calibration`);
  const err = (e) => (e ? [e.n, num(e.median_ape_pct, 1), num(e.mape_pct, 1), num(e.mean_signed_pct, 1), esc(e.method)] : ["–", "–", "–", "–", "not enough profiles"]);
  app().innerHTML = `<h1>Calibration of cluster ${esc(c.cluster)}</h1>
    ${c.note ? `<p class="notice" id="calibration-note">${esc(c.note)}</p>` : ""}
    ${cards([["profiles", c.n_profiles], ["profiles stored", c.profiles_stored], ["source", esc(c.source)], ...Object.entries(c.time_multipliers).map(([k, v]) => [`${k} time ×`, num(v, 3)])])}
    <p class="muted">${esc(c.method)}</p>
    <h2>Step-time prediction error (%)</h2>
    ${table(["", "profiles", "median |error| %", "mean |error| %", "mean signed %", "method"],
      [["before (global calibration)", ...err(c.error_before)], ["after (fitted, in-sample)", ...err(c.error_after)], ["leave one out", ...err(c.error_leave_one_out)]],
      { numeric: [1, 2, 3, 4] })}
    <div class="grid2"><div class="panel"><h2>Factors: prior vs fitted</h2><div class="chart"><canvas id="chart-calibration"></canvas></div></div></div>
    <h2>Factors</h2>
    ${table(["factor", "prior", "fitted", "unit", "identified", "why"],
      c.factors.map((f) => [esc(f.name), num(f.prior, 4), num(f.fitted, 4), esc(f.unit), f.identified ? "yes" : "no", esc(f.reason)]), { numeric: [1, 2] })}`;
  chart("chart-calibration", {
    type: "bar",
    data: {
      labels: c.factors.map((f) => f.name),
      datasets: [
        { label: "prior (global)", data: c.factors.map((f) => f.prior), backgroundColor: "#b7b7b7" },
        { label: "fitted for this cluster", data: c.factors.map((f) => f.fitted), backgroundColor: "#2a5db0" },
      ],
    },
    options: { indexAxis: "y", scales: { x: axis("factor value (unit per row of the table)", { beginAtZero: true }) } },
  });
  ready();
}

// ---- routing ------------------------------------------------------------------------------------
function route() {
  const path = location.pathname.replace(/\/+$/, "") || "/";
  const m = (re) => path.match(re);
  let match;
  let section = "plans";
  let page;
  if (path === "/" || path === "/ui" || path === "/ui/plans") page = plansPage();
  else if ((match = m(/^\/ui\/plans\/(\d+)$/))) page = planPage(match[1]);
  else if (path === "/ui/compare") page = comparePage();
  else if (path === "/ui/runs") { section = "runs"; page = runsPage(); }
  else if ((match = m(/^\/ui\/runs\/(\d+)$/))) { section = "runs"; page = runPage(match[1]); }
  else if ((match = m(/^\/ui\/calibration(?:\/([A-Za-z0-9._-]{1,64}))?$/))) { section = "calibration"; page = calibrationPage(match[1]); }
  else {
    app().innerHTML = `<p class="error">No page at ${esc(path)}. Start from the <a href="/">plan list</a>.</p>`;
    ready();
    return;
  }
  document.querySelectorAll("header nav a[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === section));
  page.catch(fail);
}

document.getElementById("token").value = token();
document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem("autopar.token", document.getElementById("token").value.trim());
  destroyCharts();
  route();
});
route();
