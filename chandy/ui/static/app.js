// The checkpoint dashboard of `chandy ui`: polls the REST endpoints every second and redraws.
// No framework, no build step; everything user-supplied goes in through textContent.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
let selectedJob = decodeURIComponent((location.hash.match(/job=([^&]+)/) || [])[1] || "");

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function fmtBytes(n) {
  if (n === null || n === undefined || n < 0) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

const fmtMs = (n) => (n === null || n === undefined || n < 0 ? "–" : Math.round(n) + " ms");
const fmtTime = (ms) => (ms && ms > 0 ? new Date(ms).toLocaleTimeString() : "–");

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error((body.errors || [response.statusText]).join("; "));
  return body;
}

function renderJobs(jobs) {
  const list = document.getElementById("jobs");
  list.replaceChildren();
  if (!jobs.length) { list.append(el("li", { class: "muted" }, "no job yet")); return; }
  if (!selectedJob || !jobs.some((j) => j.id === selectedJob)) selectedJob = jobs[jobs.length - 1].id;
  for (const job of jobs) {
    const a = el("a", { href: "#job=" + encodeURIComponent(job.id), "data-job-id": job.id,
                        class: job.id === selectedJob ? "selected" : "" }, job.id);
    a.title = `${job.status}: ${job.counts.completed} completed, ${job.counts.failed} failed`;
    a.addEventListener("click", () => { selectedJob = job.id; refresh(); });
    const li = el("li");
    li.append(a);
    // the job's name beside its ID (Flink's job name; a TRIGGERED event carries it)
    if (job.name && job.name !== job.id) li.append(el("span", { class: "job-name", "data-job-name": job.id }, job.name));
    list.append(li);
  }
}

function renderCounts(counts) {
  const box = document.getElementById("counts");
  box.replaceChildren();
  for (const [label, key] of [["triggered", "total"], ["in progress", "in_progress"], ["completed", "completed"],
                               ["failed", "failed"], ["restored", "restored"]]) {
    const card = el("div", { "data-count": key });
    card.append(el("b", {}, String(counts[key])), document.createTextNode(label));
    box.append(card);
  }
}

function renderLatest(id, rows) {
  const dl = document.getElementById(id);
  dl.replaceChildren();
  if (!rows) { dl.append(el("dt", {}, "none")); return; }
  for (const [k, v] of rows) dl.append(el("dt", {}, k), el("dd", {}, v));
}

function renderChart(history) {
  const chart = document.getElementById("chart");
  chart.replaceChildren();
  const points = history.slice().reverse();  // oldest first
  const W = 800, H = 240, L = 56, R = 64, T = 14, B = 28;
  if (!points.length) return;
  const ids = points.map((c) => c.id);
  const minId = Math.min(...ids), maxId = Math.max(...ids);
  const x = (id) => L + (maxId === minId ? (W - L - R) / 2 : ((id - minId) / (maxId - minId)) * (W - L - R));
  const done = points.filter((c) => c.status === "COMPLETED");
  const maxDur = Math.max(1, ...points.map((c) => c.end_to_end_duration || 0));
  const maxSize = Math.max(1, ...done.map((c) => c.state_size || 0));
  const yDur = (v) => H - B - (v / maxDur) * (H - T - B);
  const ySize = (v) => H - B - (v / maxSize) * (H - T - B);
  chart.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999" }));
  chart.append(svg("line", { class: "axis-duration", x1: L, y1: T, x2: L, y2: H - B, stroke: "#1565c0" }));
  chart.append(svg("line", { class: "axis-size", x1: W - R, y1: T, x2: W - R, y2: H - B, stroke: "#2e7d32" }));
  // axis titles with their units: duration (left, ms), state size (right, bytes), checkpoints (bottom)
  for (const [cls, label, xPos, yPos, rotate, color] of [
    ["axis-title duration", "end-to-end duration (ms)", 12, (T + H - B) / 2, -90, "#1565c0"],
    ["axis-title size", "state size (bytes)", W - 10, (T + H - B) / 2, 90, "#2e7d32"],
  ]) {
    const t = svg("text", { class: cls, x: xPos, y: yPos, "font-size": 11, "text-anchor": "middle", fill: color,
                            transform: `rotate(${rotate} ${xPos} ${yPos})` });
    t.textContent = label;
    chart.append(t);
  }
  for (const [label, xPos, anchor] of [[fmtMs(maxDur), L - 4, "end"], [fmtBytes(maxSize), W - R + 4, "start"]]) {
    const t = svg("text", { x: xPos, y: T + 8, "font-size": 11, "text-anchor": anchor, fill: "#555" });
    t.textContent = label;
    chart.append(t);
  }
  // the first and last checkpoint: ID and wall-clock trigger time (the browser's time zone)
  const when = (c) => new Date(c.trigger_timestamp).toLocaleString();
  for (const [c, anchor] of [[points[0], "start"], [points[points.length - 1], "end"]]) {
    const t = svg("text", { class: "x-label", x: x(c.id), y: H - 8, "font-size": 11, "text-anchor": anchor, fill: "#555" });
    t.textContent = `#${c.id} · ${when(c)}`;
    chart.append(t);
    if (points.length === 1) break;
  }
  const line = (series, y, color, cls) => {
    if (series.length > 1) {
      chart.append(svg("polyline", { class: cls, fill: "none", stroke: color, "stroke-width": 2,
                                     points: series.map((c) => `${x(c.id)},${y(c)}`).join(" ") }));
    }
  };
  line(done, (c) => ySize(c.state_size), "#2e7d32", "size-line");
  line(done, (c) => yDur(c.end_to_end_duration), "#1565c0", "duration-line");
  for (const c of points) {
    const failed = c.status === "FAILED";
    if (c.status === "IN_PROGRESS") continue;
    const dot = svg("circle", { class: failed ? "point failed" : "point", "data-checkpoint-id": c.id,
                                cx: x(c.id), cy: yDur(c.end_to_end_duration || 0), r: failed ? 5 : 3.5,
                                fill: failed ? "#c62828" : "#1565c0" });
    const title = svg("title");
    title.textContent = failed
      ? `#${c.id} failed after ${fmtMs(c.end_to_end_duration)}: ${c.failure_reason || ""} ${c.failure_message || ""}`.trim()
      : `#${c.id} ${c.is_savepoint ? "savepoint" : "checkpoint"}: ${fmtMs(c.end_to_end_duration)}, ${fmtBytes(c.state_size)}`;
    dot.append(title);
    chart.append(dot);
  }
}

function renderSummary(summary) {
  const body = document.querySelector("#summary tbody");
  body.replaceChildren();
  for (const [label, key, fmt] of [["end-to-end duration", "end_to_end_duration", fmtMs], ["state size", "state_size", fmtBytes],
                                   ["end-to-end lag (trigger → in the lake)", "end_to_end_lag", fmtMs]]) {
    const s = summary[key];
    if (!s) continue;
    const tr = el("tr", { "data-summary": key });
    tr.append(el("th", {}, label));
    for (const f of ["min", "avg", "p50", "p90", "p95", "p99", "p999", "max"]) tr.append(el("td", { class: "num" }, fmt(s[f])));
    body.append(tr);
  }
}

function renderHistory(history) {
  const body = document.querySelector("#history tbody");
  body.replaceChildren();
  for (const c of history) {
    const tr = el("tr", { class: c.status, "data-checkpoint-id": c.id, "data-status": c.status });
    tr.append(
      el("td", { class: "id" }, "#" + c.id),
      el("td", { class: "status" }, c.status),
      el("td", {}, c.checkpoint_type),
      el("td", {}, fmtTime(c.trigger_timestamp)),
      el("td", { class: "duration num" }, c.status === "IN_PROGRESS" ? "…" : fmtMs(c.end_to_end_duration)),
      el("td", { class: "size num" }, c.status === "COMPLETED" ? fmtBytes(c.state_size) : "–"),
      el("td", { class: "num" }, `${c.num_acknowledged_subtasks}/${c.num_subtasks}`),
      el("td", { class: "detail" }, c.status === "FAILED"
        ? `${c.failure_reason || ""}${c.failure_message && c.failure_message !== c.failure_reason ? ": " + c.failure_message : ""}`
        : c.external_path || ""),
    );
    body.append(tr);
  }
}

function completedRows(c) {
  return c && [["ID", "#" + c.id], ["duration", fmtMs(c.end_to_end_duration)], ["size", fmtBytes(c.state_size)],
               ["completed", fmtTime(c.latest_ack_timestamp)], ["path", c.external_path || "–"]];
}

let busy = false;

async function refresh() {
  if (busy) return;  // a slow answer: skip this tick rather than pile requests up
  busy = true;
  try { await draw(); } finally { busy = false; }
}

async function draw() {
  const health = document.getElementById("health");
  try {
    const h = await fetch("/ui/status", { cache: "no-store" }).then((r) => r.json());
    health.textContent = h.status === "UP" ? `reading ${h.topic}` : h.error || h.status;
    health.className = "badge " + (h.status === "UP" ? "up" : "down");
    const { jobs } = await getJson("/jobs");
    renderJobs(jobs);
    const section = document.getElementById("job");
    if (!selectedJob) { section.hidden = true; return; }
    const stats = await getJson("/jobs/" + encodeURIComponent(selectedJob) + "/checkpoints");
    const status = (jobs.find((j) => j.id === selectedJob) || {}).status || "";
    const badge = document.getElementById("job-status");
    badge.textContent = status;
    badge.className = "badge " + (status === "RUNNING" ? "up" : status === "FAILED" ? "down" : "");
    section.hidden = false;
    document.getElementById("job-id").textContent = selectedJob;
    renderCounts(stats.counts);
    renderLatest("latest-completed", completedRows(stats.latest.completed));
    renderLatest("latest-savepoint", completedRows(stats.latest.savepoint));
    const f = stats.latest.failed;
    renderLatest("latest-failed", f && [["ID", "#" + f.id], ["reason", f.failure_reason || "–"],
                                        ["message", f.failure_message || "–"], ["at", fmtTime(f.failure_timestamp)]]);
    const r = stats.latest.restored;
    renderLatest("latest-restored", r && [["ID", "#" + r.id], ["at", fmtTime(r.restore_timestamp)],
                                          ["path", r.external_path || "–"]]);
    renderChart(stats.history);
    // Chandy's own: trigger -> readable in the lake (LAKE_COMMITTED), once the job landed something
    const lake = await getJson("/jobs/" + encodeURIComponent(selectedJob) + "/lake-commits");
    renderSummary(lake.history.length ? { ...stats.summary, end_to_end_lag: lake.summary.end_to_end_lag } : stats.summary);
    renderHistory(stats.history);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    health.textContent = String(err.message || err);
    health.className = "badge down";
  }
}

window.addEventListener("hashchange", () => {
  selectedJob = decodeURIComponent((location.hash.match(/job=([^&]+)/) || [])[1] || "");
  refresh();
});
refresh();
setInterval(refresh, POLL_MS);
