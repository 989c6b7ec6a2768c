// End-to-end test of the policy playground in headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core; no browser download). Run through ./run.sh, which builds the
// page, serves it on a loopback port and sets PLAYGROUND_URL.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const URL_ = process.env.PLAYGROUND_URL;
const SCREENSHOT = process.env.PLAYGROUND_SCREENSHOT;
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
assert.ok(URL_, 'PLAYGROUND_URL must be set (use run.sh)');

// playwright-core launches Chromium with a fresh temporary profile of its own.
let browser, context, page;
const pageErrors = [];
const foreignRequests = [];

before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
  context = await browser.newContext({ viewport: { width: 1280, height: 900 }, deviceScaleFactor: 1 });
  page = await context.newPage();
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') pageErrors.push(m.text()); });
  // The page must work offline: anything but the page's own origin is refused and recorded.
  const origin = new URL(URL_).origin;
  await page.route('**/*', (route) => {
    const u = route.request().url();
    if (u.startsWith(origin) || u.startsWith('data:') || u.startsWith('blob:')) return route.continue();
    foreignRequests.push(u);
    return route.abort();
  });
  await page.goto(URL_);
  await page.waitForSelector('body[data-ready="true"]', { timeout: 30000 });
});

after(async () => {
  await browser?.close();
});

test('loads the Kubernetes defaults and validates them', async () => {
  const config = await page.inputValue('#config');
  assert.match(config, /"system-node-high"/);
  assert.match(config, /"PriorityLevelConfiguration"/);
  await page.waitForSelector('#validation-ok');
  const levels = await page.textContent('#levels');
  for (const name of ['exempt', 'catch-all', 'node-high', 'workload-low', 'global-default']) assert.ok(levels.includes(name), name);
  const schemas = await page.$$eval('#flowschemas tr td:nth-child(2)', (tds) => tds.map((td) => td.textContent));
  assert.deepEqual(schemas.slice(0, 4), ['exempt', 'probes', 'system-leader-election', 'system-node-high']);
  assert.equal(schemas.at(-1), 'catch-all');
});

test('classifies a kubelet request into system-node-high / node-high with a dealt hand', async () => {
  await page.selectOption('#req-method', 'GET');
  await page.fill('#req-path', '/api/v1/nodes/node-1');
  await page.fill('#req-user', 'system:node:node-1');
  await page.fill('#req-groups', 'system:nodes');
  await page.click('#classify-btn');
  await page.waitForSelector('#out-flowschema', { timeout: 10000 });
  assert.equal(await page.textContent('#out-flowschema'), 'system-node-high');
  assert.equal(await page.textContent('#out-level'), 'node-high');
  assert.equal(await page.textContent('#out-distinguisher'), 'system:node:node-1');
  assert.equal(await page.textContent('#out-seats'), '1');
  // node-high: 64 queues, hand size 6 — six highlighted boxes, numbered 1..6 in dealing order.
  assert.equal(await page.locator('#hand rect.queue').count(), 64);
  const inHand = await page.$$eval('#hand rect.in-hand', (rs) => rs.map((r) => Number(r.dataset.queue)));
  assert.equal(inHand.length, 6);
  const dealt = (await page.textContent('#out-hand')).split(',').map((s) => Number(s.trim()));
  assert.deepEqual([...dealt].sort((a, b) => a - b), [...inHand].sort((a, b) => a - b));
  assert.equal(new Set(dealt).size, 6);
});

test('shows an invalid policy with the object and field named', async () => {
  const bad = [{
    apiVersion: 'flowcontrol.apiserver.k8s.io/v1', kind: 'FlowSchema', metadata: { name: 'team-a' },
    spec: { priorityLevelConfiguration: { name: 'global-default' }, matchingPrecedence: 20000, rules: [] },
  }];
  await page.fill('#config', JSON.stringify(bad, null, 2));
  await page.click('#validate-btn');
  await page.waitForSelector('#validation-failed');
  const errors = await page.textContent('#errors');
  assert.match(errors, /FlowSchema "team-a"/);
  assert.match(errors, /spec\.matchingPrecedence/);
  const fields = await page.$$eval('#errors .field', (s) => s.map((e) => e.textContent));
  assert.ok(fields.includes('spec.matchingPrecedence'), JSON.stringify(fields));
  // Back to the defaults.
  await page.click('#reset-config');
  await page.waitForSelector('#validation-ok');
});

test('runs a two-client scenario and draws one line per client with limit and fair shares', async () => {
  const scenario = JSON.parse(await page.evaluate(() => window.apfPlayground.default_scenario()));
  const two = window2(scenario);
  await page.fill('#scenario-text', JSON.stringify(two, null, 2));
  await page.click('#simulate-btn');
  await page.waitForSelector('#sim-chart', { timeout: 10000 });
  const lines = await page.$$eval('#sim-chart path.client-line', (ps) => ps.map((p) => ({ name: p.dataset.client, d: p.getAttribute('d') })));
  assert.equal(lines.length, 2, JSON.stringify(lines));
  for (const l of lines) assert.ok(l.d.length > 20 && /H/.test(l.d) && /V/.test(l.d), `line for ${l.name} has steps: ${l.d}`);
  assert.equal(await page.locator('#sim-chart line.limit').count(), 1);
  // One fair-share segment per client and half of the window.
  assert.equal(await page.locator('#sim-chart line.fair-share').count(), 4);
});

test('the page used nothing but its own origin and raised no errors', async () => {
  // The default 3-client example, then the picture for the README.
  await page.click('#reset-scenario');
  await page.click('#simulate-btn');
  await page.waitForSelector('#sim-chart', { timeout: 10000 });
  await page.fill('#req-path', '/api/v1/nodes/node-1');
  await page.click('#classify-btn');
  if (SCREENSHOT) await page.screenshot({ path: SCREENSHOT, fullPage: true });
  assert.deepEqual(foreignRequests, []);
  assert.deepEqual(pageErrors, []);
});

// Keeps the first two clients of a scenario (whatever the simulator's scenario calls them).
function window2(scenario) {
  const s = structuredClone(scenario);
  if (Array.isArray(s.clients)) s.clients = s.clients.slice(0, 2);
  return s;
}
