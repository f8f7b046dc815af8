// memq audit dashboard: polls the JSON API and draws one card of uPlot charts per topic.
"use strict";

const REFRESH_MS = 2000;
const COLORS = ["#1565c0", "#2e7d32", "#6a1b9a", "#00838f", "#ef6c00", "#5d4037"];
// window.memqCharts[topic] = {rate, latency, lag} uPlot instances (read by the browser test).
window.memqCharts = {};
const cards = {};   // topic -> {el, sig, charts}

function fmt(v, digits = 0) {
  return v === null || v === undefined ? "–" : Number(v).toFixed(digits);
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function renderSummary(rows) {
  const body = document.querySelector("#summary tbody");
  body.replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.topic = r.topic;
    tr.dataset.group = r.group;
    const st = document.createElement("td");
    const badge = document.createElement("span");
    badge.className = "status " + r.status;
    badge.textContent = r.status;
    st.append(badge);
    tr.append(st, cell(r.topic, "name"), cell(r.group || "(none)", "name"),
      cell(r.produced), cell(r.consumed), cell(r.lost, "lost" + (r.lost ? " bad" : "")),
      cell(r.duplicates, "duplicates" + (r.duplicates ? " bad" : "")),
      cell(r.mismatches, "mismatches" + (r.mismatches ? " bad" : "")),
      cell(r.lag_messages), cell(fmt(r.lag_s, 1)), cell(fmt(r.p50_ms)), cell(fmt(r.p99_ms)),
      cell(r.p50_ms === null ? "–" : r.max_ms));
    return tr;
  }));
}

const SPAN_S = 15 * 60;                 // the API is asked for the last 15 minutes
const MIN_WINDOWS = 6;                  // the x axis spans at least this many windows
const fromZero = (u, min, max) => [0, max > 0 ? max * 1.1 : 1];
const POINT_SIZE = 7;                   // one window of data is still a visible dot

/** The x range fitted to the data: from one window before the first point to now,
 *  at least MIN_WINDOWS windows wide, at most SPAN_S. */
function fitX(t, size_s) {
  const now = Date.now() / 1000;
  const hi = Math.max(now, t.length ? t[t.length - 1] + size_s : now);
  const first = t.length ? t[0] - size_s : hi;
  return [Math.max(hi - SPAN_S, Math.min(first, hi - MIN_WINDOWS * size_s)), hi];
}

/** Per series, the index of its latest non-null value (the x series takes the last index). */
function latestIdxs(data) {
  const last = data[0].length - 1;
  return data.map((s, i) => {
    if (i === 0) return last;
    let j = last;
    while (j >= 0 && (s[j] === null || s[j] === undefined)) j--;
    return j >= 0 ? j : null;
  });
}

/** With no cursor on the chart the legend shows each series' latest value. */
function legendLatest(u) {
  if (u.cursor.idx == null && u.data && u.data[0].length) u.setLegend({ idxs: latestIdxs(u.data) }, false);
}

function chartOpts(title, series, axes, card) {
  const scales = { x: { time: true, range: () => card.xRange } };
  for (const s of series) {
    scales[s.scale || "y"] = { range: fromZero };
    s.points = { show: !s.paths, size: POINT_SIZE, fill: s.stroke };
    s.value = (u, v) => fmt(v, s.digits || 0);
  }
  const x = { label: "window", value: "{h}:{mm}:{ss}{aa}" };
  return { title, width: 460, height: 220, series: [x, ...series], axes: [{}, ...axes], scales, legend: { live: true }, hooks: { setLegend: [legendLatest] } };
}

function buildCard(topic, groups) {
  const el = document.createElement("div");
  el.className = "topic";
  el.dataset.topic = topic;
  const h = document.createElement("h2");
  h.textContent = topic;
  const row = document.createElement("div");
  row.className = "charts";
  el.append(h, row);
  const card = { el, h, xRange: [0, 1] };
  const rateSeries = [{ label: "produced/s", stroke: "#333", width: 2, scale: "rate", digits: 1 }];
  const latSeries = [];
  const lagSeries = [];
  groups.forEach((g, i) => {
    const c = COLORS[i % COLORS.length];
    rateSeries.push({ label: `${g} consumed/s`, stroke: c, scale: "rate", digits: 1 });
    rateSeries.push({ label: `${g} lost`, stroke: "#c62828", fill: "rgba(198,40,40,0.15)",
      scale: "lost", paths: uPlot.paths.bars({ size: [0.6, 40] }) });
    latSeries.push({ label: `${g} p50 ms`, stroke: c });
    latSeries.push({ label: `${g} p99 ms`, stroke: c, dash: [6, 4] });
    latSeries.push({ label: `${g} max ms`, stroke: c, dash: [2, 3], width: 1 });
    lagSeries.push({ label: `${g} lag msgs`, stroke: c, scale: "msgs" });
    lagSeries.push({ label: `${g} lag s`, stroke: c, dash: [6, 4], scale: "s", digits: 1 });
  });
  const rate = new uPlot(chartOpts("produced vs consumed (msg/s), lost (msgs)", rateSeries,
    [{ scale: "rate", label: "msg/s" }, { scale: "lost", side: 1, label: "lost", stroke: "#c62828", grid: { show: false } }], card),
    [[], ...rateSeries.map(() => [])], row);
  const latency = new uPlot(chartOpts("end-to-end latency (ms)", latSeries, [{ label: "ms" }], card),
    [[], ...latSeries.map(() => [])], row);
  const lag = new uPlot(chartOpts("consumer lag", lagSeries,
    [{ scale: "msgs", label: "msgs" }, { scale: "s", side: 1, label: "s", grid: { show: false } }], card),
    [[], ...lagSeries.map(() => [])], row);
  document.getElementById("topics").append(el);
  card.charts = { rate, latency, lag };
  return card;
}

function updateCard(card, s) {
  const gs = Object.keys(s.groups).sort();
  card.xRange = fitX(s.t, s.size_s);
  const rate = [s.t, s.produced_rate];
  const lat = [s.t];
  const lag = [s.t];
  for (const g of gs) {
    const d = s.groups[g];
    rate.push(d.consumed_rate, d.lost);
    lat.push(d.p50_ms, d.p99_ms, d.max_ms);
    lag.push(d.lag_messages, d.lag_s);
  }
  card.charts.rate.setData(rate);
  card.charts.latency.setData(lat);
  card.charts.lag.setData(lag);
  for (const u of Object.values(card.charts)) legendLatest(u);
}

async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

async function refresh() {
  try {
    const size = document.getElementById("size").value;
    const sum = await getJSON("/api/summary");
    document.getElementById("cluster").textContent = sum.cluster;
    renderSummary(sum.rows);
    const topics = [...new Set(sum.rows.map((r) => r.topic))];   // worst first
    for (const topic of topics) {
      const s = await getJSON(`/api/series?topic=${encodeURIComponent(topic)}&size=${size}&minutes=15`);
      const groups = Object.keys(s.groups).sort();
      const sig = groups.join("\u0000");
      let card = cards[topic];
      if (!card || card.sig !== sig) {
        if (card) card.el.remove();
        card = cards[topic] = buildCard(topic, groups);
        card.sig = sig;
        window.memqCharts[topic] = card.charts;
      }
      const worst = sum.rows.find((r) => r.topic === topic);
      card.h.textContent = `${topic} — ${worst.status}`;
      updateCard(card, s);
      document.getElementById("topics").append(card.el);     // keep worst-first order
    }
    document.getElementById("updated").textContent = new Date().toLocaleTimeString();
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = String(e);
  }
}

// The cost panel: /api/cost (the brokers' counters priced as `memq cost` does), less often.
const COST_REFRESH_MS = 10000;

// A compacted topic's S3 storage saved per month, its kept vs uncompacted MiB on hover; "" for a plain topic.
function compactionCell(c) {
  if (!c) return cell("");
  const td = cell(fmt(c.saving_usd_month, 2));
  td.title = `keeps ${fmt(c.kept_bytes / 1048576, 1)} MiB (parts ${fmt(c.parts_bytes / 1048576, 1)} + tail ` +
    `${fmt(c.tail_bytes / 1048576, 1)}) vs ${fmt(c.uncompacted_bytes / 1048576, 1)} MiB without compaction`;
  return td;
}

// A rate in MiB/s: two significant digits below 1; "never" (null) or "any" (0) for a break-even.
function mibs(v) {
  if (v === null) return "never";
  if (v === 0) return "any";
  return v < 1 ? Number(v).toPrecision(2) : Number(v).toFixed(2);
}

// The topic's break-even against its rate now, and below it the changes that would cut its cost.
function breakEvenCells(b) {
  const be = cell(mibs(b.break_even_mib_s), b.above ? "above" : "below");
  be.title = `steady at the rate now: memq $${fmt(b.memq_usd_month, 2)} vs Kafka $${fmt(b.kafka_usd_month, 2)} ` +
    `a month (${b.method})`;
  const ideas = cell("", "suggestions");
  for (const s of b.suggestions) {
    const div = document.createElement("div");
    div.className = s.cheaper ? "cheaper" : "dearer";
    div.textContent = `${s.setting}: $${fmt(s.memq_usd_month, 2)}`;
    div.title = s.note;
    ideas.append(div);
  }
  return [cell(mibs(b.now_mib_s)), be, ideas];
}

async function refreshCost() {
  const res = await fetch("/api/cost");
  const body = await res.json();
  document.getElementById("cost-error").textContent = body.error || "";
  if (body.error) return;
  document.getElementById("cost-prices").textContent = body.prices;
  document.querySelector("#cost tbody").replaceChildren(...Object.entries(body.topics).map(([topic, t]) => {
    const tr = document.createElement("tr");
    tr.dataset.topic = topic;
    const r = t.counts.requests;
    tr.append(cell(topic, "name"), cell(fmt(t.counts.bytes_in / 1048576, 1)), cell(fmt(t.counts.objects)),
      cell(fmt(r.put)), cell(fmt(r.get)), cell(fmt(r.list)), cell(fmt(r.delete)),
      cell(fmt(t.memq_usd_month, 2)), cell(fmt(t.kafka_usd_month, 2)), cell(fmt(100 * t.saving) + "%"),
      compactionCell(t.compaction), ...breakEvenCells(t.break_even));
    return tr;
  }));
}

// The schema panel: /api/schemas (the registry's latest schema per topic, the brokers' counts of
// records its checks refused, dead-lettered or warned of), as often as the cost panel.
function schemaCell(sc) {
  if (!sc) return cell("–", "schema");
  const td = cell(`${sc.type} v${sc.version} (id ${sc.id})`, "schema");
  td.title = sc.subject;
  return td;
}

async function refreshSchemas() {
  const res = await fetch("/api/schemas");
  const body = await res.json();
  document.getElementById("schemas-error").textContent = body.error || "";
  if (body.error) return;
  document.querySelector("#schemas tbody").replaceChildren(...Object.entries(body.topics).map(([topic, t]) => {
    const tr = document.createElement("tr");
    tr.dataset.topic = topic;
    const n = t.invalid;
    const checks = Object.entries(t.checks).sort().map(([part, action]) => `${part}: ${action}`).join(", ");
    tr.append(cell(topic, "name"), cell(checks || "off", "schema"), schemaCell(t.value), schemaCell(t.key),
      cell(fmt(n.reject), n.reject > 0 ? "refused bad" : "refused"),
      cell(fmt(n.dlq), n.dlq > 0 ? "dlq bad" : "dlq"), cell(fmt(n.warn), "warned"));
    return tr;
  }));
}

// The tables panel: /api/tables (each table sync's last report, its lag against its topic now).
async function refreshTables() {
  const res = await fetch("/api/tables");
  const body = await res.json();
  document.getElementById("tables-error").textContent = body.error || "";
  if (body.error) return;
  const now = Date.now();
  document.querySelector("#tables tbody").replaceChildren(...body.tables.map((t) => {
    const tr = document.createElement("tr");
    const ago = t.last_commit_ms === null ? "never" : `${fmt((now - t.last_commit_ms) / 1000)} s ago`;
    const lag = t.lag === null ? cell("?", "lag") : cell(`${fmt(t.lag)} ${t.lag_unit}`, t.lag > 0 ? "lag bad" : "lag");
    if (t.error) lag.title = t.error;
    tr.append(cell(t.table, "name"), cell(t.topic, "name"), cell(fmt(t.rows)),
      cell(t.schema_version === null ? "–" : `v${t.schema_version}`), cell(ago),
      cell(fmt(t.dead_letters), t.dead_letters > 0 ? "dlq bad" : "dlq"), lag,
      cell(t.lag_s === null ? "?" : fmt(t.lag_s, 1)));
    return tr;
  }));
}

document.getElementById("size").addEventListener("change", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
refreshCost().catch((e) => { document.getElementById("cost-error").textContent = String(e); });
setInterval(() => refreshCost().catch((e) => {
  document.getElementById("cost-error").textContent = String(e);
}), COST_REFRESH_MS);
refreshSchemas().catch((e) => { document.getElementById("schemas-error").textContent = String(e); });
refreshTables().catch((e) => { document.getElementById("tables-error").textContent = String(e); });
setInterval(() => refreshTables().catch((e) => {
  document.getElementById("tables-error").textContent = String(e);
}), COST_REFRESH_MS);
setInterval(() => refreshSchemas().catch((e) => {
  document.getElementById("schemas-error").textContent = String(e);
}), COST_REFRESH_MS);
