// The official e2b SDK (pinned in package.json), unmodified, against a real spaced under TCG:
// run.sh starts spaced and sets E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. Each test has a
// timeout close to what it needs under TCG on 2 cores.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, FileNotFoundError, SandboxNotFoundError } from 'e2b'

const made = []
async function create(opts = {}) {
  const sbx = await Sandbox.create('base', { timeoutMs: 600_000, ...opts })
  made.push(sbx.sandboxId)
  return sbx
}
after(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
})

let sbx
test('create: a running sandbox with its info', { timeout: 120_000 }, async () => {
  sbx = await create({ metadata: { suite: 'e2b-sdk', n: '1' }, envs: { SANDBOX_WIDE: 'yes' } })
  assert.match(sbx.sandboxId, /^sb_/)
  assert.equal(await sbx.isRunning(), true)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.state, 'running')
  assert.equal(info.metadata.suite, 'e2b-sdk')
  assert.ok(info.endAt > info.startedAt)
})

test('commands: output, exit codes, env, cwd, user', { timeout: 60_000 }, async () => {
  const r = await sbx.commands.run('echo hello; echo oops >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\n')
  assert.equal(r.stderr, 'oops\n')
  await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  const env = await sbx.commands.run('echo $SANDBOX_WIDE $MINE; pwd; whoami', { envs: { MINE: 'mine' } })
  assert.equal(env.stdout, 'yes mine\n/home/user\nuser\n')
  const root = await sbx.commands.run('whoami; pwd', { user: 'root', cwd: '/tmp' })
  assert.equal(root.stdout, 'root\n/tmp\n')
  const streamed = []
  await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.2; done', { onStdout: (d) => streamed.push(d) })
  assert.equal(streamed.join(''), 'line1\nline2\nline3\n')
})

test('commands: background, stdin, list, connect, kill', { timeout: 60_000 }, async () => {
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'from stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  const done = await cat.wait()
  assert.equal(done.stdout, 'from stdin\n')

  const sleeper = await sbx.commands.run('sleep 120', { background: true, timeoutMs: 0 })
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === sleeper.pid), JSON.stringify(listed))
  const again = await sbx.commands.connect(sleeper.pid, { timeoutMs: 0 })
  assert.equal(await sbx.commands.kill(sleeper.pid), true)
  await assert.rejects(again.wait(), (e) => e instanceof CommandExitError)
  assert.equal(await sbx.commands.kill(999999), false)
})

test('files: write, read, list, rename, remove, missing files', { timeout: 60_000 }, async () => {
  const info = await sbx.files.write('notes/a.txt', 'content of a')
  assert.equal(info.path, '/home/user/notes/a.txt')
  assert.equal(await sbx.files.read('notes/a.txt'), 'content of a')
  assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'content of a')
  const many = await sbx.files.write([
    { path: '/tmp/one.txt', data: '1' },
    { path: 'two.txt', data: '2' },
  ])
  assert.deepEqual(many.map((e) => e.path).sort(), ['/home/user/two.txt', '/tmp/one.txt'])
  const bytes = new Uint8Array([0, 1, 2, 255])
  await sbx.files.write('bin.dat', bytes.buffer)
  assert.deepEqual(new Uint8Array(await sbx.files.read('bin.dat', { format: 'bytes' })), bytes)
  // gzip: true uploads a compressed octet-stream body; the front end inflates it as it arrives.
  const big = 'compressible line\n'.repeat(20000)
  await sbx.files.write('gz.txt', big, { gzip: true })
  assert.equal(await sbx.files.read('gz.txt', { gzip: true }), big)
  const tagged = await sbx.files.write('tagged.txt', 'x', { metadata: { Owner: 'me', stage: 'raw' } })
  assert.deepEqual(tagged.metadata, { owner: 'me', stage: 'raw' })
  assert.deepEqual((await sbx.files.getInfo('tagged.txt')).metadata, { owner: 'me', stage: 'raw' })
  const entries = await sbx.files.list('notes')
  assert.deepEqual(entries.map((e) => e.name), ['a.txt'])
  assert.equal(await sbx.files.exists('notes/a.txt'), true)
  assert.equal(await sbx.files.makeDir('notes/sub'), true)
  assert.equal(await sbx.files.makeDir('notes/sub'), false)
  await sbx.files.rename('notes/a.txt', 'notes/b.txt')
  assert.equal(await sbx.files.exists('notes/a.txt'), false)
  await sbx.files.remove('notes/b.txt')
  await assert.rejects(sbx.files.read('notes/b.txt'), (e) => e instanceof FileNotFoundError)
})

test('files: signed URLs, and an expired signature is refused', { timeout: 60_000 }, async () => {
  await sbx.files.write('signed.txt', 'signed content')
  const url = await sbx.downloadUrl('signed.txt', { useSignatureExpiration: 60 })
  const res = await fetch(url)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'signed content')
  const up = await sbx.uploadUrl('uploaded.txt')
  const form = new FormData()
  form.append('file', 'file content')
  const posted = await fetch(up, { method: 'POST', body: form })
  assert.equal(posted.status, 200, await posted.clone().text())
  assert.equal(await sbx.files.read('uploaded.txt'), 'file content')
  const expired = await sbx.downloadUrl('signed.txt', { useSignatureExpiration: -120 })
  const refused = await fetch(expired)
  assert.equal(refused.status, 401)
  assert.deepEqual(await refused.json(), { code: 401, message: 'signature is already expired' })
})

test('files: Range on download, as envd serves it', { timeout: 60_000 }, async () => {
  await sbx.files.write('ranged.txt', '0123456789')
  const url = await sbx.downloadUrl('ranged.txt')
  const get = (range) => fetch(url, { headers: range ? { Range: range } : {} })
  const part = await get('bytes=2-5')
  assert.equal(part.status, 206)
  assert.equal(part.headers.get('content-range'), 'bytes 2-5/10')
  assert.equal(await part.text(), '2345')
  const tail = await get('bytes=-3')
  assert.equal(tail.status, 206)
  assert.equal(await tail.text(), '789')
  const open = await get('bytes=7-')
  assert.equal(await open.text(), '789')
  const past = await get('bytes=10-')
  assert.equal(past.status, 416)
  assert.equal(past.headers.get('content-range'), 'bytes */10')
  await past.arrayBuffer()
  const whole = await get('bytes=1-2,4-5') // several ranges: the whole file, as the RFC allows
  assert.equal(whole.status, 200)
  assert.equal(whole.headers.get('accept-ranges'), 'bytes')
  assert.equal(await whole.text(), '0123456789')
})

test('pty: a shell with a size, input and a resize', { timeout: 60_000 }, async () => {
  let out = ''
  const decoder = new TextDecoder()
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (out += decoder.decode(d)), timeoutMs: 0 })
  const waitFor = async (text) => {
    for (let i = 0; i < 100 && !out.includes(text); i++) await new Promise((r) => setTimeout(r, 100))
    assert.ok(out.includes(text), `no ${JSON.stringify(text)} in ${JSON.stringify(out)}`)
  }
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size\n'))
  await waitFor('24 80')
  await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; exit\n'))
  await waitFor('30 100')
  await pty.wait()
})

test('ports: a server in the guest is reached through E2b-Sandbox-Port with the traffic token', { timeout: 60_000 }, async () => {
  await sbx.files.write('site/index.html', 'hello from port 8000')
  await sbx.commands.run('cd ~/site && python3 -m http.server 8000 --bind 0.0.0.0', { background: true, timeoutMs: 0 })
  const get = (headers) =>
    fetch(`${process.env.E2B_SANDBOX_URL}/index.html`, {
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000', ...headers },
    })
  let res
  for (let i = 0; i < 50; i++) {
    res = await get({ 'e2b-traffic-access-token': sbx.trafficAccessToken })
    if (res.status === 200) break
    await new Promise((r) => setTimeout(r, 200))
  }
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'hello from port 8000')
  assert.equal((await get({})).status, 401) // private unless made with allowPublicTraffic
  // The traffic token opens ports only, never envd (where it would run commands as root).
  const envd = await fetch(`${process.env.E2B_SANDBOX_URL}/process.Process/List`, {
    method: 'POST',
    headers: {
      'E2b-Sandbox-Id': sbx.sandboxId,
      'X-Access-Token': sbx.trafficAccessToken,
      'Content-Type': 'application/json',
    },
    body: '{}',
  })
  assert.equal(envd.status, 401)
})

test('watchDir: events for files written in the directory', { timeout: 60_000 }, async () => {
  await sbx.files.makeDir('watched')
  const events = []
  const handle = await sbx.files.watchDir('watched', (e) => events.push(e))
  await sbx.files.write('watched/x.txt', 'x')
  for (let i = 0; i < 50 && !events.some((e) => e.name === 'x.txt'); i++) await new Promise((r) => setTimeout(r, 100))
  await handle.stop()
  assert.ok(events.some((e) => e.name === 'x.txt'), JSON.stringify(events))
  await assert.rejects(sbx.files.watchDir('no-such-dir', () => {}), (e) => e instanceof FileNotFoundError)
})

test("watchers: the Python SDK's CreateWatcher, GetWatcherEvents, RemoveWatcher", { timeout: 60_000 }, async () => {
  // The JS SDK streams WatchDir; the Python sync SDK polls these, so they are called raw here.
  const rpc = async (method, body, id = sbx.sandboxId) => {
    const res = await fetch(`${process.env.E2B_SANDBOX_URL}/filesystem.Filesystem/${method}`, {
      method: 'POST',
      headers: { 'E2b-Sandbox-Id': id, 'X-Access-Token': sbx.envdAccessToken, 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
    })
    return { status: res.status, body: await res.json() }
  }
  await sbx.files.makeDir('polled')
  const created = await rpc('CreateWatcher', { path: 'polled', recursive: false })
  assert.equal(created.status, 200, JSON.stringify(created.body))
  const watcherId = created.body.watcherId
  assert.ok(watcherId)
  await sbx.files.write('polled/y.txt', 'y')
  let names = []
  for (let i = 0; i < 50 && !names.includes('y.txt'); i++) {
    const got = await rpc('GetWatcherEvents', { watcherId })
    assert.equal(got.status, 200, JSON.stringify(got.body))
    names.push(...got.body.events.map((e) => e.name))
    if (!names.includes('y.txt')) await new Promise((r) => setTimeout(r, 100))
  }
  assert.ok(names.includes('y.txt'), JSON.stringify(names))
  assert.deepEqual((await rpc('GetWatcherEvents', { watcherId })).body.events, [])
  assert.equal((await rpc('RemoveWatcher', { watcherId })).status, 200)
  assert.equal((await rpc('GetWatcherEvents', { watcherId })).body.code, 'not_found')
  assert.equal((await rpc('CreateWatcher', { path: 'no-such-dir' })).body.code, 'not_found')
})

test('snapshots: create, list, start from one, fork, delete', { timeout: 180_000 }, async () => {
  await sbx.files.write('before-snapshot.txt', 'saved')
  const snap = await sbx.createSnapshot({ name: 'sdk-snap' })
  assert.ok(snap.snapshotId)
  assert.deepEqual(snap.names, ['sdk-snap'])
  const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), JSON.stringify(listed))
  const restored = await Sandbox.create(snap.snapshotId, { timeoutMs: 600_000 })
  made.push(restored.sandboxId)
  assert.equal(await restored.files.read('before-snapshot.txt'), 'saved')
  const forks = await sbx.fork({ count: 2 })
  assert.equal(forks.length, 2)
  for (const f of forks) {
    assert.ok(!(f instanceof Error), String(f))
    made.push(f.sandboxId)
    assert.notEqual(f.sandboxId, sbx.sandboxId)
    assert.equal(await f.files.read('before-snapshot.txt'), 'saved')
    await f.kill()
  }
  await restored.kill()
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
})

test('network: allow_internet_access and allow/deny lists become the gateway policy', { timeout: 120_000 }, async () => {
  const closed = await create({ allowInternetAccess: false })
  let info = await closed.getInfo()
  assert.equal(info.allowInternetAccess, false)
  // What SPACE's own API says the gateway enforces (its tests prove the enforcement).
  const spacePolicy = async (id) => {
    const res = await fetch(`${process.env.SPACE_API}/v1/sandboxes/${id}/network`, {
      headers: { Authorization: `Bearer ${process.env.E2B_API_KEY}` },
    })
    assert.equal(res.status, 200)
    return res.json()
  }
  assert.equal((await spacePolicy(closed.sandboxId)).egress, 'deny')
  await closed.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: ['example.com'] })
  const only = await spacePolicy(closed.sandboxId)
  assert.equal(only.egress, 'policy')
  assert.deepEqual(only.allow, ['example.com'])
  info = await closed.getInfo()
  assert.deepEqual(info.network.allowOut, ['example.com'])
  await closed.updateNetwork({ denyOut: ['evil.example'] })
  const open = await spacePolicy(closed.sandboxId)
  assert.equal(open.egress, 'allow')
  assert.deepEqual(open.deny, ['evil.example'])
  await assert.rejects(closed.updateNetwork({ egressProxy: { address: '127.0.0.1:1080' } }), /egressProxy/)
  await closed.kill()
})

test('network.rules: header transforms become credential rules the gateway injects', { timeout: 120_000 }, async () => {
  const space = (method, path, body) =>
    fetch(`${process.env.SPACE_API}${path}`, {
      method,
      headers: { Authorization: `Bearer ${process.env.E2B_API_KEY}`, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
  // Values are SPACE secrets, named in the transform: a literal would be kept in clear.
  assert.ok((await space('PUT', '/v1/secrets/e2b-test-key', { value: 'k1-secret-value' })).ok)
  const rules = {
    'api.example.com': [{ transform: { headers: { 'X-Api-Key': '{{secret:e2b-test-key}}', Authorization: 'Bearer {{secret:e2b-test-key}}' } } }],
  }
  const sandbox = await create({ network: { rules } })
  const credentials = async () => {
    const res = await space('GET', `/v1/sandboxes/${sandbox.sandboxId}/network`)
    assert.equal(res.status, 200)
    return (await res.json()).credentials
  }
  let got = await credentials()
  assert.equal(got.length, 1)
  assert.equal(got[0].host, 'api.example.com')
  assert.deepEqual(got[0].headers, { 'X-Api-Key': '{{secret:e2b-test-key}}', Authorization: 'Bearer {{secret:e2b-test-key}}' })
  // An update without rules keeps them; one with rules replaces them.
  await sandbox.updateNetwork({ denyOut: ['evil.example'] })
  assert.equal((await credentials()).length, 1)
  await sandbox.updateNetwork({ rules: { '*.example.org': [{ transform: { headers: { 'X-B': '{{secret:e2b-test-key}}' } } }] } })
  got = await credentials()
  assert.deepEqual(got.map((r) => [r.host, r.headers]), [['*.example.org', { 'X-B': '{{secret:e2b-test-key}}' }]])
  // Refused, naming the field: a literal value, a secret the tenant does not have, an IAM token.
  await assert.rejects(
    sandbox.updateNetwork({ rules: { 'api.example.com': [{ transform: { headers: { A: 'literal-value' } } }] } }),
    /literal values are not kept/,
  )
  await assert.rejects(
    sandbox.updateNetwork({ rules: { 'api.example.com': [{ transform: { headers: { A: '{{secret:nope}}' } } }] } }),
    /no secret named nope/,
  )
  await assert.rejects(
    sandbox.updateNetwork({
      rules: { 'api.example.com': [{ transform: ({ iam }) => ({ headers: { Authorization: iam.tokens.gh } }) }] },
    }),
    /IAM tokens/,
  )
  assert.equal((await credentials())[0].host, '*.example.org') // nothing changed
  await sandbox.kill()
  assert.equal((await space('DELETE', '/v1/secrets/e2b-test-key')).status, 204)
})

test('list: metadata filter and paging', { timeout: 120_000 }, async () => {
  const second = await create({ metadata: { suite: 'e2b-sdk', n: '2' } })
  const seen = []
  const pages = Sandbox.list({ query: { metadata: { suite: 'e2b-sdk' } }, limit: 1 })
  while (pages.hasNext) seen.push(...(await pages.nextItems()))
  assert.deepEqual(seen.map((s) => s.sandboxId).sort(), [sbx.sandboxId, second.sandboxId].sort())
  const one = await Sandbox.list({ query: { metadata: { n: '2' } } }).nextItems()
  assert.deepEqual(one.map((s) => s.sandboxId), [second.sandboxId])
  assert.equal(await second.kill(), true)
  assert.equal(await Sandbox.kill(second.sandboxId), false)
  await assert.rejects(Sandbox.getInfo(second.sandboxId), (e) => e instanceof SandboxNotFoundError)
})

test('pause and connect keep files and running processes', { timeout: 180_000 }, async () => {
  await sbx.files.write('kept.txt', 'still here')
  const counter = await sbx.commands.run('i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done', {
    background: true,
    timeoutMs: 0,
  })
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.pause(sbx.sandboxId), false) // already paused
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  const back = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await back.isRunning(), true)
  assert.equal(await back.files.read('kept.txt'), 'still here')
  const listed = await back.commands.list()
  assert.ok(listed.some((p) => p.pid === counter.pid), 'the background process survived the pause')
  sbx = back
})

test('autoResume: traffic wakes a sandbox its timeout paused; without it, it stays paused', { timeout: 120_000 }, async () => {
  const lifecycle = (autoResume) => ({ timeoutMs: 4_000, lifecycle: { onTimeout: 'pause', autoResume } })
  const [woken, asleep] = await Promise.all([create(lifecycle(true)), create(lifecycle(false))])
  await Promise.all([woken.files.write('note.txt', 'kept'), asleep.files.write('note.txt', 'kept')])
  assert.equal((await woken.getInfo()).lifecycle.autoResume, true)
  for (let i = 0; i < 60 && (await Sandbox.getInfo(woken.sandboxId)).state !== 'paused'; i++) {
    await new Promise((r) => setTimeout(r, 500))
  }
  assert.equal((await Sandbox.getInfo(woken.sandboxId)).state, 'paused')
  // (Resumed, it has its 4 s again before the next pause: ample for one read.)
  assert.equal(await woken.files.read('note.txt'), 'kept')
  for (let i = 0; i < 60 && (await Sandbox.getInfo(asleep.sandboxId)).state !== 'paused'; i++) {
    await new Promise((r) => setTimeout(r, 500))
  }
  await assert.rejects(asleep.files.read('note.txt'))
  assert.equal((await Sandbox.getInfo(asleep.sandboxId)).state, 'paused')
  await Promise.all([woken.kill(), asleep.kill()])
})

test('setTimeout, and a timeout that really expires', { timeout: 120_000 }, async () => {
  await sbx.setTimeout(300_000)
  const info = await sbx.getInfo()
  assert.ok(Math.abs(info.endAt.getTime() - Date.now() - 300_000) < 10_000)
  const short = await create({ timeoutMs: 3_000 })
  await new Promise((r) => setTimeout(r, 6_000))
  assert.equal(await short.isRunning(), false)
  await assert.rejects(short.getInfo(), (e) => e instanceof SandboxNotFoundError)
})

test('a sandbox killed during a command ends the command with an error', { timeout: 120_000 }, async () => {
  const victim = await create()
  const running = await victim.commands.run('sleep 60', { background: true, timeoutMs: 0 })
  assert.equal(await Sandbox.kill(victim.sandboxId), true)
  await assert.rejects(running.wait())
  assert.equal(await victim.isRunning(), false)
})

test('concurrency: commands in several sandboxes at once, each on its own stream', { timeout: 120_000 }, async () => {
  const others = await Promise.all([create(), create()])
  const all = [sbx, ...others]
  const runs = all.flatMap((s, n) =>
    Array.from({ length: 8 }, (_, i) => s.commands.run(`sleep 0.$((RANDOM % 5)); echo ${n}-${i}`)),
  )
  const results = await Promise.all(runs)
  assert.deepEqual(
    results.map((r) => r.stdout.trim()).sort(),
    all.flatMap((_, n) => Array.from({ length: 8 }, (_, i) => `${n}-${i}`)).sort(),
  )
  await Promise.all(others.map((s) => s.kill()))
})

test('getMetrics: what the sandbox costs, sampled every 5 s', { timeout: 60_000 }, async () => {
  // The guest's own figures (memCache among them) once its agent has answered.
  let metrics = []
  for (let i = 0; i < 60 && (metrics.length === 0 || metrics[metrics.length - 1].memCache === undefined); i++) {
    metrics = await sbx.getMetrics()
    if (metrics.length === 0 || metrics[metrics.length - 1].memCache === undefined) {
      await new Promise((r) => setTimeout(r, 500))
    }
  }
  assert.ok(metrics.length > 0, 'no samples')
  const m = metrics[metrics.length - 1]
  assert.ok(m.memCache >= 0 && m.memUsed < m.memTotal && m.diskUsed > 0 && m.diskUsed < m.diskTotal, JSON.stringify(m))
  assert.ok(m.timestamp instanceof Date && Math.abs(m.timestamp.getTime() - Date.now()) < 600_000)
  assert.ok(m.cpuCount >= 1 && m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m))
  assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal * 2 && m.memTotal >= 128 << 20, JSON.stringify(m))
  assert.ok(m.diskTotal > 0, JSON.stringify(m))
  const none = await sbx.getMetrics({ start: new Date(Date.now() + 3600_000) })
  assert.deepEqual(none, [])
})

test('errors: unknown ids', { timeout: 30_000 }, async () => {
  await assert.rejects(Sandbox.connect('sb_doesnotexist0000000'), (e) => e instanceof SandboxNotFoundError)
  assert.equal(await Sandbox.kill('sb_doesnotexist0000000'), false)
})
