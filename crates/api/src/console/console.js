// The Sprout console: reads the worker's API every 5 s (with the session cookie, GET only)
// and draws its panels. Plain DOM and SVG; nothing is fetched from anywhere but this worker.
"use strict";

(() => {
  const REFRESH_MS = 5000;
  const LOG_LIMIT = 200;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const REQUEST_ID = /^[0-9a-f]{16}$/;

  const state = {
    names: [],            // GET /registry
    meta: new Map(),      // name -> GET /registry/<name>
    metaRound: 0,
    stats: null,          // GET /stats
    history: null,        // GET /stats/history
    logs: null,           // GET /logs/<selected>
    logsKey: "",
    selected: null,
    search: null,         // {id, entries} while showing a request's entries
    errors: new Map(),    // what failed in the last refresh, by source
    refreshes: 0,
    busy: false,
    session: null,        // GET /console/session: a tenant's console shows no worker-wide figures
  };

  const $ = (id) => document.getElementById(id);

  /** An HTML element: `attrs` are attributes, except `text` and `class`. */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null) continue;
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function svgEl(tag, attrs = {}, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // ------------------------------------------------------------------ formatting

  const number = (n) => (typeof n === "number" ? n.toLocaleString("en-US", { maximumFractionDigits: 1 }) : "–");
  const mib = (n) => (typeof n === "number" ? `${n.toFixed(n < 10 ? 1 : 0)} MiB` : "–");
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  const clock = (d) => `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const hhmm = (d) => `${pad(d.getHours())}:${pad(d.getMinutes())}`;

  function dateTime(seconds) {
    if (typeof seconds !== "number" || !seconds) return "–";
    const d = new Date(seconds * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(d)}`;
  }

  function duration(seconds) {
    if (typeof seconds !== "number") return "–";
    let s = Math.floor(seconds);
    const d = Math.floor(s / 86400); s %= 86400;
    const h = Math.floor(s / 3600); s %= 3600;
    const m = Math.floor(s / 60); s %= 60;
    if (d) return `${d}d ${h}h ${pad(m)}m`;
    if (h) return `${h}h ${pad(m)}m`;
    if (m) return `${m}m ${pad(s)}s`;
    return `${s}s`;
  }

  function logTime(entry) {
    let d = typeof entry.ts === "number" ? new Date(entry.ts * 1000) : new Date(entry.time);
    if (Number.isNaN(d.getTime())) return String(entry.time || "?").padEnd(12);
    return `${clock(d)}.${pad(d.getMilliseconds(), 3)}`;
  }

  // ------------------------------------------------------------------ the API

  class ApiError extends Error {
    constructor(path, status, body, detail) {
      const code = body && body.error ? `${body.error}: ${body.message || ""}` : detail;
      const request = body && body.request_id ? ` (request ${body.request_id})` : "";
      super(`GET ${path}: ${status ? status : "no answer"} ${code}${request}`.trim());
      this.status = status;
    }
  }

  async function api(path) {
    let response;
    try {
      response = await fetch(path, { headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" });
    } catch (e) {
      throw new ApiError(path, 0, null, `the worker did not answer (${e.message})`);
    }
    const text = await response.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (e) {
      body = null;
    }
    if (!response.ok) throw new ApiError(path, response.status, body, text.slice(0, 200));
    if (body === null) throw new ApiError(path, response.status, null, `not JSON: ${text.slice(0, 200)}`);
    return body;
  }

  /** Run `task`, remembering its failure under `source` (cleared when it succeeds). */
  async function tracked(source, task) {
    try {
      const result = await task();
      state.errors.delete(source);
      return result;
    } catch (e) {
      state.errors.set(source, e);
      return undefined;
    }
  }

  function renderErrors() {
    const banner = $("error-banner");
    const list = $("error-list");
    list.replaceChildren(...[...state.errors.values()].map((e) => el("li", { text: e.message || String(e) })));
    banner.hidden = state.errors.size === 0;
    $("error-login").hidden = ![...state.errors.values()].some((e) => e.status === 401 || e.status === 403);
  }

  // ------------------------------------------------------------------ refresh

  async function refreshStats() {
    if (!state.session) {
      state.session = await api("/console/session");
      if (state.session.principal === "tenant") {
        $("principal").textContent = `· tenant ${state.session.tenant}`;
        $("worker").hidden = true;
      }
    }
    // A tenant's key reads its own lambdas only: the worker's figures are the operator's.
    if (state.session.principal !== "tenant") state.stats = await api("/stats");
  }

  async function refreshRegistry() {
    const names = await api("/registry");
    state.names = Array.isArray(names) ? names.slice().sort() : [];
    for (const name of [...state.meta.keys()]) if (!state.names.includes(name)) state.meta.delete(name);
    // Every lambda's metadata while there are few; beyond that the new ones and 20 more each time.
    const stale = state.names.filter((n) => !state.meta.has(n));
    const known = state.names.filter((n) => state.meta.has(n));
    let again = known;
    if (known.length > 40) {
      const from = (state.metaRound * 20) % known.length;
      again = known.slice(from, from + 20);
      state.metaRound += 1;
    }
    await Promise.all([...stale, ...again].map((name) =>
      tracked(`registry/${name}`, async () => {
        state.meta.set(name, await api(`/registry/${encodeURIComponent(name)}`));
      })));
  }

  async function refreshHistory() {
    state.history = await api("/stats/history");
  }

  async function refreshLogs() {
    const name = state.selected;
    if (!name) {
      state.logs = null;
      state.errors.delete("logs");
      return;
    }
    await tracked("logs", async () => {
      const logs = await api(`/logs/${encodeURIComponent(name)}?limit=${LOG_LIMIT}`);
      if (name === state.selected) state.logs = logs;
    });
  }

  async function refresh() {
    if (state.busy) return;
    state.busy = true;
    try {
      await Promise.all([
        tracked("stats", refreshStats),
        tracked("registry", refreshRegistry),
        tracked("history", refreshHistory),
      ]);
      chooseLambda();
      if ($("logs-auto").checked && !state.search) await refreshLogs();
      render();
      state.refreshes += 1;
      document.body.dataset.refreshes = String(state.refreshes);
      $("worker-updated").textContent = clock(new Date());
    } catch (e) {
      state.errors.set("console", e); // a bug of the page itself: shown, and in the browser's console
      console.error(e);
    } finally {
      renderErrors();
      state.busy = false;
    }
  }

  function schedule() {
    refresh().finally(() => setTimeout(schedule, REFRESH_MS));
  }

  // ------------------------------------------------------------------ the selected lambda

  function lambdaNames() {
    const names = new Set(state.names);
    for (const name of Object.keys((state.history && state.history.lambdas) || {})) names.add(name);
    for (const name of Object.keys(perLambda())) names.add(name);
    return [...names].sort();
  }

  function perLambda() {
    return (state.stats && state.stats.lambdas && state.stats.lambdas.per_lambda) || {};
  }

  function chooseLambda() {
    const names = lambdaNames();
    if (state.selected && names.includes(state.selected)) return;
    const wanted = decodeURIComponent((location.hash.match(/lambda=([^&]*)/) || [])[1] || "");
    state.selected = names.includes(wanted) ? wanted : names[0] || null;
  }

  function select(name) {
    if (!name || name === state.selected) return;
    state.selected = name;
    state.logs = null;
    state.logsKey = "";
    history.replaceState(null, "", `#lambda=${encodeURIComponent(name)}`);
    clearSearch(false);
    render();
    refreshLogs().then(() => { renderLogs(); renderErrors(); });
  }

  // ------------------------------------------------------------------ panels

  function render() {
    renderWorker();
    renderLambdas();
    renderSelector();
    renderHistory();
    renderSandboxes();
    renderMemory();
    renderZygotes();
    renderLogs();
  }

  function renderWorker() {
    const s = state.stats;
    if (!s) return;
    $("worker-backend").textContent = s.backend || "–";
    $("worker-uptime").textContent = duration(s.uptime_s);
    $("worker-invocations").textContent = number(s.invocations);
    $("worker-starts").textContent = `${number(s.cold_starts)} / ${number(s.warm_starts)}`;
  }

  function renderLambdas() {
    const figures = perLambda();
    const names = [...new Set([...state.names, ...Object.keys(figures)])].sort();
    const rows = names.map((name) => {
      const meta = state.meta.get(name) || {};
      const f = figures[name] || {};
      const keepAlive = f.keep_alive && typeof f.keep_alive.keep_alive_s === "number"
        ? `${duration(f.keep_alive.keep_alive_s)} (${f.keep_alive.policy})` : "–";
      const deleted = !state.names.includes(name);
      const row = el("tr", { "data-lambda": name, class: name === state.selected ? "selected" : "" },
        el("td", { class: "name", "data-col": "name", text: deleted ? `${name} (deleted)` : name }),
        el("td", { "data-col": "version", text: meta.version ?? "–" }),
        el("td", { "data-col": "uploaded", text: dateTime(meta.uploaded) }),
        el("td", { class: "num", "data-col": "sandboxes", text: number(f.sandboxes ?? 0) }),
        el("td", { class: "num", "data-col": "idle", text: number(f.idle ?? 0) }),
        el("td", { class: "num", "data-col": "queued", text: number(f.queued ?? 0) }),
        el("td", { class: "num", "data-col": "served", text: number(f.served ?? 0) }),
        el("td", { "data-col": "keep-alive", text: keepAlive }));
      row.addEventListener("click", () => select(name));
      return row;
    });
    $("lambdas-body").replaceChildren(...rows);
    $("lambdas-empty").hidden = rows.length > 0;
  }

  function renderSelector() {
    const select = $("lambda-select");
    const names = lambdaNames();
    const current = [...select.options].map((o) => o.value);
    if (current.join("\n") !== names.join("\n")) {
      select.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
    }
    if (state.selected) select.value = state.selected;
  }

  function renderHistory() {
    const h = state.history;
    const charts = ["chart-invocations", "chart-errors", "chart-cold-starts", "chart-latency"];
    if (!h || !state.selected) {
      for (const id of charts) drawChart($(id), null);
      $("history-summary").textContent = h ? "No lambdas yet." : "No history (GET /stats/history has not answered).";
      return;
    }
    const buckets = h.buckets || 61;
    const zeros = Array(buckets).fill(0);
    const nulls = Array(buckets).fill(null);
    const l = (h.lambdas && h.lambdas[state.selected]) || {};
    const axis = { start: h.start, bucket: h.bucket_s || 60, count: buckets };
    drawChart($("chart-invocations"), { ...axis, unit: "per minute", series: [{ name: "invocations", values: l.invocations || zeros, kind: "bars" }] });
    drawChart($("chart-errors"), { ...axis, unit: "per minute", series: [{ name: "errors", values: l.errors || zeros, kind: "bars" }] });
    drawChart($("chart-cold-starts"), { ...axis, unit: "per minute", series: [{ name: "cold-starts", values: l.cold_starts || zeros, kind: "bars" }] });
    drawChart($("chart-latency"), {
      ...axis, unit: "ms",
      series: [{ name: "p50", values: l.p50_ms || nulls, kind: "line" }, { name: "p99", values: l.p99_ms || nulls, kind: "line" }],
    });
    const sum = (values) => (values || []).reduce((a, b) => a + (b || 0), 0);
    $("history-summary").textContent =
      `${state.selected}: ${number(sum(l.invocations))} invocations, ${number(sum(l.errors))} errors, ` +
      `${number(sum(l.cold_starts))} cold starts in the last hour (one bucket a minute, the last one still filling).`;
  }

  /** A round top for an axis: 1, 2 or 5 times a power of ten, at least `value`. */
  function niceMax(value, integer) {
    if (!(value > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(value));
    for (const step of [1, 2, 5, 10]) if (step * power >= value) return Math.max(step * power, integer ? 1 : 0);
    return 10 * power;
  }

  function tickLabel(value, max) {
    if (max >= 100 || Number.isInteger(value)) return String(Math.round(value));
    return value.toFixed(max >= 10 ? 0 : max >= 1 ? 1 : 2);
  }

  /** One small chart: bars per bucket, or lines with gaps where a bucket has no value. */
  function drawChart(svg, spec) {
    const W = 320, H = 160, left = 40, right = 16, top = 16, bottom = 32;
    const plotW = W - left - right, plotH = H - top - bottom;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.replaceChildren();
    if (!spec) {
      svg.append(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "nodata" }, "no data"));
      svg.dataset.total = "0";
      svg.dataset.points = "0";
      return;
    }
    const { start, bucket, count, series, unit } = spec;
    const bars = series[0].kind === "bars";
    const values = series.flatMap((s) => s.values.filter((v) => typeof v === "number"));
    const max = niceMax(Math.max(0, ...values), bars);
    const x = (i) => left + (i * plotW) / count;
    const y = (v) => top + plotH - (v / max) * plotH;

    // Grid, y ticks and the y axis's label.
    for (const fraction of [0, 0.5, 1]) {
      const v = max * fraction;
      if (bars && !Number.isInteger(v)) continue;
      svg.append(svgEl("line", { x1: left, x2: W - right, y1: y(v), y2: y(v), class: fraction ? "grid" : "axis" }));
      svg.append(svgEl("text", { x: left - 4, y: y(v) + 3, "text-anchor": "end" }, tickLabel(v, max)));
    }
    svg.append(svgEl("line", { x1: left, x2: left, y1: top, y2: top + plotH, class: "axis" }));
    svg.append(svgEl("text", { x: 10, y: top + plotH / 2, "text-anchor": "middle", class: "label",
      transform: `rotate(-90 10 ${top + plotH / 2})` }, unit));

    // X ticks every 15 buckets, and the x axis's label.
    for (let i = 0; i < count; i += 15) {
      const at = x(i + 0.5);
      svg.append(svgEl("line", { x1: at, x2: at, y1: top + plotH, y2: top + plotH + 3, class: "axis" }));
      const label = typeof start === "number" ? hhmm(new Date((start + i * bucket) * 1000)) : `${i}`;
      svg.append(svgEl("text", { x: at, y: top + plotH + 13, "text-anchor": "middle" }, label));
    }
    svg.append(svgEl("text", { x: left + plotW / 2, y: H - 4, "text-anchor": "middle", class: "label" },
      `time (local), ${bucket / 60 === 1 ? "1 minute" : `${bucket} s`} per bucket`));

    let total = 0, points = 0;
    for (const s of series) {
      if (s.kind === "bars") {
        const width = Math.max(plotW / count - 1, 1);
        s.values.forEach((v, i) => {
          if (!(v > 0)) return;
          total += v; points += 1;
          const rect = svgEl("rect", { x: x(i) + 0.5, y: y(v), width, height: top + plotH - y(v), class: `bar-${s.name}` });
          rect.append(svgEl("title", {}, `${typeof start === "number" ? hhmm(new Date((start + i * bucket) * 1000)) : i}: ${v}`));
          svg.append(rect);
        });
      } else {
        let d = "", pen = false;
        s.values.forEach((v, i) => {
          if (typeof v !== "number") { pen = false; return; }
          points += 1; total += v;
          d += `${pen ? "L" : "M"}${x(i + 0.5).toFixed(1)},${y(v).toFixed(1)}`;
          pen = true;
          const dot = svgEl("circle", { cx: x(i + 0.5), cy: y(v), r: 1.8, class: `dot-${s.name}` });
          dot.append(svgEl("title", {}, `${s.name} ${typeof start === "number" ? hhmm(new Date((start + i * bucket) * 1000)) : i}: ${v.toFixed(2)} ms`));
          svg.append(dot);
        });
        if (d) svg.append(svgEl("path", { d, class: `line line-${s.name}` }));
      }
    }
    if (series.length > 1) {
      series.forEach((s, k) => {
        const kx = left + 6 + k * 44;
        svg.append(svgEl("rect", { x: kx, y: 4, width: 9, height: 9, rx: 2, class: `key-${s.name}` }));
        svg.append(svgEl("text", { x: kx + 12, y: 12, class: "label" }, s.name));
      });
    }
    if (!points) {
      svg.append(svgEl("text", { x: left + plotW / 2, y: top + plotH / 2, "text-anchor": "middle", class: "nodata" },
        bars ? "none in the last hour" : "no invocations in the last hour"));
    }
    svg.dataset.total = String(Math.round(total * 1000) / 1000);
    svg.dataset.points = String(points);
  }

  function renderSandboxes() {
    const s = state.stats;
    if (!s) return;
    const sb = s.sandboxes || {};
    const states = ["starting", "busy", "idle"];
    const sum = states.reduce((a, k) => a + (sb[k] || 0), 0);
    $("sandbox-bar").replaceChildren(...states.filter((k) => sb[k] > 0).map((k) => {
      const span = el("span", { class: k, title: `${k}: ${sb[k]}` });
      span.style.width = `${(100 * sb[k]) / sum}%`;
      return span;
    }));
    for (const k of states) {
      $(`sandboxes-${k}`).textContent = number(sb[k] ?? 0);
      $(`sandboxes-${k}`).previousElementSibling.className = `key key-${k}`;
    }
    $("sandboxes-backend").textContent = s.backend || "–";
    const hc = s.handler_cache;
    if (hc) {
      $("handler-paused").textContent = hc.pause === false ? "off" : number(hc.paused);
      $("handler-pss").textContent = `${number(hc.paused_pss_mb)} of ${mib(hc.memory_limit_mb)}`;
      $("handler-pauses").textContent = `${number(hc.pauses)} / ${number(hc.resumes)}`;
      const ev = hc.evictions || {};
      const evictions = Object.values(ev).reduce((a, b) => a + (b || 0), 0);
      $("handler-evictions").textContent = number(evictions);
      $("handler-evictions").title = Object.entries(ev).map(([k, v]) => `${k}: ${v}`).join(", ");
    } else {
      for (const id of ["handler-paused", "handler-pss", "handler-pauses", "handler-evictions"]) $(id).textContent = "–";
    }
  }

  function renderMemory() {
    const s = state.stats;
    if (!s) return;
    const b = s.lambdas && s.lambdas.memory_budget;
    const box = $("memory-budget");
    if (!b) {
      box.dataset.budget = "none";
      box.replaceChildren(el("p", { class: "empty", id: "memory-none", text: "No budget: instances.memory_budget_mb is 0 (or the back-end has none)." }));
      return;
    }
    const limit = b.limit_mb || 0;
    const used = Math.min(b.used_mb || 0, limit);
    const pending = Math.max(0, Math.min(b.pending_mb || 0, limit - used));
    const share = limit ? used / limit : 0;
    const meter = el("div", { class: "meter", id: "memory-meter", title: `${mib(b.used_mb)} used of ${mib(limit)}` });
    const usedBar = el("span", { class: `used${share > 0.95 ? " full" : share > 0.8 ? " high" : ""}` });
    usedBar.style.width = `${limit ? (100 * used) / limit : 0}%`;
    const pendingBar = el("span", { class: "pending", title: `pending ${mib(b.pending_mb)}` });
    pendingBar.style.width = `${limit ? (100 * pending) / limit : 0}%`;
    meter.append(usedBar, pendingBar);
    const figure = (label, value) => el("div", {}, el("dt", { text: label }), el("dd", { text: value }));
    box.dataset.budget = "set";
    box.dataset.used = String(b.used_mb);
    box.dataset.limit = String(limit);
    box.replaceChildren(
      el("p", { class: "summary", id: "memory-summary", text: `${mib(b.used_mb)} used of ${mib(limit)} (${Math.round(100 * share)}%)` }),
      meter,
      el("dl", { class: "figures" },
        figure("pending", mib(b.pending_mb)), figure("freeing", mib(b.freeing_mb)),
        figure("reserve", mib(b.reserve_mb)), figure("charged", mib(b.charged_mb)),
        figure("sandbox estimate", mib(b.sandbox_estimate_mb)), figure("waits", number(b.waits)),
        figure("evictions", number(b.evictions)), figure("queued instead", number(b.queued_instead))));
  }

  function renderZygotes() {
    const s = state.stats;
    if (!s) return;
    const cache = s.import_cache;
    const tree = $("zygote-tree");
    if (!cache || !cache.tree) {
      $("zygote-summary").textContent = `This back-end (${s.backend || "?"}) has no Zygotes.`;
      tree.replaceChildren();
      return;
    }
    $("zygote-summary").textContent =
      `${number(cache.zygotes)} Zygotes; package Zygotes ${mib(cache.package_zygotes_pss_mb)} PSS of ${mib(cache.memory_limit_mb)}; ` +
      `hits ${number(cache.import_cache_hits)}, misses ${number(cache.import_cache_misses)}, fallbacks ${number(cache.import_cache_fallbacks)}, ` +
      `evictions ${number(cache.zygote_evictions)}, deaths ${number(cache.zygote_deaths)}`;
    const node = (n, root) => {
      const adds = Array.isArray(n.adds) ? n.adds : [];
      const label = el("span", { class: "node", "data-zygote": n.id ?? "" },
        `#${n.id ?? "?"} ${root ? "root (no packages)" : `+ ${adds.join(", ")}`}`,
        el("span", { class: "meta", text:
          `${number(n.modules)} modules, ${mib(n.pss_mb)} PSS, ${mib(n.benefit_mb)} on disk, ` +
          `${number(n.uses)} uses (${number(n.recent_uses)} recent), ${number(n.handlers)} handlers` }));
      if (n.pinned) label.append(el("span", { class: "flag", text: "static" }));
      if (n.retired) label.append(el("span", { class: "flag", text: "retired" }));
      const item = el("li", {}, label);
      const children = Array.isArray(n.children) ? n.children : [];
      if (children.length) item.append(el("ul", {}, ...children.map((c) => node(c, false))));
      return item;
    };
    tree.replaceChildren(el("ul", {}, node(cache.tree, true)));
  }

  // ------------------------------------------------------------------ logs

  function logLine(entry, withLambda) {
    const id = entry.request_id || "";
    const request = el("span", { class: id ? "request" : "request none", title: id || "outside any request",
      text: (id ? id.slice(0, 8) : "-").padEnd(8) });
    if (id) request.addEventListener("click", () => search(id));
    const line = el("div", { class: `log-line type-${entry.type || "out"}`, "data-request": id, "data-seq": entry.seq ?? "",
      "data-lambda": entry.lambda || "" },
      el("span", { class: "time", text: logTime(entry) }), " ", request, " ");
    if (withLambda) line.append(el("span", { class: "lambda", text: `${entry.lambda || "?"} ` }));
    line.append(el("span", { class: "message", text: entry.message ?? "" }));
    return line;
  }

  function showLines(entries, withLambda, emptyText) {
    const box = $("logs");
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    box.replaceChildren(...(entries.length ? entries.map((e) => logLine(e, withLambda)) : [el("div", { class: "empty", text: emptyText })]));
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function renderLogs() {
    if (state.search) return; // the search's results stay until cleared
    const name = state.selected;
    $("logs-title").textContent = name ? `of ${name}` : "";
    const logs = state.logs;
    if (!name || !logs) {
      $("logs-summary").textContent = name ? "" : "No lambda selected.";
      if (state.logsKey !== "none") showLines([], false, name ? "(loading)" : "(no lambda)");
      state.logsKey = "none";
      return;
    }
    const entries = Array.isArray(logs.entries) ? logs.entries : [];
    const last = entries.length ? entries[entries.length - 1].seq : "";
    const key = `${name}|${entries.length}|${last}`;
    const dropped = logs.dropped || {};
    $("logs-summary").textContent = `${entries.length} entries (the newest ${LOG_LIMIT} at most)` +
      (dropped.lines ? `; ${number(dropped.lines)} lines (${number(dropped.bytes)} bytes) dropped since the worker started` : "") +
      ($("logs-auto").checked ? "" : "; auto-refresh off");
    if (key === state.logsKey) return; // unchanged: keep the reader's scroll and selection
    state.logsKey = key;
    showLines(entries, false, "(no entries)");
  }

  async function search(id) {
    id = id.trim().toLowerCase();
    $("request-search").value = id;
    if (!REQUEST_ID.test(id)) {
      // A prefix, as the lines show it: the full id of a loaded line that starts with it.
      const found = /^[0-9a-f]{4,15}$/.test(id) && state.logs && (state.logs.entries || [])
        .map((e) => e.request_id).find((r) => r && r.startsWith(id));
      if (!found) {
        $("logs-summary").textContent = "A request id is 16 hex digits (or the start of one shown in the lines above).";
        return;
      }
      id = found;
      $("request-search").value = id;
    }
    const result = await tracked("search", () => api(`/logs?request=${encodeURIComponent(id)}`));
    renderErrors();
    if (!result) return;
    const entries = Array.isArray(result.entries) ? result.entries : [];
    state.search = { id, entries };
    $("logs-title").textContent = `of request ${id}`;
    $("logs-summary").textContent = entries.length
      ? `${entries.length} entries of request ${id}, from ${[...new Set(entries.map((e) => e.lambda))].join(", ")}`
      : `No entries of request ${id} (none kept, or no such request).`;
    $("logs").dataset.search = id;
    $("request-search-clear").hidden = false;
    showLines(entries, true, "(no entries)");
  }

  function clearSearch(rerender = true) {
    state.search = null;
    state.errors.delete("search");
    delete $("logs").dataset.search;
    $("request-search-clear").hidden = true;
    state.logsKey = "";
    if (rerender) {
      renderLogs();
      renderErrors();
    }
  }

  // ------------------------------------------------------------------ start

  function start() {
    $("lambda-select").addEventListener("change", (e) => select(e.target.value));
    $("request-search-form").addEventListener("submit", (e) => {
      e.preventDefault();
      search($("request-search").value);
    });
    $("request-search-clear").addEventListener("click", () => clearSearch());
    $("logs-auto").addEventListener("change", () => {
      if ($("logs-auto").checked && !state.search) refreshLogs().then(() => { renderLogs(); renderErrors(); });
      else renderLogs();
    });
    schedule();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
