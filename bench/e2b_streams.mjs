// Many long-lived E2B streams at once: SANDBOXES sandboxes, each running COMMANDS background
// commands through the unmodified e2b SDK; every command holds its own HTTP/1.1 connection to
// spaced's envd front end until it ends. Measures the start latency of those commands, an
// exec's latency before and while they are all open, the connections and spaced's threads and
// memory at the peak, and checks that every command's output arrives.
// Run through tests/e2b/run.sh (bench/e2b_streams.sh does), which starts spaced and sets E2B_*.
const { Sandbox } = await import(process.env.E2B_SDK)
import { readFileSync } from 'node:fs'
import { execFileSync } from 'node:child_process'

const SANDBOXES = Number(process.env.SANDBOXES || 10)
const COMMANDS = Number(process.env.COMMANDS || 50)
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]
}
const ms = (t) => Number((performance.now() - t).toFixed(1))
const procStatus = () => {
  const text = readFileSync(`/proc/${process.env.SPACED_PID}/status`, 'utf8')
  const field = (name) => Number(text.match(new RegExp(`^${name}:\\s+(\\d+)`, 'm'))[1])
  return { threads: field('Threads'), rss_mb: Math.round(field('VmRSS') / 1024) }
}
const envdPort = new URL(process.env.E2B_SANDBOX_URL).port
const connections = () =>
  execFileSync('ss', ['-Htn', 'state', 'established', `( sport = :${envdPort} )`], { encoding: 'utf8' })
    .split('\n')
    .filter(Boolean).length
const probe = async (sbx, n) => {
  const times = []
  for (let i = 0; i < n; i++) {
    const t = performance.now()
    await sbx.commands.run('true')
    times.push(ms(t))
  }
  return { p50: pct(times, 50), p99: pct(times, 99) }
}

const t0 = performance.now()
const sandboxes = await Promise.all(
  Array.from({ length: SANDBOXES }, () => Sandbox.create('base', { timeoutMs: 900_000 })),
)
const created_ms = ms(t0)
const before = { exec: await probe(sandboxes[0], 20), ...procStatus(), connections: connections() }

// Started one after another: under TCG on 2 cores, ten guests each forking bash at once starve
// each other (the agent gives a child 5 s to reach exec). Each command blocks, costing no CPU,
// opening the FIFO /tmp/go until it is written, so all of them are open together however long
// starting them takes.
const starts = []
const handles = []
await Promise.all(sandboxes.map((sbx) => sbx.commands.run('mkfifo /tmp/go')))
const t1 = performance.now()
for (const sbx of sandboxes) {
  for (let i = 0; i < COMMANDS; i++) {
    const t = performance.now()
    const h = await sbx.commands.run(`read x < /tmp/go; echo done-${i}`, {
      background: true,
      timeoutMs: 0,
    })
    starts.push(ms(t))
    handles.push({ h, i })
  }
}
const all_started_ms = ms(t1)
const peak = { exec: await probe(sandboxes[0], 20), ...procStatus(), connections: connections() }
const t2 = performance.now()
await Promise.all(sandboxes.map((sbx) => sbx.commands.run('echo go > /tmp/go')))
const results = await Promise.all(handles.map(({ h, i }) => h.wait().then((r) => r.stdout === `done-${i}\n`)))
const all_ended_ms = ms(t2)
const ok = results.filter(Boolean).length
await Promise.all(sandboxes.map((s) => s.kill()))
const out = {
  sandboxes: SANDBOXES,
  commands_per_sandbox: COMMANDS,
  streams: handles.length,
  outputs_correct: ok,
  create_all_ms: created_ms,
  start_ms: { p50: pct(starts, 50), p99: pct(starts, 99), all: all_started_ms },
  release_to_all_ended_ms: all_ended_ms,
  before,
  while_open: peak,
}
console.log(JSON.stringify(out, null, 1))
if (ok !== handles.length || peak.connections < handles.length) process.exit(1)
