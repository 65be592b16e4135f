// Runs an async job now and then every intervalMs (a number, or a function answering the next
// delay or null for "not again"), never two at once: asking while one runs runs it once more
// right after.
export function poller(job, intervalMs) {
  let timer = null;
  let running = false;
  let again = false;
  let stopped = false;
  async function tick() {
    if (stopped) return;
    if (running) { again = true; return; }
    clearTimeout(timer);
    timer = null;
    running = true;
    try {
      await job();
    } catch (e) {
      console.error(e); // jobs report their own errors; this is a bug in one
    } finally {
      running = false;
      if (!stopped) {
        const ms = again ? 0 : (typeof intervalMs === 'function' ? intervalMs() : intervalMs);
        again = false;
        if (ms !== null && ms !== undefined) timer = setTimeout(tick, ms);
      }
    }
  }
  return {
    now: tick,
    stop() { stopped = true; clearTimeout(timer); },
  };
}
