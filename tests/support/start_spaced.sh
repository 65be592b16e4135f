# Sourced by the suites driven from a shell (tests/e2b, tests/ui): starts a real spaced on a
# data dir and port of its own and waits until it has written its endpoint file.
#
#   start_spaced BUILD_DIR WORK_DIR [SPACED_ARG]...
#
# Data in WORK_DIR/data, output in WORK_DIR/spaced.log; sets spaced_pid (the caller's cleanup
# stops it). Exits 1, with the log's tail, if spaced does not come up within 30 s.
start_spaced() {
  local build=$1 work=$2
  shift 2
  "$build/bin/spaced" --listen 127.0.0.1:0 --data-dir "$work/data" --on-shutdown stop --log-level debug "$@" \
    >"$work/spaced.log" 2>&1 &
  spaced_pid=$!
  for _ in $(seq 300); do
    [[ -s $work/data/spaced.json ]] && break
    kill -0 "$spaced_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ ! -s $work/data/spaced.json ]]; then
    echo "start_spaced: spaced did not come up:" >&2
    tail -50 "$work/spaced.log" >&2
    exit 1
  fi
}
