// The apf-wasm policy playground. All policy logic runs in the Rust core compiled with
// wasm-bindgen (pkg/apf_playground.js); this file only reads forms and draws results.
import init, { validate, classify, simulate, default_config, default_scenario } from './pkg/apf_playground.js';

const $ = (id) => document.getElementById(id);
const SVG_NS = 'http://www.w3.org/2000/svg';
const COLORS = ['#2458d6', '#e4572e', '#17a398', '#9b5de5', '#f3a712', '#5f0f40'];

let lastValidation = null; // result of validate() for the current editor text

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);
  return e;
}

function parseJson(s) {
  try { return JSON.parse(s); } catch (e) { return { ok: false, errors: [`internal: ${e}`] }; }
}

function table(headers, rows, rowClass) {
  const t = el('table');
  t.append(el('tr', {}, ...headers.map((h) => el('th', {}, h))));
  rows.forEach((r, i) => {
    const tr = el('tr', rowClass ? { class: rowClass(i) } : {},
      ...r.map((c) => el('td', { class: typeof c === 'number' || c === null || c === undefined ? 'n' : 'l' }, c ?? '–')));
    t.append(tr);
  });
  return t;
}

// ---------------------------------------------------------------------------------------------
// 1. Policy

// `policy: FlowSchema "team-a": spec.matchingPrecedence: Invalid value: …` → highlighted parts.
function errorItem(msg) {
  const li = el('li', { class: 'error' });
  const m = /^(?:(policy): )?((?:FlowSchema|PriorityLevelConfiguration)(?: "[^"]*"| at [^:]+| \(unnamed\)))?(?:: )?([A-Za-z][\w.\[\]]*)?(: .*)?$/s.exec(msg);
  if (!m || (!m[2] && !m[3])) { li.textContent = msg; return li; }
  if (m[1]) li.append('policy: ');
  if (m[2]) li.append(el('span', { class: 'object' }, m[2]), m[3] ? ': ' : '');
  if (m[3]) li.append(el('span', { class: 'field' }, m[3]));
  li.append(m[4] ?? '');
  return li;
}

function runValidate() {
  const v = parseJson(validate($('config').value));
  lastValidation = v;
  const out = $('validation');
  out.replaceChildren();
  if (v.ok) {
    out.append(el('p', { class: 'ok', id: 'validation-ok' }, '✔ Configuration is valid'));
    out.append(el('p', { class: 'hint' }, v.summary));
  } else {
    out.append(el('p', { class: 'err', id: 'validation-failed' }, `✘ ${v.errors.length} error(s)`));
    out.append(el('ul', { class: 'errors', id: 'errors' }, ...v.errors.map(errorItem)));
  }
  if (v.warnings && v.warnings.length) {
    out.append(el('h3', {}, 'Warnings'), el('ul', { class: 'warnings' }, ...v.warnings.map((w) => el('li', {}, w))));
  }
  const levels = $('levels');
  const schemas = $('flowschemas');
  if (!v.ok) { levels.replaceChildren(); schemas.replaceChildren(); return v; }
  levels.replaceChildren(
    el('summary', {}, `Priority levels (server concurrency limit ${v.serverConcurrencyLimit}, nominal sum ${v.nominalSum})`),
    table(
      ['name', 'type', 'response', 'shares', 'lendable %', 'nominal', 'lendable', 'min', 'max', 'max seats', 'queues', 'hand', 'queue length'],
      v.levels.map((l) => [l.enforced ? l.name : `${l.name} (dry-run)`, l.type, l.limitResponse, l.nominalConcurrencyShares,
        l.lendablePercent, l.nominal, l.lendable, l.min, l.max, l.maxSeats, l.queues, l.handSize, l.queueLengthLimit]),
    ),
  );
  schemas.replaceChildren(
    el('summary', {}, `FlowSchemas in matching order (${v.flowSchemas.length})`),
    table(['precedence', 'name', 'priority level', 'distinguisher', 'rules'],
      v.flowSchemas.map((f) => [f.matchingPrecedence, f.name, f.priorityLevel, f.distinguisher, f.rules])),
  );
  return v;
}

// ---------------------------------------------------------------------------------------------
// 2. Classification

const PRESETS = {
  node: { method: 'GET', path: '/api/v1/nodes/node-1', user: 'system:node:node-1', groups: 'system:nodes' },
  sa: { method: 'GET', path: '/api/v1/namespaces/team-a/pods', user: 'system:serviceaccount:team-a:builder', groups: '' },
  probe: { method: 'GET', path: '/healthz', user: '', groups: '' },
  admin: { method: 'DELETE', path: '/api/v1/namespaces/default/pods/web-0', user: 'admin', groups: 'system:masters' },
};

function currentRequest() {
  const groups = $('req-groups').value.split(',').map((g) => g.trim()).filter(Boolean);
  const user = $('req-user').value.trim();
  const req = { method: $('req-method').value, path: $('req-path').value.trim() };
  if (user) { req.user = user; req.groups = groups; }
  return req;
}

function card(key, value, id) {
  return el('div', { class: 'card' }, el('div', { class: 'k' }, key), el('div', { class: 'v', id }, value === '' ? '""' : value));
}

// The level's queues as a row of boxes; the hand's queues highlighted and numbered in dealing order.
function drawHand(nQueues, hand) {
  const perRow = Math.min(nQueues, 64);
  const box = 14, gap = 2, pad = 4;
  const rows = Math.ceil(nQueues / perRow);
  const w = pad * 2 + perRow * (box + gap), h = pad * 2 + rows * (box + gap) + 14;
  const s = svg('svg', { viewBox: `0 0 ${w} ${h}`, style: `width: 100%; max-width: ${w * 1.4}px`, id: 'hand', role: 'img',
    'aria-label': `hand of ${hand.length} queues out of ${nQueues}` });
  const order = new Map(hand.map((q, i) => [q, i + 1]));
  for (let q = 0; q < nQueues; q++) {
    const x = pad + (q % perRow) * (box + gap), y = pad + Math.floor(q / perRow) * (box + gap);
    const inHand = order.has(q);
    const r = svg('rect', { x, y, width: box, height: box, rx: 2,
      fill: inHand ? 'var(--hand)' : '#e7eaf0', stroke: inHand ? '#b45309' : '#c9ced8', 'stroke-width': inHand ? 1.2 : 0.6,
      class: inHand ? 'queue in-hand' : 'queue', 'data-queue': q });
    r.append(svg('title', {}, inHand ? `queue ${q}: card ${order.get(q)} of the hand` : `queue ${q}`));
    s.append(r);
    if (inHand) s.append(svg('text', { x: x + box / 2, y: y + box / 2 + 3.5, 'text-anchor': 'middle', 'font-size': 9, 'font-weight': 700, fill: '#1d2330' }, order.get(q)));
  }
  s.append(svg('text', { x: pad, y: h - 3, 'font-size': 9, fill: '#5b6475' }, `queues 0–${nQueues - 1}; numbers = dealing order`));
  return s;
}

function runClassify() {
  const out = $('classification');
  out.replaceChildren();
  const r = parseJson(classify($('config').value, JSON.stringify(currentRequest())));
  if (r.ok === false || r.errors) {
    out.append(el('p', { class: 'err' }, 'Cannot classify:'), el('ul', { class: 'errors' }, ...(r.errors ?? []).map(errorItem)));
    return;
  }
  const v = lastValidation && lastValidation.ok ? lastValidation : runValidate();
  const level = (v.levels ?? []).find((l) => l.name === r.priorityLevel);
  const seats = r.seats ?? {};
  out.append(el('div', { class: 'cards' },
    card('FlowSchema', r.flowSchema, 'out-flowschema'),
    card('Priority level', r.priorityLevel, 'out-level'),
    card('Distinguisher', r.distinguisher ?? '', 'out-distinguisher'),
    card('Flow hash', r.flowHash ?? '–', 'out-flowhash'),
    card('Seats', seats.initial ?? '–', 'out-seats'),
    card('Request', r.requestInfo ? `${r.requestInfo.verb} ${r.requestInfo.resource || ''}${r.requestInfo.subresource ? '/' + r.requestInfo.subresource : ''}` : '–', 'out-verb'),
  ));
  if (seats.final) {
    out.append(el('p', { class: 'hint' }, `After it finishes the request keeps ${seats.final} seat(s) for ${seats.additionalLatencyMs} ms (watch notifications).`));
  }
  if (level) {
    out.append(el('p', { class: 'hint' },
      `${level.name}: ${level.type}${level.limitResponse ? ' / ' + level.limitResponse : ''}, nominal ${level.nominal} seats ` +
      `(min ${level.min}, max ${level.max})${level.maxSeats ? `, at most ${level.maxSeats} seats per request` : ''}.`));
  }
  const hand = r.queues ?? [];
  if (level && level.queues && hand.length) {
    out.append(el('div', { class: 'hand-caption' },
      `Shuffle sharding deals this flow a hand of ${hand.length} of the level's ${level.queues} queues: `,
      el('b', { id: 'out-hand' }, hand.join(', ')), '. A request joins the shortest queue of its hand.'));
    out.append(drawHand(level.queues, hand));
  } else if (level) {
    out.append(el('div', { class: 'hand-caption', id: 'out-hand' },
      level.type === 'Exempt' ? 'Exempt: never queued, never rejected.' : level.limitResponse === 'Reject'
        ? 'Reject: requests over the limit are rejected at once (no queues).' : 'One queue: no hand is dealt.'));
  }
  const wl = r.watchLimit;
  if (wl) {
    const limits = [wl.perFlow != null ? `${wl.perFlow} per flow` : '', wl.perLevel != null ? `${wl.perLevel} on the level` : '']
      .filter(Boolean).join(', ');
    out.append(el('p', { class: 'hint', id: 'out-watch-limit' },
      wl.applies ? `Open-watch limits: at most ${limits}; ${wl.why}.` : `Open-watch limits: none apply (${wl.why}).`));
  }
  if (r.user) out.append(el('p', { class: 'hint' }, `user ${r.user.name || '(anonymous)'}; groups ${(r.user.groups ?? []).join(', ') || '–'}`));
}

// ---------------------------------------------------------------------------------------------
// 3. Simulation chart (hand-drawn SVG)

function niceStep(range, target) {
  const raw = range / Math.max(1, target);
  const p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
  for (const m of [1, 2, 5, 10]) if (raw <= m * p) return m * p;
  return 10 * p;
}

// A client's fair share as a list of values for equal parts of the window.
function shares(c) {
  if (c.fairShare === undefined || c.fairShare === null) return [];
  return Array.isArray(c.fairShare) ? c.fairShare : [c.fairShare];
}

function drawChart(series) {
  const W = 900, H = 340, L = 48, R = 150, T = 16, B = 36;
  const t = series.t ?? [];
  const clients = series.clients ?? [];
  const tMax = Math.max(t.length ? t[t.length - 1] : 1, 1e-9);
  let yMax = series.limit ?? 0;
  for (const c of clients) for (const v of c.seats) yMax = Math.max(yMax, v);
  for (const c of clients) for (const f of shares(c)) yMax = Math.max(yMax, f);
  yMax = Math.max(1, Math.ceil(yMax * 1.1));
  const x = (v) => L + (v / tMax) * (W - L - R);
  const y = (v) => T + (1 - v / yMax) * (H - T - B);
  const s = svg('svg', { viewBox: `0 0 ${W} ${H}`, id: 'sim-chart', role: 'img', 'aria-label': 'seats per client over time' });
  // Axes and grid.
  const yStep = niceStep(yMax, 6);
  for (let v = 0; v <= yMax; v += yStep) {
    s.append(svg('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#eef1f6' }));
    s.append(svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 10, fill: '#5b6475' }, +v.toFixed(2)));
  }
  const xStep = niceStep(tMax, 8);
  for (let v = 0; v <= tMax + 1e-9; v += xStep) {
    s.append(svg('line', { x1: x(v), x2: x(v), y1: H - B, y2: H - B + 4, stroke: '#5b6475' }));
    s.append(svg('text', { x: x(v), y: H - B + 15, 'text-anchor': 'middle', 'font-size': 10, fill: '#5b6475' }, +v.toFixed(3)));
  }
  s.append(svg('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#5b6475' }));
  s.append(svg('line', { x1: L, x2: L, y1: T, y2: H - B, stroke: '#5b6475' }));
  s.append(svg('text', { x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle', 'font-size': 11, fill: '#1d2330' }, 'time (s)'));
  s.append(svg('text', { x: 12, y: (T + H - B) / 2, 'text-anchor': 'middle', 'font-size': 11, fill: '#1d2330',
    transform: `rotate(-90 12 ${(T + H - B) / 2})` }, 'seats in use'));
  // The level's limit.
  if (series.limit) {
    s.append(svg('line', { x1: L, x2: W - R, y1: y(series.limit), y2: y(series.limit), stroke: '#b42318', 'stroke-width': 1.5, 'stroke-dasharray': '6 3', class: 'limit' }));
    s.append(svg('text', { x: L + 6, y: y(series.limit) - 5, 'font-size': 11, fill: '#b42318' }, `level limit: ${series.limit} seats`));
  }
  // One step line per client, plus its fair share.
  clients.forEach((c, i) => {
    const color = COLORS[i % COLORS.length];
    let d = '';
    c.seats.forEach((v, k) => {
      const px = x(t[k] ?? 0).toFixed(1), py = y(v).toFixed(1);
      if (k === 0) d += `M${px},${py}`;
      else d += `H${px}V${py}`;
    });
    if (c.seats.length) d += `H${x(tMax).toFixed(1)}`;
    s.append(svg('path', { d, fill: 'none', stroke: color, 'stroke-width': 1.8, class: 'client-line', 'data-client': c.name }));
    // Fair share per half of the window (upstream fairAlloc of the demands).
    const fs = shares(c);
    fs.forEach((f, h) => {
      const a = (tMax * h) / fs.length, b = (tMax * (h + 1)) / fs.length;
      s.append(svg('line', { x1: x(a), x2: x(b), y1: y(f), y2: y(f), stroke: color, 'stroke-width': 1.3, 'stroke-dasharray': '2 3', class: 'fair-share' }));
    });
    const ly = T + 14 + i * 34;
    s.append(svg('rect', { x: W - R + 8, y: ly - 8, width: 10, height: 10, fill: color }));
    s.append(svg('text', { x: W - R + 22, y: ly + 1, 'font-size': 12, fill: '#1d2330' }, c.name));
    if (fs.length) {
      const txt = fs.every((f) => f === fs[0]) ? `${+fs[0].toFixed(2)}` : fs.map((f) => +f.toFixed(2)).join(' → ');
      s.append(svg('text', { x: W - R + 22, y: ly + 15, 'font-size': 10, fill: '#5b6475' }, `fair share ${txt}`));
    }
  });
  return s;
}

function runSimulate() {
  const out = $('chart');
  const summary = $('sim-summary');
  out.replaceChildren(el('p', { class: 'hint' }, 'Simulating…'));
  summary.replaceChildren();
  const r = parseJson(simulate($('scenario-text').value));
  if (r.ok === false) {
    out.replaceChildren(el('p', { class: 'err' }, 'Scenario error:'), el('ul', { class: 'errors' }, ...(r.errors ?? []).map(errorItem)));
    return;
  }
  const series = r.series ?? {};
  out.replaceChildren(
    el('p', { class: 'hint' }, `Seats executing per client (solid, averaged over ${((series.t?.at(-1) ?? 0) / Math.max(1, (series.t?.length ?? 2) - 1)).toFixed(2)} s bins), the level's limit of ${series.limit} seats (red dashes) and each client's fair share per half (dotted).`),
    drawChart(series),
  );
  const clients = r.clients ?? [];
  const named = series.clients ?? [];
  if (clients.length) {
    const f = (x) => (typeof x === 'number' ? +x.toFixed(3) : '–');
    summary.append(el('h3', {}, 'Per-client results (apf simulate)'), table(
      ['client', 'hash', 'avg seats', '1st half', '2nd half', 'fair share', 'executed', 'rejected'],
      clients.map((c, i) => [named[i]?.name ?? `client ${i}`, named[i]?.hash ?? '', f(c.averageSeats),
        f(c.averageSeatsHalves?.[0]), f(c.averageSeatsHalves?.[1]), shares(named[i] ?? {}).map(f).join(' → '),
        c.executed, Object.values(c.rejected ?? {}).reduce((a, b) => a + b, 0)]),
    ));
  }
}

// ---------------------------------------------------------------------------------------------

function debounce(fn, ms) {
  let h;
  return () => { clearTimeout(h); h = setTimeout(fn, ms); };
}

async function main() {
  try {
    await init();
  } catch (e) {
    $('status').textContent = `Could not load the WebAssembly module (build it with ./wasm-build.sh --playground): ${e}`;
    $('status').className = 'status err';
    return;
  }
  $('config').value = default_config();
  $('scenario-text').value = default_scenario();
  $('validate-btn').addEventListener('click', runValidate);
  $('config').addEventListener('input', debounce(runValidate, 400));
  $('reset-config').addEventListener('click', () => { $('config').value = default_config(); runValidate(); });
  $('request-form').addEventListener('submit', (e) => { e.preventDefault(); runClassify(); });
  for (const b of document.querySelectorAll('[data-preset]')) {
    b.addEventListener('click', () => {
      const p = PRESETS[b.dataset.preset];
      $('req-method').value = p.method; $('req-path').value = p.path; $('req-user').value = p.user; $('req-groups').value = p.groups;
      runClassify();
    });
  }
  $('simulate-btn').addEventListener('click', runSimulate);
  $('reset-scenario').addEventListener('click', () => { $('scenario-text').value = default_scenario(); });
  runValidate();
  $('status').textContent = 'Ready: the policy core is running in WebAssembly.';
  $('status').className = 'status ok';
  // For the console and the end-to-end test.
  window.apfPlayground = { validate, classify, simulate, default_config, default_scenario };
  document.body.dataset.ready = 'true';
}

main();
