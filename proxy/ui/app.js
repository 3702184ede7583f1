// Velo's dashboard: polls /ui/state (a snapshot of the collectors /metrics reads) and redraws. No dependencies.
"use strict";
const POLL_MS = 2000;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells) {
  const tr = el("tr");
  for (const cell of cells) tr.append(cell instanceof Node ? cell : el("td", cell));
  return tr;
}

function fill(tableId, rows, empty) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...(rows.length ? rows : [row([el("td", empty, "muted")])]));
}

function fmt(x, digits = 2) {  // rounded, without trailing zeros after the point (a whole 10 stays "10")
  return x === null || x === undefined ? "–" : String(Number(Number(x).toFixed(digits)));
}

function counted(n, noun) {  // "1 start", "2 starts": counts as adapters/wording.py words them
  return `${fmt(n, 0)} ${n === 1 ? noun : noun + "s"}`;
}

function health(b) {
  return el("td", b.healthy ? "● up" : "● down", b.healthy ? "up" : "down");
}

function servers(b) {
  const m = b.managed;
  if (m) {
    return `llama-server ${m.state} · ${fmt(m.waiting, 0)} waiting · ${counted(m.starts, "start")}, ` +
      `${counted(m.swaps, "swap")}, ${fmt(m.wait_s, 1)} s waited`;
  }
  return b.replicas.map(r => `${r.name} ${r.up ? "up" : "down"} (${r.outstanding})`).join(", ") || "–";
}

function drawBackends(backends) {
  fill("backends", backends.map(b => {
    const tr = row([b.name, b.kind, health(b), fmt(b.queue, 0), `${fmt(b.in_flight, 0)} / ${fmt(b.slots, 0)}`,
                    b.models.join(", ") || "–", servers(b)]);
    tr.dataset.backend = b.name;
    return tr;
  }), "no backends configured");
}

function drawChart(svgId, times, values, colour, unit) {
  const svg = document.getElementById(svgId);
  const points = values.map((v, i) => [i, v]).filter(([, v]) => v !== null);
  const top = Math.max(1e-9, ...points.map(([, v]) => v));
  const w = 400, h = 120, n = Math.max(1, values.length - 1);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points.map(([i, v]) => `${(i / n) * w},${h - 8 - (v / top) * (h - 24)}`).join(" "));
  line.setAttribute("stroke", colour);
  const label = document.createElementNS("http://www.w3.org/2000/svg", "text");
  label.setAttribute("x", 4);
  label.setAttribute("y", 12);
  const last = points.length ? points[points.length - 1][1] : null;
  label.textContent = `max ${fmt(top === 1e-9 ? 0 : top)} ${unit} · now ${fmt(last)} ${unit}`;
  const dots = points.map(([i, v]) => {  // a lone bin draws no line
    const dot = document.createElementNS("http://www.w3.org/2000/svg", "circle");
    dot.setAttribute("cx", (i / n) * w);
    dot.setAttribute("cy", h - 8 - (v / top) * (h - 24));
    dot.setAttribute("r", 2);
    dot.setAttribute("fill", colour);
    return dot;
  });
  svg.replaceChildren(line, ...dots, label);
}

function drawCache(cache) {
  fill("cache", Object.entries(cache.tiers).map(([tier, t]) =>
    row([tier, fmt(t.hit || 0, 0), fmt(t.miss || 0, 0), t.hit_rate === null ? "–" : `${fmt(t.hit_rate * 100, 1)} %`])),
    "cache off or unused");
  const size = cache.size;
  document.getElementById("cache-size").textContent = Object.keys(size).length
    ? Object.entries(size).map(([what, n]) => `${what.replace(/_/g, " ")}: ${fmt(n, 0)}`).join(" · ") : "";
}

function drawList(id, title, entries) {
  const dl = document.getElementById(id);
  const items = [el("dt", title, "muted"), el("dd", entries.length ? "" : "none")];
  for (const [k, v] of entries) items.push(el("dt", k), el("dd", fmt(v, 0)));
  dl.replaceChildren(...items);
}

function drawRecent(recent) {
  fill("recent", recent.map(r => {
    const status = el("td", r.status, r.status === "200" ? "up" : r.status === "429" ? "warn" : "down");
    return row([new Date(r.at * 1000).toLocaleTimeString(), r.endpoint, r.model, r.backend, status,
                r.cache || "–", fmt(r.ttft_s, 3), fmt(r.latency_s, 3), r.tokens, fmt(r.tok_s, 1),
                el("td", r.prompt || "", "prompt muted")]);
  }), "no requests yet");
}

function draw(s) {
  document.getElementById("generation").textContent = s.generation;
  document.getElementById("total").textContent = fmt(Object.values(s.requests).reduce((a, b) => a + b, 0), 0);
  drawBackends(s.backends);
  drawChart("tok-chart", s.series.t, s.series.tok_s, "var(--line)", "tok/s");
  drawChart("ttft-chart", s.series.t, s.series.ttft_s, "var(--line2)", "s");
  drawCache(s.cache);
  drawList("repairs", "tool repairs", Object.entries(s.repairs).filter(([, v]) => v));
  drawList("limits", "rate limited", Object.entries(s.limits.refused));
  drawRecent(s.recent);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const resp = await fetch("/ui/state", {cache: "no-store"});
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    draw(await resp.json());
    status.textContent = `live · ${new Date().toLocaleTimeString()}`;
    status.className = "pill up";
  } catch (err) {
    status.textContent = `disconnected (${err.message})`;
    status.className = "pill down";
  }
  setTimeout(poll, POLL_MS);
}

poll();
