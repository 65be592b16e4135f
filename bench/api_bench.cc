// API benchmark: sandbox create and exec latency through the whole stack: HTTP client -> spaced
// -> SandboxManager -> agent -> guest. spaced restores sandboxes from a template snapshot
// (built by the first create, which is not counted). Baselines measured in the same run, on the
// same images: a cold boot (Vm::start in-process), the restore alone (Vm::start from the same
// template snapshot in-process: QEMU -incoming, no daemon) and exec in-process.
// Usage: space-api-bench [--creates N] [--execs N] [--warm-pool N] [--no-snapshots] [--json]
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apiclient/api_client.h"
#include "common/fs.h"
#include "common/process.h"
#include "percentiles.h"  // next to this file
#include "vmm/vm.h"

namespace {

using namespace space;
using nlohmann::json;
using Ms = std::chrono::duration<double, std::milli>;

using bench::Stats;
using bench::stats;

json statsJson(const Stats& s) {
  return json{
      {"n", s.n}, {"p50", s.p50}, {"p90", s.p90}, {"p99", std::isnan(s.p99) ? json() : json(s.p99)}, {"max", s.max}};
}

void printRow(const char* name, const Stats& s) {
  printf("%-44s p50 %8.1f ms  p90 %8.1f  %s  max %8.1f  (n=%zu)\n", name, s.p50, s.p90, bench::p99Text(s).c_str(),
         s.max, s.n);
}

[[noreturn]] void die(const std::string& what) {
  fprintf(stderr, "space-api-bench: %s\n", what.c_str());
  exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int creates = 20;
  int execs = 200;
  int warm_pool = 0;
  bool no_snapshots = false;
  bool as_json = false;
  CLI::App app{"Create and exec latency through spaced's API, with in-process baselines on the same images."};
  app.add_option("--creates", creates, "sandboxes created (and deleted) one after another")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--execs", execs, "exec `true` round trips on one running sandbox")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  // spaced's own default pool is 2; 0 measures the restore itself, as the recorded runs did.
  app.add_option("--warm-pool", warm_pool, "spaced --warm-pool: QEMUs started ahead of creates")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_flag("--no-snapshots", no_snapshots, "spaced --no-snapshots: every create boots (the first recorded run)");
  app.add_flag("--json", as_json, "one JSON object on stdout instead of a table");
  CLI11_PARSE(app, argc, argv);
  const std::string images = SPACE_IMAGES_DIR;
  auto dir = TempDir::create("/tmp", "api-bench-");
  if (!dir.ok()) die(dir.error().message);

  // Baseline: the VM layer alone.
  vmm::VmSpec spec;
  spec.kernel_path = std::filesystem::canonical(images + "/vmlinux").string();
  spec.rootfs_path = std::filesystem::canonical(images + "/rootfs.ext4").string();
  spec.vcpus = 1;
  spec.memory_mib = 256;
  vmm::VmStartOptions options;
  options.run_root = dir->path() + "/direct";
  std::vector<double> direct_create, direct_exec;
  std::string accelerator;
  for (int i = 0; i < creates; ++i) {
    auto t0 = Clock::now();
    auto vm = vmm::Vm::start(spec, options);
    if (!vm.ok()) die(vm.error().message);
    direct_create.push_back(Ms(Clock::now() - t0).count());
    accelerator = vmm::acceleratorName((*vm)->accelerator());
    if (i == 0) {
      agentproto::CommandSpec t;
      t.argv = {"true"};
      for (int j = 0; j < execs; ++j) {
        auto e0 = Clock::now();
        auto r = (*vm)->exec(t);
        if (!r.ok() || r->exit_code != 0) die("direct exec failed");
        direct_exec.push_back(Ms(Clock::now() - e0).count());
      }
    }
  }

  // The daemon.
  const std::string data_dir = dir->path() + "/data";
  std::vector<std::string> daemon_argv = {
      SPACED_BIN, "--listen",       "127.0.0.1:0", "--data-dir",     data_dir,
      "--kernel", spec.kernel_path, "--rootfs",    spec.rootfs_path, "--log-level",
      "warn",     "--on-shutdown",  "stop",        "--warm-pool",    std::to_string(warm_pool)};
  if (no_snapshots) daemon_argv.push_back("--no-snapshots");
  auto daemon = ChildProcess::spawn(daemon_argv, SpawnOptions{dir->path() + "/spaced.log", "", true});
  if (!daemon.ok()) die(daemon.error().message);
  std::optional<apiclient::Endpoint> endpoint;
  std::string not_yet;
  for (int i = 0; i < 3000 && !endpoint; ++i) {
    if (auto e = apiclient::endpointOfDataDir(data_dir); e.ok()) {
      endpoint = std::move(e.value());
    } else {
      not_yet = e.error().message;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (!endpoint) die("spaced did not start: " + not_yet);
  auto api = apiclient::Client::create(std::move(*endpoint));
  if (!api.ok()) die(api.error().message);
  auto call = [&](const std::string& method, const std::string& target, const std::optional<json>& body,
                  std::chrono::milliseconds timeout = apiclient::kRequestTimeout) {
    auto r = api->call(method, target, body, timeout);
    if (!r.ok()) die(method + " " + target + ": " + r.error().message);
    return std::move(r.value());
  };
  auto idOf = [](const json& sandbox) {
    const json& id = apiclient::field(sandbox, "id");
    if (!id.is_string()) die("spaced answered a create without an id: " + sandbox.dump());
    return id.get<std::string>();
  };

  std::vector<double> api_create, api_exec, api_delete, api_first_exec;
  const json size{{"cpus", 1}, {"memory_mb", 256}};
  const json exec_true{{"argv", {"true"}}};
  // The first create builds the template snapshot: not part of the measurement.
  const std::string keep = idOf(call("POST", "/v1/sandboxes", size, std::chrono::seconds(180)));
  for (int i = 0; i < creates; ++i) {
    auto t0 = Clock::now();
    json created = call("POST", "/v1/sandboxes", size);
    api_create.push_back(Ms(Clock::now() - t0).count());
    const std::string id = idOf(created);
    call("POST", apiclient::sandboxPath(id) + "/exec", exec_true);
    api_first_exec.push_back(Ms(Clock::now() - t0).count());
    t0 = Clock::now();
    call("DELETE", apiclient::sandboxPath(id), std::nullopt);
    api_delete.push_back(Ms(Clock::now() - t0).count());
  }
  for (int j = 0; j < execs; ++j) {
    auto t0 = Clock::now();
    call("POST", apiclient::sandboxPath(keep) + "/exec", exec_true);
    api_exec.push_back(Ms(Clock::now() - t0).count());
  }
  ::kill(daemon->pid(), SIGTERM);
  daemon->waitFor(std::chrono::seconds(60));

  // Floor: the same template snapshot restored in-process, no daemon.
  std::vector<double> direct_restore, direct_restore_running;
  std::string snap;
  for (const auto& e : std::filesystem::directory_iterator(data_dir + "/templates")) {
    if (e.path().filename().string().rfind("base-", 0) == 0) snap = e.path().string();
  }
  if (snap.empty()) die("no template snapshot was built");
  vmm::VmSpec restore_spec = spec;
  restore_spec.rootfs_path = snap + "/disk.qcow2";
  restore_spec.rootfs_format = "qcow2";
  restore_spec.memory_file = snap + "/memory";
  restore_spec.memory_private = true;
  for (int i = 0; i < creates; ++i) {
    vmm::VmStartOptions o;
    o.run_root = dir->path() + "/restore";
    o.restore_from = snap + "/state";
    auto t0 = Clock::now();
    auto vm = vmm::Vm::start(restore_spec, o);
    if (!vm.ok()) die(vm.error().message);
    direct_restore.push_back(Ms(Clock::now() - t0).count());
    direct_restore_running.push_back(static_cast<double>((*vm)->bootTiming().to_running.count()));
  }

  Stats dc = stats(direct_create), ac = stats(api_create), de = stats(direct_exec), ae = stats(api_exec);
  Stats ad = api_delete.empty() ? Stats{} : stats(api_delete);
  Stats dr = stats(direct_restore), drr = stats(direct_restore_running), afe = stats(api_first_exec);
  if (as_json) {
    json out{{"accelerator", accelerator},
             {"creates", creates},
             {"execs", execs},
             {"baseline_vm_start_ms", statsJson(dc)},
             {"api_create_ms", statsJson(ac)},
             {"api_create_first_exec_ms", statsJson(afe)},
             {"baseline_vm_restore_ms", statsJson(dr)},
             {"baseline_vm_restore_running_ms", statsJson(drr)},
             {"api_delete_ms", statsJson(ad)},
             {"baseline_vm_exec_true_ms", statsJson(de)},
             {"api_exec_true_ms", statsJson(ae)}};
    printf("%s\n", out.dump().c_str());
  } else {
    printf("accelerator %s, %d creates (1 vCPU, 256 MB), %d execs\n", accelerator.c_str(), creates, execs);
    printRow("baseline: cold boot, Vm::start in-process", dc);
    printRow("baseline: restore, Vm::start in-process", dr);
    printRow("  of which QEMU spawn -> guest running", drr);
    printRow("POST /v1/sandboxes -> 201 running", ac);
    printRow("POST /v1/sandboxes + first exec `true`", afe);
    printRow("DELETE /v1/sandboxes/{id} -> 204", ad);
    printRow("baseline: Vm::exec `true` (in-process)", de);
    printRow("POST /v1/sandboxes/{id}/exec `true` -> 200", ae);
  }
  return 0;
}
