// The web console end to end: headless Chromium (playwright-core, Debian's chromium) against a
// real spaced that tests/ui/run.sh started. One sandbox goes through the console's pages: login,
// create, terminal, files, pause/resume, snapshot and branch, CSRF, node figures, delete, logout.
// Every step leaves a screenshot in $SPACE_UI_ARTEFACTS; a failed step skips the ones after it.
//   env: SPACE_UI_URL (the console, .../ui/), SPACE_API_KEY (the operator's), CHROMIUM,
//        SPACE_UI_ARTEFACTS, optional SPACE_UI_TENANT_KEY (another tenant's key)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';

// playwright-core is one of ui/'s packages (ui/package-lock.json).
const require = createRequire(new URL('../../ui/package.json', import.meta.url));
const { chromium } = require('playwright-core');

const UI = process.env.SPACE_UI_URL;
const KEY = process.env.SPACE_API_KEY;
const OTHER_KEY = process.env.SPACE_UI_TENANT_KEY || '';
const ARTEFACTS = process.env.SPACE_UI_ARTEFACTS || '/tmp/space-ui-artefacts';
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
assert.ok(UI && KEY, 'SPACE_UI_URL and SPACE_API_KEY are needed (tests/ui/run.sh sets them)');
const ORIGIN = new URL(UI).origin;
const API = ORIGIN; // the console is served on the API's own listener

const VM_MS = 90_000; // a create, snapshot or branch under software emulation on 2 cores
const STEP_MS = 60_000;

const sel = (testid, extra = '') => `[data-testid="${testid}"]${extra}`;

// The API as the test's own client (Bearer key), for cleanup only.
async function apiCall(method, path, body) {
  const res = await fetch(API + path, {
    method,
    headers: { Authorization: `Bearer ${KEY}`, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what}: over ${ms / 1000} s`)), ms); }),
  ]);
}

test('web console in a browser', { timeout: 360_000 }, async (t) => {
  await mkdir(ARTEFACTS, { recursive: true });
  const started = Date.now();
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--no-sandbox',
      // Nothing but this spaced: no name resolves, and the console's origin is an IP literal.
      `--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE ${new URL(UI).hostname}`,
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--disable-domain-reliability', '--no-pings', '--no-first-run', '--disable-default-apps',
    ],
  });
  const log = [];
  const outside = []; // requests the page made beyond spaced's origin (refused)
  const dialogs = [];
  const pageErrors = [];

  async function newPage() {
    const context = await browser.newContext({ viewport: { width: 1400, height: 1000 }, acceptDownloads: true });
    await context.route('**/*', (route) => {
      const url = route.request().url();
      if (url.startsWith(ORIGIN + '/') || url.startsWith('data:') || url.startsWith('blob:')) return route.continue();
      outside.push(url);
      return route.abort();
    });
    const page = await context.newPage();
    page.setDefaultTimeout(STEP_MS);
    page.on('console', (m) => log.push(`[${m.type()}] ${m.text()}`));
    page.on('pageerror', (e) => { pageErrors.push(String(e)); log.push(`[pageerror] ${e}`); });
    page.on('dialog', async (d) => {
      dialogs.push(`${d.type()}: ${d.message()}`);
      if (d.type() === 'confirm') await d.accept(); else await d.dismiss();
    });
    return { context, page };
  }

  const { context, page } = await newPage();
  let failed = false;
  let n = 0;
  const created = { sandbox: null, snapshot: null, child: null };

  async function shot(name, p = page) {
    try {
      await p.screenshot({ path: join(ARTEFACTS, `${name}.png`), fullPage: true });
    } catch (e) {
      log.push(`[test] screenshot ${name}: ${e}`);
    }
  }

  async function step(name, fn, ms = STEP_MS) {
    const idx = String(++n).padStart(2, '0');
    const file = `${idx}-${name.replace(/[^a-z0-9]+/gi, '-').toLowerCase()}`;
    await t.test(name, async (st) => {
      if (failed) { st.skip('an earlier step failed'); return; }
      const t0 = Date.now();
      try {
        await withTimeout(fn(), ms, name);
      } catch (e) {
        failed = true;
        await shot(file + '-FAILED');
        throw e;
      }
      log.push(`[test] ${name}: ${((Date.now() - t0) / 1000).toFixed(1)} s`);
      await shot(file);
    });
  }

  // The text of the element matching selector once it matches re (waits); returns the match.
  async function waitText(selector, re, ms = STEP_MS, p = page) {
    const handle = await p.waitForFunction(({ selector, src, flags }) => {
      const el = document.querySelector(selector);
      if (!el) return false;
      const m = new RegExp(src, flags).exec(el.textContent || '');
      return m ? Array.from(m) : false;
    }, { selector, src: re.source, flags: re.flags }, { timeout: ms, polling: 200 });
    return handle.jsonValue();
  }

  // fetch() from inside the page (so with its cookie, origin and nothing else).
  function pageFetch(path, init = {}, p = page) {
    return p.evaluate(async ({ path, init }) => {
      const res = await fetch(path, init);
      const text = await res.text();
      let code = null;
      try { code = JSON.parse(text).error.code; } catch { /* not an error body */ }
      return { status: res.status, code };
    }, { path, init });
  }

  async function terminalText() {
    return page.evaluate(() => {
      const rows = document.querySelector('[data-testid="terminal"] .xterm-rows');
      return rows ? Array.from(rows.children, (r) => r.textContent).join('\n') : '';
    });
  }

  async function runInTerminal(command, re, ms = STEP_MS) {
    await page.click(sel('terminal', ' .xterm'));
    await page.keyboard.type(command);
    await page.keyboard.press('Enter');
    const deadline = Date.now() + ms;
    for (;;) {
      const text = await terminalText();
      const all = [...text.matchAll(new RegExp(re.source, re.flags.includes('g') ? re.flags : re.flags + 'g'))];
      if (all.length) return all;
      if (Date.now() > deadline) throw new Error(`terminal: no ${re} within ${ms / 1000} s; it shows:\n${text}`);
      await page.waitForTimeout(250);
    }
  }

  try {
    await step('without a session there is only the login page', async () => {
      const res = await page.goto(UI + '#/sandboxes');
      assert.equal(res.status(), 200);
      const csp = res.headers()['content-security-policy'] || '';
      const scriptSrc = (/(?:^|;)\s*script-src([^;]*)/.exec(csp) || [])[1] || '';
      assert.match(scriptSrc, /'self'|\/ui\//, `the console's CSP: ${csp}`);
      assert.doesNotMatch(scriptSrc, /unsafe|\*|data:/, `the console's CSP: ${csp}`);
      assert.match(csp, /frame-ancestors 'none'/, `the console's CSP: ${csp}`);
      await page.waitForSelector(sel('login-form'), { state: 'visible' });
      assert.match(page.url(), /#\/login$/);
      assert.equal(await page.locator(sel('sandbox-table')).count(), 0);
      assert.equal(await page.locator(sel('logout')).isVisible(), false);
      const list = await pageFetch('/v1/sandboxes');
      assert.equal(list.status, 401, 'GET /v1/sandboxes without a session');
      const session = await pageFetch('/ui/session');
      assert.equal(session.status, 401, 'GET /ui/session without a session');
    });

    await step('a wrong key is refused with a message', async () => {
      await page.fill(sel('login-key'), 'e2b_' + '0'.repeat(40));
      await page.click(sel('login-submit'));
      const [text] = await waitText(sel('login-error'), /\S.*/);
      assert.match(text, /Login failed|Cannot log in/);
      assert.match(page.url(), /#\/login$/);
      assert.equal(await page.locator(sel('sandbox-table')).count(), 0);
    });

    await step('log in with the key; the session survives a reload', async () => {
      await page.fill(sel('login-key'), KEY);
      await page.click(sel('login-submit'));
      await page.waitForSelector(sel('sandbox-table'), { state: 'visible' });
      await waitText(sel('whoami'), /tenant default \(operator\)/);
      assert.equal(await page.locator(sel('login-key')).count(), 0, 'the login form (and the key in it) is gone');
      assert.equal(await page.evaluate((key) => document.documentElement.outerHTML.includes(key), KEY), false,
        'the key is nowhere in the page');
      await page.reload();
      await page.waitForSelector(sel('sandbox-table'), { state: 'visible' });
      await waitText(sel('list-status'), /Updated/);
      const list = await pageFetch('/v1/sandboxes');
      assert.equal(list.status, 200, 'GET /v1/sandboxes with the session cookie');
    });

    await step('create a sandbox from the form; it is running in the list', async () => {
      await page.fill(sel('create-template'), 'base');
      await page.click(sel('create-submit'));
      const [, id] = await waitText(sel('create-status'), /Created (sb_[a-z0-9]+)/, VM_MS);
      created.sandbox = id;
      await page.waitForSelector(sel('sandbox-row', `[data-id="${id}"][data-state="running"]`), { timeout: STEP_MS });
      await page.fill(sel('filter-text'), id);
      assert.equal(await page.locator(sel('sandbox-row')).count(), 1);
      await page.fill(sel('filter-text'), 'no-such-sandbox');
      assert.equal(await page.locator(sel('sandbox-row')).count(), 0);
      await page.fill(sel('filter-text'), '');
      await page.selectOption(sel('filter-state'), 'paused');
      await page.waitForSelector(sel('sandbox-row', `[data-id="${id}"]`), { state: 'detached' });
      await page.selectOption(sel('filter-state'), 'running');
      await page.waitForSelector(sel('sandbox-row', `[data-id="${id}"]`));
      await page.selectOption(sel('filter-state'), '');
      // the CPU column fills in once spaced has sampled it (every 5 s)
      await waitText(sel('sandbox-row', `[data-id="${created.sandbox}"] [data-testid="sandbox-cpu"]`), /%/, 30_000);
    }, VM_MS + 60_000);

    await step('open it; the terminal runs a command', async () => {
      await page.click(sel('sandbox-row', `[data-id="${created.sandbox}"] [data-testid="sandbox-link"]`));
      await page.waitForSelector(sel('sb-state', '[data-state="running"]'));
      await waitText(sel('term-status'), /Connected: shell pid \d+/);
      // typed before the prompt, the keys would be echoed twice (once by the tty, once by bash)
      await page.waitForFunction(() => /[$#]/.test(document.querySelector('[data-testid="terminal"] .xterm-rows')?.textContent || ''),
        null, { timeout: 20_000 }).catch(() => {});
      const hits = await runInTerminal('echo ui-$((6*7))', /ui-42/);
      assert.ok(hits.length >= 1);
      // the terminal follows the page's size: a narrower page sends a resize the shell sees
      const [[, before]] = await runInTerminal('echo "sz=$(stty size | tr " " x)="', /sz=(\d+x\d+)=/);
      await page.setViewportSize({ width: 900, height: 1000 });
      await page.waitForTimeout(500);
      const after = await runInTerminal('echo "sz2=$(stty size | tr " " x)="', /sz2=(\d+x\d+)=/);
      assert.notEqual(after[0][1], before, `the terminal's size after a resize (was ${before})`);
      await page.setViewportSize({ width: 1400, height: 1000 });
      // the other sections came up too
      await waitText(sel('processes-status'), /\d+ process/);
      await waitText(sel('console-status'), /shown|No console/);
      await waitText(sel('metrics-status'), /sample/);
    });

    const payload = Buffer.concat([Buffer.from('space ui upload\n'), randomBytes(3000), Buffer.from(Array.from({ length: 256 }, (_, i) => i))]);
    const hostile = '<img src=x onerror=alert(1)>.txt';
    await step('upload files into /tmp, list, download and compare, delete', async () => {
      await page.fill(sel('files-path'), '/tmp');
      await page.click(sel('files-go'));
      await waitText(sel('files-status'), /^\/tmp: \d+ entr/);
      await page.setInputFiles(sel('files-upload'), [
        { name: 'ui-upload.bin', mimeType: 'application/octet-stream', buffer: payload },
        { name: hostile, mimeType: 'text/plain', buffer: Buffer.from('hostile name\n') },
      ]);
      await waitText(sel('files-status'), /Uploaded 2 files into \/tmp/);
      const row = page.locator(sel('file-row', '[data-name="ui-upload.bin"]'));
      await row.waitFor();
      // a hostile name is text, not markup
      const hostileRow = page.locator(sel('file-row')).filter({ hasText: hostile });
      await hostileRow.waitFor();
      assert.equal(await page.locator(sel('files-section', ' img')).count(), 0, 'no element made of a file name');
      const [download] = await Promise.all([
        page.waitForEvent('download'),
        row.locator(sel('file-download')).click(),
      ]);
      const got = await readFile(await download.path());
      assert.equal(got.length, payload.length, 'downloaded size');
      assert.ok(got.equals(payload), 'downloaded bytes equal the uploaded ones');
      await hostileRow.locator(sel('file-delete')).click();
      await hostileRow.waitFor({ state: 'detached' });
      await page.locator(sel('file-row', '[data-name="ui-upload.bin"]')).waitFor();
    });

    await step('pause, then resume', async () => {
      await page.click(sel('action-pause'));
      await page.waitForSelector(sel('sb-state', '[data-state="paused"]'));
      await waitText(sel('action-status'), /pause: the sandbox is paused/);
      await page.click(sel('action-resume'));
      await page.waitForSelector(sel('sb-state', '[data-state="running"]'));
      await waitText(sel('action-status'), /resume: the sandbox is running/);
    });

    await step('take a snapshot; it is in the tree', async () => {
      await page.fill(sel('snapshot-name'), 'ui-snap');
      await page.click(sel('action-snapshot'));
      const [, snap] = await waitText(sel('action-status'), /Snapshot (snap_[a-z0-9]+) taken/, VM_MS);
      created.snapshot = snap;
      const node = page.locator(sel('snapshot-node', `[data-id="${snap}"]`));
      await node.waitFor();
      await waitText(sel('snapshot-node', `[data-id="${snap}"] [data-testid="snapshot-node-name"]`), /ui-snap/);
    }, VM_MS + 30_000);

    await step('branch the snapshot into one sandbox; it runs', async () => {
      const node = page.locator(sel('snapshot-node', `[data-id="${created.snapshot}"]`));
      await node.locator(sel('branch-count')).fill('1');
      await node.locator(sel('branch-submit')).click();
      const [, child] = await waitText(sel('snapshots-action'), /Branched snap_[a-z0-9]+: (sb_[a-z0-9]+)/, VM_MS);
      created.child = child;
      await node.locator(sel('branch-child', `[data-id="${child}"]`)).waitFor();
      await page.click(sel('nav-sandboxes'));
      await page.waitForSelector(sel('sandbox-row', `[data-id="${child}"][data-state="running"]`));
      await page.waitForSelector(sel('sandbox-row', `[data-id="${created.sandbox}"][data-state="running"]`));
    }, VM_MS + 30_000);

    await step('requests without the CSRF token are refused', async () => {
      const path = `/v1/sandboxes/${created.sandbox}/timeout`;
      const init = { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"timeout_s":900}' };
      const none = await pageFetch(path, init);
      assert.equal(none.status, 403, 'POST without X-CSRF-Token');
      const wrong = await pageFetch(path, { ...init, headers: { ...init.headers, 'X-CSRF-Token': 'f'.repeat(64) } });
      assert.equal(wrong.status, 403, 'POST with a wrong X-CSRF-Token');
      const logout = await pageFetch('/ui/session', { method: 'DELETE' });
      assert.equal(logout.status, 403, 'DELETE /ui/session without X-CSRF-Token');
      // the console's own request (with the token) works
      await page.click(sel('sandbox-row', `[data-id="${created.sandbox}"] [data-testid="sandbox-link"]`));
      await page.waitForSelector(sel('sb-state', '[data-state="running"]'));
      await page.fill(sel('timeout-seconds'), '900');
      await page.click(sel('action-timeout'));
      await waitText(sel('action-status'), /Timeout set: expires in/);
      await waitText(sel('sb-expires'), /timeout 900 s/);
    });

    await step('the node page shows capacity and create latency', async () => {
      await page.click(sel('nav-node'));
      const [, reserved, limit] = await waitText(sel('node-vcpus'), /^(\d+) \/ (\d+)$/);
      assert.ok(Number(limit) > 0 && Number(reserved) >= 2, `vCPUs ${reserved} / ${limit}`);
      await waitText(sel('node-memory'), /\d.* \/ \d/);
      const [creates] = await waitText(sel('node-creates'), /^\d+$/);
      assert.ok(Number(creates) >= 1, `creates: ${creates}`);
      await waitText(sel('node-latency'), /s \/ .*s$/);
      await waitText(sel('node-status'), /Updated/);
      await page.waitForFunction(() => document.querySelectorAll('[data-testid="chart-node-vcpus"] circle').length >= 2);
    });

    if (OTHER_KEY) {
      await step('another tenant sees none of it, and no node figures', async () => {
        const other = await newPage();
        try {
          const p = other.page;
          await p.goto(UI);
          await p.fill(sel('login-key'), OTHER_KEY);
          await p.click(sel('login-submit'));
          await waitText(sel('whoami'), /^tenant (?!default)/, STEP_MS, p);
          await waitText(sel('list-status'), /Updated/, STEP_MS, p);
          assert.equal(await p.locator(sel('sandbox-row', `[data-id="${created.sandbox}"]`)).count(), 0);
          await p.click(sel('nav-node'));
          await p.waitForSelector(sel('node-forbidden'));
          assert.equal((await pageFetch('/metrics', {}, p)).status, 403);
          await p.goto(UI + `#/sandboxes/${created.sandbox}`);
          await waitText(sel('sb-status'), /sandbox_not_found/, STEP_MS, p);
          await shot(`${String(n).padStart(2, '0')}-other-tenant`, p);
        } finally {
          await other.context.close();
        }
      });
    }

    await step('delete the branch, the snapshot and the sandbox from the console', async () => {
      await page.goto(UI + `#/sandboxes/${created.sandbox}`);
      const node = page.locator(sel('snapshot-node', `[data-id="${created.snapshot}"]`));
      await node.locator(sel('branch-child', `[data-id="${created.child}"] a`)).click();
      await waitText(sel('sb-id'), new RegExp(created.child));
      await page.waitForSelector(sel('sb-state', '[data-state="running"]'));
      await waitText(sel('snapshot-origin'), new RegExp(`${created.snapshot} \\(ui-snap\\) of ${created.sandbox}`));
      await page.click(sel('action-delete'));
      await page.waitForSelector(sel('sandbox-table'));
      await page.waitForSelector(sel('sandbox-row', `[data-id="${created.child}"]`), { state: 'detached' });
      created.child = null;

      await page.click(sel('sandbox-row', `[data-id="${created.sandbox}"] [data-testid="sandbox-link"]`));
      await node.waitFor();
      await node.locator(sel('snapshot-delete')).click();
      await node.waitFor({ state: 'detached' });
      created.snapshot = null;
      await page.waitForSelector(sel('action-delete', ':not([disabled])'));
      await page.click(sel('action-delete'));
      await page.waitForSelector(sel('sandbox-table'));
      await page.waitForSelector(sel('sandbox-row', `[data-id="${created.sandbox}"]`), { state: 'detached' });
      await page.selectOption(sel('filter-state'), 'deleted');
      await page.waitForSelector(sel('sandbox-row', `[data-id="${created.sandbox}"][data-state="deleted"]`));
      created.sandbox = null;
    });

    await step('log out: the login page, and the cookie no longer works', async () => {
      await page.click(sel('logout'));
      await page.waitForSelector(sel('login-form'));
      assert.equal(await page.locator(sel('sandbox-table')).count(), 0);
      assert.equal((await pageFetch('/v1/sandboxes')).status, 401);
      await page.goto(UI + '#/node');
      await page.waitForSelector(sel('login-form'));
    });

    await t.test('the page made no request beyond spaced, raised no error, opened no alert', () => {
      assert.deepEqual(outside, [], 'requests beyond spaced');
      assert.deepEqual(pageErrors, [], 'uncaught errors in the page');
      const csp = log.filter((l) => /Content Security Policy/i.test(l));
      assert.deepEqual(csp, [], 'CSP violations');
      assert.deepEqual(dialogs.filter((d) => !d.startsWith('confirm')), [], 'dialogs other than confirms');
    });
  } finally {
    log.push(`[test] total ${((Date.now() - started) / 1000).toFixed(1)} s`);
    await writeFile(join(ARTEFACTS, 'browser.log'), log.join('\n') + '\n').catch(() => {});
    await browser.close().catch(() => {});
    // Whatever a failed step left behind (spaced also stops its VMs at exit: --on-shutdown stop).
    for (const id of [created.child, created.sandbox]) if (id) await apiCall('DELETE', `/v1/sandboxes/${id}`).catch(() => {});
    if (created.snapshot) await apiCall('DELETE', `/v1/snapshots/${created.snapshot}`).catch(() => {});
  }
});
