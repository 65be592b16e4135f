// Lifecycle benchmark: what a sandbox's life costs through spaced, each number next to a
// baseline from the same run (these machines are too noisy to compare across runs).
//   create:     create -> first exec with a warm pool; baselines: no pool (QEMU started per
//               request), cold boot (--no-snapshots), and the floor: Vm::prepare + Vm::restore
//               in-process from the same template snapshot, no daemon.
//   concurrent: N creates sent at once; baseline: the same N sent one after another.
//   ops:        pause/resume, suspend/resume, snapshot of a sandbox with a process running;
//               baseline: GET of the same sandbox (HTTP + auth + store, no VM work).
//   branch:     POST /v1/snapshots/{id}/branch with count c, on one spaced per --branch-workers
//               value (children started at once: 1 = one after another); baseline: one create
//               from the snapshot. Also the source's pause for each snapshot (spaced's log), and
//               in-process the stop-and-copy capture's pause (pause, freeze, save, resume).
//   memory:     host memory (PSS) per idle restored sandbox, split into guest pages and QEMU's
//               own; baseline: a cold-booted sandbox.
//   dos:        exec `true` in one sandbox while another attacks from inside (fork bomb, OOM
//               loop, disk fill, a million files, a stdout flood read by a client) or from the
//               API (48 clients calling exec, 512 slowloris connections); baseline: the same
//               loop with the attacker idle, before and after.
// Every sandbox has 1 vCPU and 256 MB. Each spaced gets its own temporary data dir and API key,
// and the first create of each (the template snapshot build) is not counted. Only one spaced
// runs at a time and nothing else is measured meanwhile.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <latch>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apiclient/api_client.h"
#include "cli/default_images.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/process.h"
#include "http/tcp.h"
#include "percentiles.h"  // next to this file
#include "vmm/accelerator.h"
#include "vmm/vm.h"

namespace {

using namespace space;
using nlohmann::json;
using Ms = std::chrono::duration<double, std::milli>;
using std::chrono::milliseconds;
using std::chrono::seconds;

using bench::Stats;
using bench::stats;

struct Options {
  int creates = 200;
  int warm_pool = 2;
  bool unpaced = false;
  int baseline_creates = 30;
  int cold_creates = 10;
  int floor = 30;
  int concurrent = 20;
  int ops = 20;
  int snapshots = 10;
  std::vector<int> branch{10, 50};
  int branch_baseline = 5;
  // One spaced per entry, `--branch-workers` of it (0: spaced's default, one per host CPU).
  std::vector<int> branch_workers{0, 1};
  int pause_snapshots = 5;
  int memory_sandboxes = 10;
  int cold_memory_sandboxes = 3;
  int idle_s = 5;
  int dos_seconds = 10;
  std::set<std::string> skip;
  bool json = false;
};

// --- spaced processes, and leaving nothing behind -----------------------------------------

struct Daemon {
  std::string name;
  std::string dir;       // <root>/<name>: log and data dir
  std::string data_dir;  // canonical, as spaced names it on QEMU command lines
  std::optional<ChildProcess> process;
  std::optional<apiclient::Client> api;
};

// What the cleanup needs, reachable from die() and the signal thread: exit() runs no
// destructors of main's locals, and a spaced killed without its shutdown leaves its QEMUs running.
std::mutex g_cleanup_mu;
std::string g_root;
std::vector<std::unique_ptr<Daemon>> g_daemons;
// Set by the signal thread: the requests then failing on the main thread are no news.
std::atomic<bool> g_interrupted{false};

// Kills (SIGKILL) every process whose command line names a path under `dir`: QEMUs of a spaced
// that did not stop them, or of the in-process floor. Our own pid is never in there.
void killStrays(const std::string& dir) {
  if (dir.empty()) return;
  const std::string needle = dir + "/";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const pid_t pid = static_cast<pid_t>(atoi(name.c_str()));
    if (pid != getpid() && cmdline.find(needle) != std::string::npos) ::kill(pid, SIGKILL);
  }
}

// spaced runs with --on-shutdown stop: SIGTERM makes it power off its VMs and its pool.
void stopDaemonLocked(Daemon& d) {
  if (!d.process) return;
  d.process->terminate(seconds(120));
  d.process.reset();
  killStrays(d.dir);
}

void stopDaemon(Daemon& d) {
  std::lock_guard lock(g_cleanup_mu);
  stopDaemonLocked(d);
}

// All daemons and VMs go; the directory too, except spaced's logs after a failure.
void cleanupAll(bool success) {
  std::lock_guard lock(g_cleanup_mu);
  for (auto& d : g_daemons) {
    if (d->process) ::kill(d->process->pid(), SIGTERM);  // all shut down in parallel
  }
  for (auto& d : g_daemons) stopDaemonLocked(*d);
  killStrays(g_root);
  if (g_root.empty()) return;
  std::error_code ec;
  if (success) {
    std::filesystem::remove_all(g_root, ec);
  } else {
    for (const auto& sub : {"pool", "no-pool", "cold"}) std::filesystem::remove_all(g_root + "/" + sub + "/data", ec);
    std::filesystem::remove_all(g_root + "/floor", ec);
    bool logs = false;
    for (const auto& e : std::filesystem::recursive_directory_iterator(g_root, ec)) logs |= e.is_regular_file();
    if (logs) {
      fprintf(stderr, "space-lifecycle-bench: spaced logs kept in %s\n", g_root.c_str());
    } else {
      std::filesystem::remove_all(g_root, ec);
    }
  }
  g_root.clear();
}

[[noreturn]] void die(const std::string& what) {
  if (g_interrupted) {
    for (;;) pause();  // the signal thread cleans up and exits
  }
  fprintf(stderr, "space-lifecycle-bench: %s\n", what.c_str());
  cleanupAll(false);
  exit(1);
}

// Resolved like spaced does: QEMU command lines and disk overlays name the real files.
std::string imagePath(const char* env, const char* name) {
  std::string path = std::string(SPACE_IMAGES_DIR) + "/" + name;
  if (const char* v = getenv(env); v != nullptr && *v != '\0') path = v;
  std::error_code ec;
  auto real = std::filesystem::canonical(path, ec);
  if (ec) die(path + ": " + ec.message() + " (build the images: make images)");
  return real.string();
}

std::string fileTail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

Daemon& startDaemon(const std::string& name, const std::vector<std::string>& extra,
                    const std::string& log_level = "warn") {
  auto owned = std::make_unique<Daemon>();
  Daemon& d = *owned;
  d.name = name;
  d.dir = g_root + "/" + name;
  std::error_code ec;
  std::filesystem::create_directories(d.dir, ec);
  if (ec) die("create " + d.dir + ": " + ec.message());
  const std::string data_dir = d.dir + "/data";
  std::vector<std::string> argv{SPACED_BIN, "--listen", "127.0.0.1:0", "--e2b-api-listen", "off", "--e2b-envd-listen",
                                "off", "--data-dir", data_dir, "--kernel", imagePath("SPACE_KERNEL", "vmlinux"),
                                "--rootfs", imagePath("SPACE_ROOTFS", "rootfs.ext4"), "--log-level", log_level,
                                "--on-shutdown", "stop", "--default-cpus", "1", "--default-memory-mb", "256",
                                // No NIC: the numbers recorded so far are without one, and a
                                // benchmark must not reach the host's network (see net_bench).
                                "--network", "off",
                                // The default (4 x host CPUs: 8 here) would refuse the 9th sandbox
                                // of a branch or a concurrent burst before memory runs out.
                                "--max-vcpus", "256", "--max-sandboxes", "64", "--max-branch", "64"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const std::string log = d.dir + "/spaced.log";
  auto process = ChildProcess::spawn(argv, SpawnOptions{log, "", true});
  if (!process.ok()) die("spawn spaced: " + process.error().message);
  {
    std::lock_guard lock(g_cleanup_mu);
    d.process.emplace(std::move(process.value()));
    g_daemons.push_back(std::move(owned));
  }
  std::optional<apiclient::Endpoint> endpoint;
  std::string not_yet;
  for (int i = 0; i < 6000 && !endpoint; ++i) {
    if (auto e = apiclient::endpointOfDataDir(data_dir); e.ok()) {
      endpoint = std::move(e.value());
    } else if (auto exited = d.process->tryWait()) {
      die("spaced (" + name + ") exited: " + exited->describe() + "\n" + fileTail(log, 2000));
    } else {
      not_yet = e.error().message;
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  if (!endpoint) die("spaced (" + name + ") did not start within 60 s: " + not_yet + "\n" + fileTail(log, 2000));
  auto api = apiclient::Client::create(std::move(*endpoint));
  if (!api.ok()) die(api.error().message);
  d.api.emplace(std::move(api.value()));
  d.data_dir = std::filesystem::canonical(data_dir).string();
  return d;
}

// --- requests -----------------------------------------------------------------------------

// The answer of a call that must succeed; anything else ends the run with spaced's log.
json call(Daemon& d, const std::string& method, const std::string& target, const std::optional<json>& body = {},
          milliseconds timeout = seconds(60)) {
  auto r = d.api->call(method, target, body, timeout);
  if (!r.ok()) die(method + " " + target + ": " + r.error().message + "\n" + fileTail(d.dir + "/spaced.log", 2000));
  return std::move(r.value());
}

std::string idOf(const json& answer) {
  const json& id = apiclient::field(answer, "id");
  if (!id.is_string()) die("an answer without an id: " + answer.dump());
  return id.get<std::string>();
}

std::string createSandbox(Daemon& d, const json& body, milliseconds timeout = seconds(60)) {
  return idOf(call(d, "POST", "/v1/sandboxes", body, timeout));
}

void deleteSandbox(Daemon& d, const std::string& id) { call(d, "DELETE", apiclient::sandboxPath(id)); }

// A longer life than the default 300 s: the ops rounds alone can take minutes under TCG.
const json kLongLived{{"timeout_s", 7200}};

struct Pool {
  double ready = 0, target = 0;
};

Pool poolGauges(Daemon& d) {
  Pool p;
  auto metrics = d.api->send("GET", "/metrics", {}, "", seconds(60));
  if (!metrics.ok()) die("GET /metrics: " + metrics.error().message);
  std::istringstream in(metrics->body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("space_warm_pool_ready ", 0) == 0) p.ready = strtod(line.c_str() + 22, nullptr);
    if (line.rfind("space_warm_pool_target ", 0) == 0) p.target = strtod(line.c_str() + 23, nullptr);
  }
  return p;
}

// A refilling pool is a QEMU starting next to the measured request: waiting for it keeps the
// measurement about the create itself. False if the pool was still short at the cap.
bool waitPoolFull(Daemon& d, milliseconds cap) {
  const auto deadline = Clock::now() + cap;
  for (;;) {
    Pool p = poolGauges(d);
    if (p.ready >= p.target) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

// The template snapshot build (a cold boot and a save) happens on the first create; with a pool,
// the refill thread may be the one that does it.
void warmUp(Daemon& d) {
  deleteSandbox(d, createSandbox(d, json::object(), seconds(300)));
  waitPoolFull(d, seconds(300));
}

// --- reporting ----------------------------------------------------------------------------

json statsJson(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  Stats s = stats(v);
  return json{{"n", v.size()},
              {"p50", s.p50},
              {"p90", s.p90},
              {"p99", std::isnan(s.p99) ? json() : json(s.p99)},
              {"max", s.max}};
}

void printRow(const std::string& name, const std::vector<double>& v) {
  if (v.empty()) return;
  Stats s = stats(v);
  printf("  %-54s p50 %8.1f ms  p90 %8.1f  %s  max %8.1f  (n=%zu)\n", name.c_str(), s.p50, s.p90,
         bench::p99Text(s).c_str(), s.max, v.size());
}

void progress(const std::string& what) { fprintf(stderr, "space-lifecycle-bench: %s\n", what.c_str()); }

// --- 1. create -> first exec --------------------------------------------------------------

struct CreateLoop {
  std::vector<double> create, first_exec;
  int pool_full = 0;
};

CreateLoop createLoop(Daemon& d, int n, bool pooled, bool paced) {
  CreateLoop out;
  const json exec_true{{"argv", {"true"}}};
  for (int i = 0; i < n; ++i) {
    if (pooled) {
      bool full = paced ? waitPoolFull(d, seconds(60)) : [&] {
        Pool p = poolGauges(d);
        return p.ready >= p.target;
      }();
      if (full) ++out.pool_full;
    }
    auto t0 = Clock::now();
    std::string id = createSandbox(d, json::object());
    out.create.push_back(Ms(Clock::now() - t0).count());
    json e = call(d, "POST", apiclient::sandboxPath(id) + "/exec", exec_true);
    out.first_exec.push_back(Ms(Clock::now() - t0).count());
    if (apiclient::field(e, "exit_code") != 0) die("exec `true` failed: " + e.dump());
    deleteSandbox(d, id);
  }
  return out;
}

json createLoopJson(const CreateLoop& c) {
  return json{{"create_ms", statsJson(c.create)}, {"create_first_exec_ms", statsJson(c.first_exec)}};
}

// The base template snapshot spaced built under `data_dir`, and the spec of a 1 vCPU / 256 MB
// VM restored from it the way spaced restores a clone.
std::pair<std::string, vmm::VmSpec> templateRestoreSpec(const std::string& data_dir) {
  std::string snap;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data_dir + "/templates", ec)) {
    if (e.path().filename().string().rfind("base-", 0) == 0) snap = e.path().string();
  }
  if (snap.empty()) die("no template snapshot under " + data_dir + "/templates");
  auto accel = vmm::chooseAccelerator(vmm::Accelerator::kAuto, vmm::probeKvm());
  if (!accel.ok()) die(accel.error().message);
  vmm::VmSpec spec;
  spec.kernel_path = imagePath("SPACE_KERNEL", "vmlinux");
  spec.rootfs_path = snap + "/disk.qcow2";
  spec.qemu_binary = cli::defaultQemuBinary();  // the one spaced saved the template with
  spec.rootfs_format = "qcow2";
  spec.memory_file = snap + "/memory";
  spec.memory_private = true;
  spec.vcpus = 1;
  spec.memory_mib = 256;
  spec.accelerator = accel->accelerator;
  return {snap, spec};
}

struct Floor {
  std::vector<double> prepare, restore, running;
};

// The restore with nothing around it: no HTTP, no store, no identity refresh; prepare is what
// the pool takes off the request path.
Floor floorLoop(const std::string& data_dir, int n) {
  Floor out;
  std::error_code ec;
  auto [snap, spec] = templateRestoreSpec(data_dir);
  vmm::VmStartOptions options;
  options.run_root = g_root + "/floor";
  std::filesystem::create_directories(options.run_root, ec);
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    auto vm = vmm::Vm::prepare(spec, options);
    if (!vm.ok()) die("Vm::prepare: " + vm.error().message);
    out.prepare.push_back(Ms(Clock::now() - t0).count());
    t0 = Clock::now();
    auto restored = (*vm)->restore(snap + "/state", seconds(60));
    const double ms = Ms(Clock::now() - t0).count();
    if (!restored.ok()) {
      std::string m = restored.error().message;
      vm->reset();
      die("Vm::restore: " + m);
    }
    out.restore.push_back(ms);
    out.running.push_back(static_cast<double>((*vm)->bootTiming().to_running.count()));
    if (i == 0) {  // a restore that only looks done would flatter the floor
      auto r = (*vm)->exec("true", seconds(30));
      if (!r.ok() || r->exit_code != 0) {
        vm->reset();
        die("exec in the restored VM failed");
      }
    }
  }
  return out;
}

// --- 2. concurrent creates ----------------------------------------------------------------

struct Burst {
  std::vector<double> latency;
  double wall_ms = 0;
};

Burst sequentialBurst(Daemon& d, int n) {
  Burst b;
  std::vector<std::string> ids;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    auto s = Clock::now();
    ids.push_back(createSandbox(d, json::object(), seconds(300)));
    b.latency.push_back(Ms(Clock::now() - s).count());
  }
  b.wall_ms = Ms(Clock::now() - t0).count();
  for (const auto& id : ids) deleteSandbox(d, id);
  return b;
}

Burst concurrentBurst(Daemon& d, int n) {
  struct Slot {
    double ms = 0;
    Clock::time_point end;
    std::optional<json> created;
    std::string error;
  };
  std::vector<Slot> slots(static_cast<size_t>(n));
  std::latch go(1);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const apiclient::Client api = *d.api;
      Slot& s = slots[static_cast<size_t>(i)];
      go.wait();
      auto t0 = Clock::now();
      auto r = api.call("POST", "/v1/sandboxes", json::object(), seconds(600));
      s.end = Clock::now();
      s.ms = Ms(s.end - t0).count();
      if (r.ok()) {
        s.created = std::move(r.value());
      } else {
        s.error = r.error().message;
      }
    });
  }
  // Every thread is created and waiting on its own connection-less client: only the requests
  // themselves race.
  std::this_thread::sleep_for(milliseconds(100));
  auto t0 = Clock::now();
  go.count_down();
  for (auto& t : threads) t.join();
  Burst b;
  Clock::time_point last = t0;
  std::vector<std::string> ids;
  std::string failure;
  for (const auto& s : slots) {
    if (s.created) {
      ids.push_back(idOf(*s.created));
    } else if (failure.empty()) {
      failure = s.error;
    }
    b.latency.push_back(s.ms);
    last = std::max(last, s.end);
  }
  b.wall_ms = Ms(last - t0).count();
  for (const auto& id : ids) deleteSandbox(d, id);
  if (!failure.empty()) die("a concurrent create failed: " + failure);
  return b;
}

json burstJson(const Burst& b) {
  return json{{"create_ms", statsJson(b.latency)},
              {"wall_ms", b.wall_ms},
              {"creates_per_s", static_cast<double>(b.latency.size()) * 1000.0 / b.wall_ms}};
}

// --- 3. operations on one sandbox ---------------------------------------------------------

// Starts `sleep` through a streamed exec and hangs up once it has started: the process keeps
// running in the guest (what a suspend and a snapshot then have to carry along).
int64_t startBackgroundProcess(Daemon& d, const std::string& id) {
  const json body{{"argv", {"sleep", "1000000"}}, {"stream", true}, {"timeout_s", 0}};
  json first;
  auto r = d.api->streamLines(
      "POST", apiclient::sandboxPath(id) + "/exec", body,
      [&](const json& line) -> Status {
        first = line;
        return makeError(ErrorCode::kCanceled, "started");  // hangs up
      },
      seconds(60));
  const json& pid = apiclient::field(first, "pid");
  if (apiclient::field(first, "type") != "start" || !pid.is_number_integer()) {
    const std::string why = !first.is_null() ? first.dump() : !r.ok() ? r.error().message : "the stream ended";
    die("background process did not start: " + why);
  }
  return pid.get<int64_t>();
}

bool processRunning(Daemon& d, const std::string& id, int64_t pid) {
  json list = call(d, "GET", apiclient::sandboxPath(id) + "/processes");
  for (const auto& p : apiclient::field(list, "processes")) {
    if (apiclient::field(p, "pid") == pid) return true;
  }
  return false;
}

struct Ops {
  std::vector<double> get, pause, resume_paused, suspend, resume_suspended, snapshot;
  bool process_survived = false;
};

void timed(std::vector<double>& into, Daemon& d, const std::string& target, const std::string& state) {
  auto t0 = Clock::now();
  json r = call(d, "POST", target, std::nullopt, seconds(300));
  into.push_back(Ms(Clock::now() - t0).count());
  if (apiclient::field(r, "state") != state) die(target + ": not " + state + ": " + r.dump());
}

Ops opsLoop(Daemon& d, int n, int snapshots) {
  Ops o;
  waitPoolFull(d, seconds(60));
  const std::string id = createSandbox(d, kLongLived);
  const std::string sb = apiclient::sandboxPath(id);
  const int64_t pid = startBackgroundProcess(d, id);
  if (!processRunning(d, id, pid)) die("the background process is not listed");
  waitPoolFull(d, seconds(60));
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    call(d, "GET", sb);
    o.get.push_back(Ms(Clock::now() - t0).count());
  }
  for (int i = 0; i < n; ++i) {
    timed(o.pause, d, sb + "/pause", "paused");
    timed(o.resume_paused, d, sb + "/resume", "running");
  }
  for (int i = 0; i < n; ++i) {
    timed(o.suspend, d, sb + "/suspend", "suspended");
    timed(o.resume_suspended, d, sb + "/resume", "running");
  }
  for (int i = 0; i < snapshots; ++i) {
    auto t0 = Clock::now();
    json snapshot = call(d, "POST", sb + "/snapshots", json::object(), seconds(300));
    o.snapshot.push_back(Ms(Clock::now() - t0).count());
    call(d, "DELETE", apiclient::snapshotPath(idOf(snapshot)));
  }
  o.process_survived = processRunning(d, id, pid);
  deleteSandbox(d, id);
  return o;
}

// --- 4. branch ----------------------------------------------------------------------------

struct Branch {
  int workers = 0;                           // spaced's --branch-workers
  std::vector<double> single;                // one create from the snapshot
  std::vector<std::pair<int, double>> runs;  // count, ms until the 201
  std::vector<double> snapshot;              // POST .../snapshots -> 201 of the running source
  std::vector<double> paused;                // how long the source was stopped for each (spaced's log)
  double snapshot_idle = 0;                  // the branch's snapshot, of the source idle
  double paused_idle = 0;
};

// What spaced logged (at info) for each snapshot: "... (sandbox stopped for N ms; ...)".
std::vector<double> pausesLogged(const Daemon& d) {
  std::vector<double> out;
  std::ifstream in(d.dir + "/spaced.log");
  const std::string mark = "sandbox stopped for ";
  for (std::string line; std::getline(in, line);) {
    auto at = line.find(mark);
    if (at != std::string::npos) out.push_back(atof(line.c_str() + at + mark.size()));
  }
  return out;
}

// On a spaced of its own (no pool: nothing else starts VMs meanwhile), with info logs for the
// source's pauses.
Branch branchLoop(Daemon& d, int workers, const std::vector<int>& counts, int baseline, int pause_snapshots) {
  Branch b;
  b.workers = workers;
  const std::string source = createSandbox(d, kLongLived);
  // For the pauses the source is busy the way an agent's sandbox is: a process writing a little
  // memory (so dirtying pages while its RAM is copied) all the time. Not for the branch: every
  // child would inherit it.
  call(
      d, "POST", apiclient::sandboxPath(source) + "/exec",
      json{{"command",
            "setsid sh -c 'echo $$ > /tmp/busy.pid; while :; do date > /tmp/now; sleep 0.01; done' >/dev/null 2>&1 &"}},
      seconds(60));
  for (int i = 0; i < pause_snapshots; ++i) {
    auto t0 = Clock::now();
    const std::string extra =
        idOf(call(d, "POST", apiclient::sandboxPath(source) + "/snapshots", json::object(), seconds(300)));
    b.snapshot.push_back(Ms(Clock::now() - t0).count());
    call(d, "DELETE", apiclient::snapshotPath(extra));
  }
  b.paused = pausesLogged(d);
  call(d, "POST", apiclient::sandboxPath(source) + "/exec", json{{"command", "kill $(cat /tmp/busy.pid)"}},
       seconds(60));
  auto t0 = Clock::now();
  const std::string snap =
      idOf(call(d, "POST", apiclient::sandboxPath(source) + "/snapshots", json::object(), seconds(300)));
  b.snapshot_idle = Ms(Clock::now() - t0).count();
  auto all_paused = pausesLogged(d);
  if (all_paused.size() > b.paused.size()) b.paused_idle = all_paused.back();
  const json from_snapshot{{"snapshot", snap}, {"timeout_s", 7200}};
  for (int i = 0; i < baseline; ++i) {
    t0 = Clock::now();
    std::string id = createSandbox(d, from_snapshot, seconds(300));
    b.single.push_back(Ms(Clock::now() - t0).count());
    deleteSandbox(d, id);
  }
  for (int count : counts) {
    t0 = Clock::now();
    json r = call(d, "POST", apiclient::snapshotPath(snap) + "/branch", json{{"count", count}, {"timeout_s", 7200}},
                  seconds(600));
    b.runs.emplace_back(count, Ms(Clock::now() - t0).count());
    const json& children = apiclient::field(r, "sandboxes");
    if (!children.is_array() || children.size() != static_cast<size_t>(count)) die("branch answered " + r.dump());
    for (const auto& c : children) {
      if (apiclient::field(c, "state") != "running") die("a branch child is not running: " + c.dump());
      deleteSandbox(d, idOf(c));
    }
  }
  call(d, "DELETE", apiclient::snapshotPath(snap));
  deleteSandbox(d, source);
  return b;
}

// The source's pause in-process, on one guest restored from the template, with a process
// writing: the capture stops it, freezes the disk, streams all RAM and the devices, continues.
struct Pause {
  std::vector<double> stop_copy;
};

Pause pauseLoop(const std::string& data_dir, int n) {
  Pause out;
  std::error_code ec;
  auto [snap, spec] = templateRestoreSpec(data_dir);
  vmm::VmStartOptions options;
  options.run_root = g_root + "/floor";
  const std::string files = g_root + "/floor/pause";
  std::filesystem::create_directories(files, ec);
  options.restore_from = snap + "/state";
  auto vm = vmm::Vm::start(spec, options);
  if (!vm.ok()) die("Vm::start (restore): " + vm.error().message);
  auto busy =
      (*vm)->exec("setsid sh -c 'while :; do date > /tmp/now; sleep 0.01; done' >/dev/null 2>&1 &", seconds(30));
  if (!busy.ok() || busy->exit_code != 0) die("exec in the restored VM failed");
  int layer = 0;
  for (int i = 0; i < n; ++i) {
    const std::string stream = files + "/stream";
    auto t0 = Clock::now();
    Status done = (*vm)->pause();
    if (done.ok()) done = (*vm)->freezeDisk(files + "/layer-" + std::to_string(layer++) + ".qcow2");
    if (done.ok()) done = (*vm)->saveState(stream, seconds(60), /*ignore_shared=*/false);
    if (done.ok()) done = (*vm)->resume();
    if (!done.ok()) die("stop-and-copy save: " + done.error().message);
    out.stop_copy.push_back(Ms(Clock::now() - t0).count());
    std::this_thread::sleep_for(milliseconds(500));
  }
  auto alive = (*vm)->exec("cat /tmp/now", seconds(30));
  if (!alive.ok() || alive->exit_code != 0) die("the guest did not survive its saves");
  return out;
}

// --- 5. memory ----------------------------------------------------------------------------

struct VmMemory {
  double total_pss_kib = 0;
  double guest_pss_kib = 0;    // the private mapping of the template's memory file
  double guest_dirty_kib = 0;  // its Private_Dirty: guest pages this sandbox wrote
};

// QEMU's command line names files in its sandbox's directory; GET /v1/sandboxes has no pid.
pid_t qemuPidOf(const std::string& data_dir, const std::string& id) {
  const std::string needle = data_dir + "/sandboxes/" + id + "/";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(needle) != std::string::npos) return static_cast<pid_t>(atoi(name.c_str()));
  }
  return -1;
}

double kibField(const std::string& line, const char* field) { return strtod(line.c_str() + strlen(field), nullptr); }

VmMemory readMemory(pid_t pid) {
  VmMemory m;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream rollup(proc + "/smaps_rollup");
  for (std::string line; std::getline(rollup, line);) {
    if (line.rfind("Pss:", 0) == 0) m.total_pss_kib = kibField(line, "Pss:");
  }
  std::ifstream smaps(proc + "/smaps");
  bool guest = false;
  for (std::string line; std::getline(smaps, line);) {
    // A mapping's header starts with its address range ("7f12...-7f13... rw-p ..."); the field
    // lines that follow ("Pss:   12 kB") belong to it.
    const auto colon = line.find(':'), dash = line.find('-');
    if (dash != std::string::npos && (colon == std::string::npos || dash < colon) &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const auto slash = line.find('/');
      const std::string path = slash == std::string::npos ? "" : line.substr(slash);
      guest = path.find("/templates/") != std::string::npos && path.size() >= 7 &&
              path.compare(path.size() - 7, 7, "/memory") == 0;
    } else if (guest && line.rfind("Pss:", 0) == 0) {
      m.guest_pss_kib += kibField(line, "Pss:");
    } else if (guest && line.rfind("Private_Dirty:", 0) == 0) {
      m.guest_dirty_kib += kibField(line, "Private_Dirty:");
    }
  }
  if (m.total_pss_kib == 0) die("could not read " + proc + "/smaps_rollup");
  return m;
}

struct Memory {
  std::vector<VmMemory> vms;
  VmMemory mean() const {
    VmMemory s;
    for (const auto& v : vms) {
      s.total_pss_kib += v.total_pss_kib / static_cast<double>(vms.size());
      s.guest_pss_kib += v.guest_pss_kib / static_cast<double>(vms.size());
      s.guest_dirty_kib += v.guest_dirty_kib / static_cast<double>(vms.size());
    }
    return s;
  }
};

Memory memoryOf(Daemon& d, int n, int idle_s) {
  Memory out;
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    waitPoolFull(d, seconds(60));
    ids.push_back(createSandbox(d, kLongLived, seconds(300)));
  }
  waitPoolFull(d, seconds(60));
  std::this_thread::sleep_for(seconds(idle_s));
  for (const auto& id : ids) {
    pid_t pid = qemuPidOf(d.data_dir, id);
    if (pid < 0) die("no QEMU process found for " + id);
    out.vms.push_back(readMemory(pid));
  }
  for (const auto& id : ids) deleteSandbox(d, id);
  return out;
}

json memoryJson(const Memory& m, bool restored) {
  VmMemory s = m.mean();
  json j{{"sandboxes", m.vms.size()}, {"total_pss_mib", s.total_pss_kib / 1024}};
  if (restored) {
    j["guest_ram_mapping_pss_mib"] = s.guest_pss_kib / 1024;
    j["guest_dirtied_mib"] = s.guest_dirty_kib / 1024;
    j["overhead_mib"] = (s.total_pss_kib - s.guest_dirty_kib) / 1024;
  }
  return j;
}

// --- 6. guest DoS: one sandbox attacks, another's exec is measured --------------------------

// Each attack runs in its own fresh sandbox (deleted afterwards: a fork bomb leaves nothing to
// reuse) for --dos-seconds while a victim sandbox of the same size runs `true` back to back;
// the baseline is the same loop with the attacker idle, measured first and last.
struct Attack {
  std::string name;
  std::vector<double> victim;
  std::vector<double> host_late;  // how late a host thread woke from a 10 ms sleep, ms
  std::string done;               // what the attack achieved, in its own terms
};

std::vector<double> victimLoop(Daemon& d, const std::string& victim, seconds how_long) {
  std::vector<double> out;
  const json exec_true{{"argv", {"true"}}};
  const auto until = Clock::now() + how_long;
  while (Clock::now() < until) {
    auto t0 = Clock::now();
    json r = call(d, "POST", apiclient::sandboxPath(victim) + "/exec", exec_true, seconds(120));
    out.push_back(Ms(Clock::now() - t0).count());
    if (apiclient::field(r, "exit_code") != 0) die("the victim's exec failed: " + r.dump());
  }
  return out;
}

// The victim's loop, and meanwhile what the host itself feels: a thread of this process (an
// ordinary host process beside spaced and the VMs) sleeps 10 ms again and again, and each
// wake-up's lateness is recorded. A node whose CPUs a guest takes shows it here first.
Attack measure(Daemon& d, const std::string& victim, seconds how_long, std::string name) {
  Attack a{std::move(name), {}, {}, ""};
  std::atomic<bool> stop{false};
  std::thread probe([&] {
    constexpr auto kNap = milliseconds(10);
    while (!stop) {
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(kNap);
      a.host_late.push_back(Ms(Clock::now() - t0 - kNap).count());
    }
  });
  a.victim = victimLoop(d, victim, how_long);
  stop = true;
  probe.join();
  return a;
}

// A guest command left running: its stream is read (and dropped) by a thread until `stop`, so
// an attack's output crosses the agent channel and spaced as a client would make it.
struct GuestCommand {
  std::thread reader;
  std::atomic<uint64_t> bytes{0};
};

void startGuestCommand(Daemon& d, const std::string& id, const std::string& command, GuestCommand& into,
                       const std::atomic<bool>& stop) {
  const json body{{"command", command}, {"stream", true}, {"timeout_s", 0}, {"user", "root"}};
  into.reader = std::thread([&d, id, body, &into, &stop] {
    const apiclient::Client api = *d.api;
    (void)api.streamLines(
        "POST", apiclient::sandboxPath(id) + "/exec", body,
        [&](const json& line) -> Status {
          if (const json& data = apiclient::field(line, "data"); data.is_string()) {
            into.bytes += data.get_ref<const std::string&>().size() * 3 / 4;  // base64
          }
          if (stop) return makeError(ErrorCode::kCanceled, "attack over");
          return okStatus();
        },
        seconds(5));
  });
}

std::vector<Attack> dosLoop(Daemon& d, int seconds_each) {
  const seconds span(seconds_each);
  const std::string victim = createSandbox(d, kLongLived, seconds(300));
  std::vector<Attack> out;
  out.push_back(measure(d, victim, span, "baseline: attacker idle"));

  struct GuestAttack {
    const char* name;
    const char* command;
  };
  // Each as root, the worst a hostile agent can do from inside; each goes on until deleted.
  const std::vector<GuestAttack> guest_attacks = {
      {"fork bomb", "f() { f | f & }; f"},
      {"memory exhaustion (OOM loop)", "while true; do tail /dev/zero; done"},
      {"disk fill", "while true; do dd if=/dev/zero of=/fill.$RANDOM bs=1M count=4096 2>&1 | tail -1; done"},
      {"a million files", "mkdir -p /m && cd /m && seq 1 1000000 | xargs touch; echo done"},
      {"stdout flood (read by a client)", "yes 0123456789abcdef0123456789abcdef0123456789abcdef0123456789"},
  };
  for (const auto& attack : guest_attacks) {
    progress(std::string("[dos] ") + attack.name);
    const std::string attacker = createSandbox(d, kLongLived, seconds(300));
    std::atomic<bool> stop{false};
    GuestCommand command;
    startGuestCommand(d, attacker, attack.command, command, stop);
    std::this_thread::sleep_for(seconds(1));  // under way
    Attack a = measure(d, victim, span, attack.name);
    stop = true;
    deleteSandbox(d, attacker);  // ends the stream too
    command.reader.join();
    if (command.bytes >= (1 << 20)) {
      a.done = std::to_string(command.bytes / (1 << 20)) + " MiB of output read";
    } else if (command.bytes > 0) {
      a.done = std::to_string(command.bytes / 1024) + " KiB of output read";
    }
    out.push_back(std::move(a));
  }

  {
    // Host side, same tenant: 48 clients calling exec in the attacker without pause (under the
    // tenant's 64 requests at once, so the victim's calls are not refused by its own tenant).
    progress("[dos] 48 clients flooding the attacker with exec calls");
    const std::string attacker = createSandbox(d, kLongLived, seconds(300));
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> calls{0}, refused{0};
    std::vector<std::thread> clients;
    for (int i = 0; i < 48; ++i) {
      clients.emplace_back([&] {
        const apiclient::Client api = *d.api;
        const json exec_true{{"argv", {"true"}}};
        while (!stop) {
          auto r = api.call("POST", apiclient::sandboxPath(attacker) + "/exec", exec_true, seconds(120));
          ++(r.ok() ? calls : refused);
        }
      });
    }
    Attack a = measure(d, victim, span, "48 clients calling exec in the attacker");
    stop = true;
    for (auto& t : clients) t.join();
    a.done = std::to_string(calls) + " calls answered, " + std::to_string(refused) + " refused";
    deleteSandbox(d, attacker);
    out.push_back(std::move(a));
  }
  {
    // 512 connections that send a request header one byte a second (slowloris).
    progress("[dos] 512 slow clients");
    const std::string& base = d.api->endpoint().url;
    auto where = http::detail::parseHostPort(base.substr(base.find("//") + 2), true);
    if (!where.ok()) die(where.error().message);
    std::atomic<bool> stop{false};
    std::thread slow([&] {
      std::vector<UniqueFd> fds;
      for (int i = 0; i < 512; ++i) {
        auto fd = http::detail::connectTcp(where.value(), Clock::now() + seconds(5));
        if (fd.ok()) fds.push_back(std::move(fd.value()));
      }
      const std::string header = "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-Slow: ";
      for (size_t at = 0; !stop; ++at) {
        for (auto& fd : fds) {
          char c = at < header.size() ? header[at] : 'a';
          (void)::send(fd.get(), &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        for (int i = 0; i < 10 && !stop; ++i) std::this_thread::sleep_for(milliseconds(100));
      }
    });
    Attack a = measure(d, victim, span, "512 slow clients (a header byte a second)");
    stop = true;
    slow.join();
    out.push_back(std::move(a));
  }
  out.push_back(measure(d, victim, span, "baseline again: attacker gone"));
  deleteSandbox(d, victim);
  return out;
}

// --- options ------------------------------------------------------------------------------

// Options through CLI11, as in the other programs; --help teaches them.
Options parseOptions(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Measures a sandbox's lifecycle through spaced (sandboxes of 1 vCPU, 256 MB), each number with a\n"
      "baseline measured in the same run. Runs everything sequentially; takes a while with the defaults.\n"
      "Images: SPACE_KERNEL and SPACE_ROOTFS, else vmlinux and rootfs.ext4 in the build's images dir.\n"
      "spaced's logs go to a temporary directory, kept (without the VM files) if the run fails.",
      "space-lifecycle-bench"};
  auto count = CLI::Range(0, 100000);
  app.add_option("--creates", o.creates, "create -> first exec iterations against spaced with a warm pool")
      ->check(count)
      ->capture_default_str();
  app.add_option("--warm-pool", o.warm_pool, "warm pool size of that spaced")->check(count)->capture_default_str();
  app.add_flag("--unpaced", o.unpaced,
               "do not wait (up to 60 s) for the pool to be full before each create; the run then shows creates "
               "arriving faster than the pool refills");
  app.add_option("--baseline-creates", o.baseline_creates,
                 "the same loop against spaced --warm-pool 0 (restore, QEMU started per request); 0 skips")
      ->check(count)
      ->capture_default_str();
  app.add_option("--cold-creates", o.cold_creates, "the same loop against spaced --no-snapshots (cold boot); 0 skips")
      ->check(count)
      ->capture_default_str();
  app.add_option("--floor", o.floor,
                 "Vm::prepare + Vm::restore in-process from the template snapshot the first spaced built; 0 skips")
      ->check(count)
      ->capture_default_str();
  app.add_option("--concurrent", o.concurrent,
                 "creates sent at once by N threads; baseline: the same N sent one after another")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--ops", o.ops,
                 "pause/resume and suspend/resume rounds on one sandbox with a process running, and GETs of it as "
                 "the baseline")
      ->check(count)
      ->capture_default_str();
  app.add_option("--snapshots", o.snapshots, "snapshots taken of that sandbox, each deleted afterwards")
      ->check(count)
      ->capture_default_str();
  app.add_option("--branch", o.branch, "branch counts, one POST /v1/snapshots/{id}/branch each (1..64)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--branch-workers", o.branch_workers,
                 "spaced --branch-workers values to compare, one spaced (no pool) each; 0: spaced's default "
                 "(one per host CPU), 1: one child at a time")
      ->delimiter(',')
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--pause-snapshots", o.pause_snapshots,
                 "extra snapshots of the branch source (for its pause), and rounds of the in-process pause "
                 "measurement (stop-and-copy)")
      ->capture_default_str();
  app.add_option("--branch-baseline", o.branch_baseline,
                 "single creates from the same snapshot, the per-child baseline")
      ->check(count)
      ->capture_default_str();
  app.add_option("--memory-sandboxes", o.memory_sandboxes, "idle restored sandboxes whose memory is read")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--cold-memory-sandboxes", o.cold_memory_sandboxes,
                 "idle cold-booted sandboxes, the memory baseline; 0 skips")
      ->check(count)
      ->capture_default_str();
  app.add_option("--idle-s", o.idle_s, "seconds the sandboxes idle before their memory is read")
      ->check(count)
      ->capture_default_str();
  app.add_option("--dos-seconds", o.dos_seconds,
                 "seconds each guest attack runs while another sandbox's exec is measured; 0 skips")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  std::vector<std::string> skip;
  app.add_option("--skip", skip, "sections to leave out: create, concurrent, ops, branch, memory, dos")
      ->delimiter(',')
      ->check(CLI::IsMember({"create", "concurrent", "ops", "branch", "memory", "dos"}));
  app.add_flag("--json", o.json, "print one JSON document instead of the table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    exit(app.exit(e));
  }
  o.skip.insert(skip.begin(), skip.end());
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parseOptions(argc, argv);
  // The in-process floor's VM layer logs each boot at info, on stdout by default: the table
  // and the JSON document must stay alone there.
  if (auto st = initLogging("warn", false); !st.ok()) die(st.error().message);
  auto run = [&](const char* section) { return opt.skip.count(section) == 0; };

  // Ctrl-C must not leave daemons and VMs behind: spaced runs in its own session, so it would
  // not see the signal. A thread takes the signals and cleans up; the mask is inherited by every
  // thread started later (children get a clean one from posix_spawn).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::thread([stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    g_interrupted = true;
    fprintf(stderr, "space-lifecycle-bench: %s: stopping spaced and its VMs\n", strsignal(sig));
    cleanupAll(false);
    _exit(128 + sig);
  }).detach();

  {
    auto dir = TempDir::create("/tmp", "space-lcb-");
    if (!dir.ok()) die(dir.error().message);
    std::lock_guard lock(g_cleanup_mu);
    g_root = dir->release();  // removed by cleanupAll
  }
  const std::string accelerator = [] {
    auto a = vmm::chooseAccelerator(vmm::Accelerator::kAuto, vmm::probeKvm());
    return a.ok() ? std::string(vmm::acceleratorName(a->accelerator)) : std::string("?");
  }();
  const bool paced = !opt.unpaced;
  json out{
      {"accelerator", accelerator}, {"cpus", 1}, {"memory_mb", 256}, {"warm_pool", opt.warm_pool}, {"paced", paced}};

  // Sections 1-5 on one daemon with the pool; then, one at a time, the daemons of the baselines.
  CreateLoop pooled, no_pool, cold;
  Floor floor;
  std::optional<Burst> burst, burst_seq;
  std::optional<Ops> ops;
  std::vector<Branch> branches;
  std::optional<Pause> pause;
  std::optional<Memory> memory, cold_memory;
  const std::string pool_arg = std::to_string(opt.warm_pool);
  std::string pool_data_dir;
  {
    progress("[spaced --warm-pool " + pool_arg + "] starting, building the template snapshot");
    Daemon& d = startDaemon("pool", {"--warm-pool", pool_arg});
    pool_data_dir = d.data_dir;
    warmUp(d);
    if (run("create") && opt.creates > 0) {
      progress("[create] " + std::to_string(opt.creates) + " x create + first exec, warm pool");
      pooled = createLoop(d, opt.creates, opt.warm_pool > 0, paced);
    }
    if (run("concurrent")) {
      progress("[concurrent] " + std::to_string(opt.concurrent) + " creates, sequentially then at once");
      waitPoolFull(d, seconds(60));
      burst_seq = sequentialBurst(d, opt.concurrent);
      waitPoolFull(d, seconds(60));
      burst = concurrentBurst(d, opt.concurrent);
    }
    if (run("ops") && (opt.ops > 0 || opt.snapshots > 0)) {
      progress("[ops] " + std::to_string(opt.ops) + " rounds each, " + std::to_string(opt.snapshots) + " snapshots");
      ops = opsLoop(d, opt.ops, opt.snapshots);
    }
    if (run("memory")) {
      progress("[memory] " + std::to_string(opt.memory_sandboxes) + " idle restored sandboxes");
      memory = memoryOf(d, opt.memory_sandboxes, opt.idle_s);
    }
    stopDaemon(d);
  }
  if (run("branch") && opt.pause_snapshots > 0) {
    // spaced is stopped: nothing else runs next to the in-process VM.
    progress("[branch] the source's pause in-process: " + std::to_string(opt.pause_snapshots) + " x stop-and-copy");
    pause = pauseLoop(pool_data_dir, opt.pause_snapshots);
  }
  if (run("branch") && !opt.branch.empty()) {
    for (int workers : opt.branch_workers) {
      const std::string w = std::to_string(workers);
      progress("[branch] spaced --warm-pool 0 --branch-workers " + w + ": from one snapshot");
      Daemon& d = startDaemon("branch-w" + w, {"--warm-pool", "0", "--branch-workers", w}, "info");
      warmUp(d);
      branches.push_back(branchLoop(d, workers, opt.branch, opt.branch_baseline, opt.pause_snapshots));
      stopDaemon(d);
    }
  }
  if (run("create") && opt.floor > 0) {
    // spaced is stopped: its template files stay, and nothing else runs next to the floor.
    progress("[create] " + std::to_string(opt.floor) + " x floor: Vm::prepare + Vm::restore in-process");
    floor = floorLoop(pool_data_dir, opt.floor);
  }
  if (run("create") && opt.baseline_creates > 0) {
    progress("[create] " + std::to_string(opt.baseline_creates) + " x baseline: spaced --warm-pool 0");
    Daemon& d = startDaemon("no-pool", {"--warm-pool", "0"});
    warmUp(d);
    no_pool = createLoop(d, opt.baseline_creates, false, false);
    stopDaemon(d);
  }
  const bool cold_create = run("create") && opt.cold_creates > 0;
  const bool cold_mem = run("memory") && opt.cold_memory_sandboxes > 0;
  if (cold_create || cold_mem) {
    progress("[spaced --no-snapshots --warm-pool 0] cold-boot baselines");
    Daemon& d = startDaemon("cold", {"--no-snapshots", "--warm-pool", "0"});
    warmUp(d);
    if (cold_create) cold = createLoop(d, opt.cold_creates, false, false);
    if (cold_mem) cold_memory = memoryOf(d, opt.cold_memory_sandboxes, opt.idle_s);
    stopDaemon(d);
  }
  std::vector<Attack> attacks;
  if (run("dos") && opt.dos_seconds > 0) {
    progress("[dos] spaced --warm-pool 0: one sandbox attacks, another runs `true` back to back");
    Daemon& d = startDaemon("dos", {"--warm-pool", "0"});
    warmUp(d);
    attacks = dosLoop(d, opt.dos_seconds);
    stopDaemon(d);
  }
  cleanupAll(true);

  // --- results
  if (run("create")) {
    json c = createLoopJson(pooled);
    c["iterations"] = pooled.create.size();
    if (opt.warm_pool > 0) c["iterations_with_full_pool"] = pooled.pool_full;
    c["baseline_no_pool"] = createLoopJson(no_pool);
    c["baseline_cold_boot"] = createLoopJson(cold);
    c["floor"] = json{{"vm_prepare_ms", statsJson(floor.prepare)},
                      {"vm_restore_ms", statsJson(floor.restore)},
                      {"vm_restore_to_running_ms", statsJson(floor.running)}};
    out["create"] = c;
  }
  if (burst) {
    out["concurrent"] = burstJson(*burst);
    out["concurrent"]["n"] = opt.concurrent;
    out["concurrent"]["baseline_sequential"] = burstJson(*burst_seq);
  }
  if (ops) {
    out["ops"] = json{{"baseline_get_ms", statsJson(ops->get)},
                      {"pause_ms", statsJson(ops->pause)},
                      {"resume_from_paused_ms", statsJson(ops->resume_paused)},
                      {"suspend_ms", statsJson(ops->suspend)},
                      {"resume_from_suspended_ms", statsJson(ops->resume_suspended)},
                      {"snapshot_ms", statsJson(ops->snapshot)},
                      {"process_survived", ops->process_survived}};
  }
  if (!branches.empty()) {
    json all = json::array();
    for (const auto& branch : branches) {
      json runs = json::array();
      for (const auto& [count, ms] : branch.runs) {
        runs.push_back(json{{"count", count}, {"total_ms", ms}, {"ms_per_child", ms / count}});
      }
      all.push_back(json{{"branch_workers", branch.workers},
                         {"baseline_single_create_from_snapshot_ms", statsJson(branch.single)},
                         {"source_snapshot_ms", statsJson(branch.snapshot)},
                         {"source_stopped_ms", statsJson(branch.paused)},
                         {"source_idle_snapshot_ms", branch.snapshot_idle},
                         {"source_idle_stopped_ms", branch.paused_idle},
                         {"runs", runs}});
    }
    out["branch"] = all;
  }
  if (pause) {
    out["pause"] = json{{"stop_and_copy_ms", statsJson(pause->stop_copy)}};
  }
  if (memory) {
    out["memory"] = memoryJson(*memory, true);
    out["memory"]["idle_s"] = opt.idle_s;
    if (cold_memory) out["memory"]["baseline_cold_boot"] = memoryJson(*cold_memory, false);
  }
  if (!attacks.empty()) {
    json all = json::array();
    for (const auto& a : attacks) {
      all.push_back(json{{"attack", a.name},
                         {"victim_exec_ms", statsJson(a.victim)},
                         {"host_wakeup_late_ms", statsJson(a.host_late)},
                         {"achieved", a.done}});
    }
    out["dos"] = json{{"seconds_each", opt.dos_seconds}, {"attacks", all}};
  }
  if (opt.json) {
    printf("%s\n", out.dump().c_str());
    return 0;
  }

  printf("SPACE lifecycle: accelerator %s, sandboxes of 1 vCPU / 256 MB, warm pool %d%s\n", accelerator.c_str(),
         opt.warm_pool, paced ? " (paced: each create waits for a full pool)" : " (unpaced)");
  if (run("create")) {
    printf("create -> first exec `true`");
    if (opt.warm_pool > 0) printf(" (%d of %zu found the pool full)", pooled.pool_full, pooled.create.size());
    printf("\n");
    printRow("POST /v1/sandboxes -> 201 (warm pool)", pooled.create);
    printRow("POST /v1/sandboxes + first exec (warm pool)", pooled.first_exec);
    printRow("baseline: create, no pool (QEMU started per request)", no_pool.create);
    printRow("baseline: create + first exec, no pool", no_pool.first_exec);
    printRow("baseline: create, cold boot (--no-snapshots)", cold.create);
    printRow("baseline: create + first exec, cold boot", cold.first_exec);
    printRow("floor: Vm::prepare in-process (the pool's part)", floor.prepare);
    printRow("floor: Vm::restore in-process (prepared VM)", floor.restore);
    printRow("floor:   of which state load -> guest running", floor.running);
  }
  if (burst) {
    printf("%d creates at once\n", opt.concurrent);
    printRow("concurrent: POST /v1/sandboxes -> 201", burst->latency);
    printRow("baseline: the same creates one after another", burst_seq->latency);
    printf("  %-54s %8.2f creates/s (all done in %.0f ms)\n", "concurrent: rate",
           opt.concurrent * 1000.0 / burst->wall_ms, burst->wall_ms);
    printf("  %-54s %8.2f creates/s (all done in %.0f ms)\n", "baseline: sequential rate",
           opt.concurrent * 1000.0 / burst_seq->wall_ms, burst_seq->wall_ms);
  }
  if (ops) {
    printf("operations on one sandbox with a process running\n");
    printRow("baseline: GET /v1/sandboxes/{id}", ops->get);
    printRow("POST .../pause", ops->pause);
    printRow("POST .../resume (from paused)", ops->resume_paused);
    printRow("POST .../suspend", ops->suspend);
    printRow("POST .../resume (from suspended)", ops->resume_suspended);
    printRow("POST .../snapshots -> 201", ops->snapshot);
    printf("  %-54s %s\n", "the process survived all of it", ops->process_survived ? "yes" : "NO");
  }
  for (const auto& branch : branches) {
    printf("branch from one snapshot (spaced --branch-workers %d%s)\n", branch.workers,
           branch.workers == 0 ? ": one per host CPU" : "");
    printRow("baseline: POST /v1/sandboxes {\"snapshot\"} (one child)", branch.single);
    for (const auto& [count, ms] : branch.runs) {
      printf("  %-54s %8.0f ms total, %6.1f ms per child\n",
             ("POST /v1/snapshots/{id}/branch count " + std::to_string(count)).c_str(), ms, ms / count);
    }
    printRow("source (a process writing): POST .../snapshots -> 201", branch.snapshot);
    printRow("source (a process writing): stopped for (log)", branch.paused);
    printf("  %-54s %8.0f ms, stopped for %.0f ms\n", "source idle: the branch's snapshot", branch.snapshot_idle,
           branch.paused_idle);
  }
  if (pause) {
    printf("the source's pause for a snapshot, in-process (256 MB guest, a process writing)\n");
    printRow("stop, freeze disk, stream RAM + devices, cont", pause->stop_copy);
  }
  if (memory) {
    VmMemory m = memory->mean();
    printf("host memory per idle sandbox (mean, after %d s idle)\n", opt.idle_s);
    printf("  %-54s %8.1f MiB total PSS\n",
           ("restored from the template, " + std::to_string(memory->vms.size()) + " sandboxes").c_str(),
           m.total_pss_kib / 1024);
    printf("  %-54s %8.1f MiB\n", "  guest RAM mapping (template memory file) PSS", m.guest_pss_kib / 1024);
    printf("  %-54s %8.1f MiB\n", "  guest pages dirtied (its Private_Dirty)", m.guest_dirty_kib / 1024);
    printf("  %-54s %8.1f MiB\n", "  overhead: total PSS - guest dirtied",
           (m.total_pss_kib - m.guest_dirty_kib) / 1024);
    if (cold_memory) {
      printf("  %-54s %8.1f MiB total PSS\n",
             ("baseline: cold boot, " + std::to_string(cold_memory->vms.size()) + " sandboxes").c_str(),
             cold_memory->mean().total_pss_kib / 1024);
    }
  }
  if (!attacks.empty()) {
    printf("another sandbox's exec `true` while one sandbox attacks (%d s each, 1 vCPU / 256 MB both)\n",
           opt.dos_seconds);
    const double base = stats(attacks.front().victim).p50;
    for (const auto& a : attacks) {
      printRow(a.name, a.victim);
      printf("  %-54s p50 %.2fx the first baseline%s%s\n", "", stats(a.victim).p50 / base, a.done.empty() ? "" : "; ",
             a.done.c_str());
      printRow("  host: a 10 ms sleep woke late by", a.host_late);
    }
  }
  return 0;
}
