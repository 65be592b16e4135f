// API benchmark: sandbox create and exec latency through the whole stack: HTTP client -> spaced
// -> SandboxManager -> agent -> guest. spaced restores sandboxes from a template snapshot
// (built by the first create, which is not counted) or, with --warm-pool N, hands out guests
// its hot pool keeps running. Baselines measured in the same run, on the same images: the bare
// QEMU start floor (spawn -> QMP answering, `-M microvm -nodefaults -S`), a cold boot (Vm::start
// in-process), the restore alone (Vm::start from the same template snapshot in-process: QEMU
// -incoming, no daemon) and exec in-process.
// With a pool, each measured create waits first until the pool is full ("pool not exhausted");
// then --drain creates run back to back without waiting, to show the sustained rate and the
// latency once the pool is empty while it refills.
// With --network, spaced gives every sandbox its NIC, slot and gateway (docs/network.md), the
// gateways' upstream side in an empty namespace this benchmark makes (loopback only: nothing
// can leave the machine); without it (the default, as every run recorded before networking),
// `--network off`. The in-process restore baseline needs a template without a NIC, so
// --network skips it: compare with a run without --network right before or after.
// Usage: space-api-bench [--creates N] [--execs N] [--warm-pool N] [--drain N] [--no-snapshots] [--network]
//                        [--jail auto|off] [--vm-uid-base N] [--disk-mib-per-vcpu N] [--disk-iops-per-vcpu N]
//                        [--tcg-tb-mib N] [--qemu PATH] [--json]
// --qemu: the QEMU spaced and every baseline run (default: spaced's own default, SPACE's build).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apiclient/api_client.h"
#include "cli/default_images.h"
#include "common/fs.h"
#include "common/process.h"
#include "percentiles.h"  // next to this file
#include "vmm/node_facts.h"
#include "vmm/qmp_client.h"
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
  int drain = 0;
  bool no_snapshots = false;
  bool as_json = false;
  bool network = false;
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
  app.add_option("--drain", drain, "creates back to back without waiting for the pool (after the measured ones)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_flag("--no-snapshots", no_snapshots, "spaced --no-snapshots: every create boots (the first recorded run)");
  app.add_flag("--network", network,
               "spaced --network on, gateways' upstream in an empty namespace of this benchmark (nothing leaves "
               "the machine); skips the in-process restore baseline");
  std::string jail = "auto";
  app.add_option("--jail", jail, "spaced --jail: auto confines each QEMU (space-jail), off starts it directly")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  std::string vm_uid_base = "1600000000";
  app.add_option("--vm-uid-base", vm_uid_base,
                 "spaced --vm-uid-base: jailed QEMUs run as uids above it, one each; 0: as uid 0 without capabilities")
      ->capture_default_str();
  std::string disk_mib = "64", disk_iops = "1000";
  app.add_option("--disk-mib-per-vcpu", disk_mib, "spaced --disk-mib-per-vcpu: the guest's disk rate; 0: none")
      ->capture_default_str();
  app.add_option("--disk-iops-per-vcpu", disk_iops, "spaced --disk-iops-per-vcpu: the guest's disk requests; 0: none")
      ->capture_default_str();
  std::string tcg_tb_mib = "128";
  app.add_option("--tcg-tb-mib", tcg_tb_mib,
                 "spaced --tcg-tb-mib: each QEMU's translation buffer under TCG; 0: QEMU's own default, 1 GiB")
      ->capture_default_str();
  std::string qemu_binary = cli::defaultQemuBinary();
  app.add_option("--qemu", qemu_binary, "spaced --qemu, and the QEMU of the baselines")->capture_default_str();
  app.add_flag("--json", as_json, "one JSON object on stdout instead of a table");
  CLI11_PARSE(app, argc, argv);
  const std::string images = SPACE_IMAGES_DIR;
  auto dir = TempDir::create("/tmp", "api-bench-");
  if (!dir.ok()) die(dir.error().message);

  // Floor: a bare QEMU, spawned until its monitor answers (what any VM start pays at least).
  std::vector<double> qemu_floor;
  {
    auto qemu = vmm::findExecutable(qemu_binary);
    if (!qemu.ok()) die(qemu.error().message);
    for (int i = 0; i < creates; ++i) {
      const std::string sock = dir->path() + "/floor.sock";
      std::filesystem::remove(sock);
      auto t0 = Clock::now();
      auto p = ChildProcess::spawn({qemu.value(), "-machine", "microvm", "-nodefaults", "-no-user-config", "-display",
                                    "none", "-S", "-qmp", "unix:" + sock + ",server=on,wait=off"},
                                   SpawnOptions{dir->path() + "/floor.log", "", true});
      if (!p.ok()) die(p.error().message);
      auto qmp = vmm::QmpClient::connect(sock, Clock::now() + std::chrono::seconds(10));
      if (!qmp.ok()) die("bare QEMU: " + qmp.error().message);
      qemu_floor.push_back(Ms(Clock::now() - t0).count());
      p->kill();
    }
  }

  // Baseline: the VM layer alone.
  vmm::VmSpec spec;
  spec.kernel_path = std::filesystem::canonical(images + "/vmlinux").string();
  spec.rootfs_path = std::filesystem::canonical(images + "/rootfs.ext4").string();
  spec.qemu_binary = qemu_binary;
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
      SPACED_BIN, "--listen", "127.0.0.1:0", "--e2b-api-listen", "off", "--e2b-envd-listen", "off", "--data-dir",
      data_dir, "--kernel", spec.kernel_path, "--rootfs", spec.rootfs_path, "--log-level", "warn", "--on-shutdown",
      "stop", "--warm-pool", std::to_string(warm_pool),
      // The pool holds sandboxes of the default size: the size measured here.
      "--default-cpus", "1", "--default-memory-mb", "256",
      // No NIC: comparable with the runs recorded before networking, and no gateway whose
      // upstream is the host's network.
      "--network", "off",
      // The drain holds --drain sandboxes at once: the node limit must not be what is measured.
      "--max-vcpus", "256", "--jail", jail, "--vm-uid-base", vm_uid_base, "--disk-mib-per-vcpu", disk_mib,
      "--disk-iops-per-vcpu", disk_iops, "--tcg-tb-mib", tcg_tb_mib, "--qemu", qemu_binary};
  if (no_snapshots) daemon_argv.push_back("--no-snapshots");
  if (network) {
    // An upstream namespace with only a loopback: gateways start and serve the guest, and
    // whatever they dial reaches nothing. Removed at exit (die() included).
    static const std::string void_netns = "api-bench-void-" + std::to_string(getpid());
    auto ip = [&](const std::vector<std::string>& args) {
      std::vector<std::string> argv = {"ip"};
      argv.insert(argv.end(), args.begin(), args.end());
      auto p = ChildProcess::spawn(argv, SpawnOptions{dir->path() + "/ip.log", "", true});
      if (!p.ok()) return false;
      auto status = p->waitFor(std::chrono::seconds(10));
      return status && !status->signaled && status->exit_code == 0;
    };
    if (!ip({"netns", "add", void_netns})) die("ip netns add " + void_netns + " failed (root needed)");
    atexit([] {
      auto p = ChildProcess::spawn({"ip", "netns", "delete", void_netns}, SpawnOptions{});
      if (p.ok()) p->waitFor(std::chrono::seconds(10));
    });
    if (!ip({"-n", void_netns, "link", "set", "lo", "up"})) die("ip link set lo up failed");
    for (auto it = daemon_argv.begin(); it != daemon_argv.end(); ++it) {
      if (*it == "--network") *(it + 1) = "on";
    }
    daemon_argv.insert(daemon_argv.end(), {"--gateway-upstream-netns", "/run/netns/" + void_netns,
                                           "--gateway-upstream-dns", "192.0.2.53"});
  }
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

  std::vector<double> api_create, api_exec, api_exec_shell, api_delete, api_first_exec, api_first_exec_shell;
  std::vector<double> drain_create;
  const json size{{"cpus", 1}, {"memory_mb", 256}};
  const json exec_true{{"argv", {"true"}}};
  const json exec_shell_true{{"command", "true"}};  // bash -l -c, as E2B's commands.run
  auto poolReady = [&] {
    auto r = api->exchange("GET", "/metrics", "", "", std::chrono::seconds(10));
    return r.ok() && r->body.find("\nspace_warm_pool_ready " + std::to_string(warm_pool) + "\n") != std::string::npos;
  };
  auto waitForPool = [&] {
    if (warm_pool == 0) return;
    auto deadline = Clock::now() + std::chrono::seconds(120);
    while (!poolReady()) {
      if (Clock::now() > deadline) die("the pool did not fill within 120 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  // The first create builds the template snapshot: not part of the measurement.
  const std::string keep = idOf(call("POST", "/v1/sandboxes", size, std::chrono::seconds(180)));
  for (int i = 0; i < creates; ++i) {
    const bool shell = i % 2 == 1;  // the two forms of the first exec, alternately
    waitForPool();
    auto t0 = Clock::now();
    json created = call("POST", "/v1/sandboxes", size);
    api_create.push_back(Ms(Clock::now() - t0).count());
    const std::string id = idOf(created);
    call("POST", apiclient::sandboxPath(id) + "/exec", shell ? exec_shell_true : exec_true);
    (shell ? api_first_exec_shell : api_first_exec).push_back(Ms(Clock::now() - t0).count());
    t0 = Clock::now();
    call("DELETE", apiclient::sandboxPath(id), std::nullopt);
    api_delete.push_back(Ms(Clock::now() - t0).count());
  }
  for (int j = 0; j < execs; ++j) {
    auto t0 = Clock::now();
    call("POST", apiclient::sandboxPath(keep) + "/exec", j % 2 ? exec_shell_true : exec_true);
    (j % 2 ? api_exec_shell : api_exec).push_back(Ms(Clock::now() - t0).count());
  }
  // Back to back: the pool drains, then every create waits for a restore.
  double drain_s = 0;
  if (drain > 0) {
    waitForPool();
    std::vector<std::string> made;
    auto d0 = Clock::now();
    for (int i = 0; i < drain; ++i) {
      auto t0 = Clock::now();
      made.push_back(idOf(call("POST", "/v1/sandboxes", size)));
      drain_create.push_back(Ms(Clock::now() - t0).count());
    }
    drain_s = std::chrono::duration<double>(Clock::now() - d0).count();
    for (const auto& id : made) call("DELETE", apiclient::sandboxPath(id), std::nullopt);
  }
  ::kill(daemon->pid(), SIGTERM);
  daemon->waitFor(std::chrono::seconds(60));

  // Floor: the same template snapshot restored in-process, no daemon.
  std::vector<double> direct_restore, direct_restore_running;
  std::string snap;
  for (const auto& e : std::filesystem::directory_iterator(data_dir + "/templates")) {
    if (e.path().filename().string().rfind("base-", 0) == 0) snap = e.path().string();
  }
  if (snap.empty() && !network) die("no template snapshot was built");
  vmm::VmSpec restore_spec = spec;
  restore_spec.rootfs_path = snap + "/disk.qcow2";
  restore_spec.rootfs_format = "qcow2";
  restore_spec.memory_file = snap + "/memory";
  restore_spec.memory_private = true;
  for (int i = 0; i < (network ? 0 : creates); ++i) {
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
  Stats dr = direct_restore.empty() ? Stats{} : stats(direct_restore);
  Stats drr = direct_restore_running.empty() ? Stats{} : stats(direct_restore_running);
  Stats afe = stats(api_first_exec);
  Stats qf = stats(qemu_floor), aes = stats(api_exec_shell), afes = stats(api_first_exec_shell);
  json drain_json = json::array();
  for (double ms : drain_create) drain_json.push_back(std::round(ms * 10) / 10);
  if (as_json) {
    json out{{"accelerator", accelerator},
             {"qemu", qemu_binary},
             {"creates", creates},
             {"execs", execs},
             {"warm_pool", warm_pool},
             {"network", network},
             {"jail", jail},
             {"vm_uid_base", vm_uid_base},
             {"baseline_qemu_start_floor_ms", statsJson(qf)},
             {"api_create_first_exec_shell_ms", statsJson(afes)},
             {"api_exec_shell_true_ms", statsJson(aes)},
             {"drain_create_ms", drain_json},
             {"drain_creates_per_s", drain_s > 0 ? drain / drain_s : 0.0},
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
    printf(
        "accelerator %s, %d creates (1 vCPU, 256 MB), %d execs, spaced --warm-pool %d --network %s --jail %s "
        "--vm-uid-base %s --disk-mib-per-vcpu %s --disk-iops-per-vcpu %s --tcg-tb-mib %s --qemu %s\n",
        accelerator.c_str(), creates, execs, warm_pool, network ? "on" : "off", jail.c_str(), vm_uid_base.c_str(),
        disk_mib.c_str(), disk_iops.c_str(), tcg_tb_mib.c_str(), qemu_binary.c_str());
    printRow("baseline: bare QEMU spawn -> QMP answering", qf);
    printRow("baseline: cold boot, Vm::start in-process", dc);
    if (!network) {
      printRow("baseline: restore, Vm::start in-process", dr);
      printRow("  of which QEMU spawn -> guest running", drr);
    }
    printRow("POST /v1/sandboxes -> 201 running", ac);
    printRow("POST /v1/sandboxes + first exec argv `true`", afe);
    printRow("POST /v1/sandboxes + first exec shell `true`", afes);
    printRow("DELETE /v1/sandboxes/{id} -> 204", ad);
    printRow("baseline: Vm::exec `true` (in-process)", de);
    printRow("POST .../exec argv `true` (running sandbox)", ae);
    printRow("POST .../exec shell `true` (running sandbox)", aes);
    if (!drain_create.empty()) {
      printf("back to back, %d creates: %.1f creates/s; ms each:", drain, drain / drain_s);
      for (double ms : drain_create) printf(" %.0f", ms);
      printf("\n");
    }
  }
  return 0;
}
