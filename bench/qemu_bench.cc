// QEMU's own cost per guest (issue 11): how long a restore's QEMU takes to start (Vm::prepare,
// the hot pool's part) against the bare QEMU floor, and what an idle restored guest's QEMU holds
// in memory under different TCG translation-buffer sizes (tb-size) and malloc arena limits,
// with the exec latency each costs, so the trade-off is visible in one run.
//
// Every measure runs against one template snapshot (a cold boot saved with its RAM in a shared
// file, as spaced's template cache makes it), built on first use in --template DIR and reused
// after, so two builds of this benchmark (before and after a change) can be run one after the
// other, or interleaved by the caller, on the same snapshot.
//
// Usage: space-qemu-bench --template DIR [--startup N] [--memory-rounds R --variants LIST] [--json]
//   LIST: comma-separated variants, each `default` (QEMU's own buffer size, 1 GiB, and glibc's
//   arenas) or `+`-joined settings `tb=<MiB>`, `arena=<n>` (MALLOC_ARENA_MAX in QEMU's
//   environment), e.g. `default,tb=128,tb=32+arena=2`. --startup uses the VM layer's defaults.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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
using std::chrono::seconds;

[[noreturn]] void die(const std::string& what) {
  fprintf(stderr, "space-qemu-bench: %s\n", what.c_str());
  exit(1);
}

std::string imagePath(const char* env, const char* name) {
  std::string path = std::string(SPACE_IMAGES_DIR) + "/" + name;
  if (const char* v = getenv(env); v != nullptr && *v != '\0') path = v;
  std::error_code ec;
  auto real = std::filesystem::canonical(path, ec);
  if (ec) die(path + ": " + ec.message() + " (build the images: make images)");
  return real.string();
}

json statsJson(const std::vector<double>& v) {
  if (v.empty()) return json();
  auto s = bench::stats(v);
  return json{{"n", s.n}, {"p50", s.p50}, {"p90", s.p90}, {"max", s.max}, {"samples", v}};
}

void printRow(const std::string& name, const std::vector<double>& v) {
  if (v.empty()) return;
  auto s = bench::stats(v);
  printf("%-52s p50 %8.1f ms  p90 %8.1f  max %8.1f  (n=%zu)\n", name.c_str(), s.p50, s.p90, s.max, s.n);
}

struct Template {
  std::string dir, memory, disk, state;
};

// A template snapshot as spaced's template cache builds it: a cold boot with RAM in a shared
// file, the device state saved, the disk kept.
Template ensureTemplate(const std::string& dir, const vmm::NodeFacts& facts) {
  Template t{dir, dir + "/memory", dir + "/disk.qcow2", dir + "/state"};
  if (std::filesystem::exists(t.state)) return t;
  std::filesystem::create_directories(dir);
  vmm::VmSpec spec;
  spec.kernel_path = imagePath("SPACE_KERNEL", "vmlinux");
  spec.rootfs_path = imagePath("SPACE_ROOTFS", "rootfs.ext4");
  spec.vcpus = 1;
  spec.memory_mib = 256;
  spec.extra_cmdline = facts.guestKernelArgs(facts.accelerator.accelerator);
  spec.memory_file = t.memory;
  vmm::VmStartOptions options;
  options.run_dir = dir + "/vm";
  options.node = &facts;
  auto vm = vmm::Vm::start(spec, options);
  if (!vm.ok()) die("template boot: " + vm.error().message);
  auto saved = (*vm)->saveState(t.state + ".new", seconds(60));
  if (!saved.ok()) die("template save: " + saved.error().message);
  (*vm)->quit();
  std::filesystem::rename(options.run_dir + "/disk.qcow2", t.disk);
  vm->reset();
  std::filesystem::rename(t.state + ".new", t.state);
  return t;
}

vmm::VmSpec restoreSpec(const Template& t, const vmm::NodeFacts& facts) {
  vmm::VmSpec spec;
  spec.kernel_path = imagePath("SPACE_KERNEL", "vmlinux");
  spec.rootfs_path = t.disk;
  spec.rootfs_format = "qcow2";
  spec.memory_file = t.memory;
  spec.memory_private = true;
  spec.vcpus = 1;
  spec.memory_mib = 256;
  spec.extra_cmdline = facts.guestKernelArgs(facts.accelerator.accelerator);
  spec.qemu_binary = facts.qemu_binary;
  return spec;
}

// --- start-up ----------------------------------------------------------------------------------

struct Startup {
  std::vector<double> floor, prepare, prepare_to_qmp, restore, to_running;
};

double bareQemu(const std::string& qemu, const std::string& dir) {
  const std::string sock = dir + "/floor.sock";
  std::filesystem::remove(sock);
  auto t0 = Clock::now();
  auto p = ChildProcess::spawn({qemu, "-machine", "microvm", "-nodefaults", "-no-user-config", "-display", "none", "-S",
                                "-qmp", "unix:" + sock + ",server=on,wait=off"},
                               SpawnOptions{dir + "/floor.log", "", true});
  if (!p.ok()) die(p.error().message);
  auto qmp = vmm::QmpClient::connect(sock, Clock::now() + seconds(10));
  if (!qmp.ok()) die("bare QEMU: " + qmp.error().message);
  const double ms = Ms(Clock::now() - t0).count();
  p->kill();
  return ms;
}

Startup startupLoop(const Template& t, const vmm::NodeFacts& facts, const std::string& work, int n) {
  Startup out;
  auto spec = restoreSpec(t, facts);
  vmm::VmStartOptions options;
  options.run_root = work;
  options.node = &facts;
  for (int i = 0; i < n; ++i) {
    out.floor.push_back(bareQemu(facts.qemu_binary, work));
    auto t0 = Clock::now();
    auto vm = vmm::Vm::prepare(spec, options);
    if (!vm.ok()) die("Vm::prepare: " + vm.error().message);
    out.prepare.push_back(Ms(Clock::now() - t0).count());
    out.prepare_to_qmp.push_back(static_cast<double>((*vm)->bootTiming().to_qmp.count()));
    t0 = Clock::now();
    auto restored = (*vm)->restore(t.state, seconds(60));
    if (!restored.ok()) die("Vm::restore: " + restored.error().message);
    out.restore.push_back(Ms(Clock::now() - t0).count());
    out.to_running.push_back(static_cast<double>((*vm)->bootTiming().to_running.count()));
    if (i == 0) {  // a restore that only looks done would flatter the numbers
      auto r = (*vm)->exec("true", seconds(30));
      if (!r.ok() || r->exit_code != 0) die("exec in the restored VM failed");
    }
  }
  return out;
}

// --- memory and exec latency per variant -------------------------------------------------------

struct Variant {
  std::string name;
  uint32_t tb_mib = 0;  // 0: QEMU's default
  int arena_max = 0;    // 0: glibc's default
};

Variant parseVariant(const std::string& text) {
  Variant v{text};
  if (text == "default") return v;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, '+');) {
    if (part.rfind("tb=", 0) == 0) {
      v.tb_mib = static_cast<uint32_t>(std::stoul(part.substr(3)));
    } else if (part.rfind("arena=", 0) == 0) {
      v.arena_max = std::stoi(part.substr(6));
    } else {
      die("unknown variant setting: " + part);
    }
  }
  return v;
}

struct Pss {
  double total = 0, tb = 0, guest = 0, heap = 0, anon_other = 0, files = 0;  // KiB
};

double kib(const std::string& line) {
  std::istringstream in(line);
  std::string key;
  double v = 0;
  in >> key >> v;
  return v;
}

// /proc/<pid>/smaps summed by what each mapping is. The translation buffer is QEMU's only
// anonymous mapping that is writable and executable.
Pss readPss(pid_t pid, const std::string& memory_file) {
  Pss p;
  std::ifstream smaps("/proc/" + std::to_string(pid) + "/smaps");
  enum { kTb, kGuest, kHeap, kAnon, kFile } kind = kAnon;
  for (std::string line; std::getline(smaps, line);) {
    std::istringstream in(line);
    std::string range;
    in >> range;
    if (range.empty()) continue;
    if (range.back() != ':') {  // a mapping's first line: "start-end perms offset dev inode [path]"
      std::string perms, offset, dev, inode, path;
      in >> perms >> offset >> dev >> inode;
      std::getline(in, path);
      path.erase(0, path.find_first_not_of(' '));
      if (path == memory_file) {
        kind = kGuest;
      } else if (path == "[heap]") {
        kind = kHeap;
      } else if (path.empty() && perms.find('x') != std::string::npos) {
        kind = kTb;
      } else if (path.empty() || path[0] == '[') {
        kind = kAnon;
      } else {
        kind = kFile;
      }
      continue;
    }
    if (line.rfind("Pss:", 0) != 0) continue;
    const double v = kib(line);
    p.total += v;
    switch (kind) {
      case kTb: p.tb += v; break;
      case kGuest: p.guest += v; break;
      case kHeap: p.heap += v; break;
      case kAnon: p.anon_other += v; break;
      case kFile: p.files += v; break;
    }
  }
  if (p.total == 0) die("could not read /proc/" + std::to_string(pid) + "/smaps");
  return p;
}

struct VariantResult {
  std::vector<double> restore, first_argv, first_shell, argv, shell, python, argv_after, shell_after;
  std::vector<Pss> pooled;  // idle after the restore and the pool's warm-up
  std::vector<Pss> used;    // idle after the steady execs and the Python runs
};

double timedExec(vmm::Vm& vm, const agentproto::CommandSpec& spec) {
  auto t0 = Clock::now();
  auto r = vm.exec(spec);
  const double ms = Ms(Clock::now() - t0).count();
  if (!r.ok()) die("exec: " + r.error().message);
  if (r->exit_code != 0) die("exec exited " + std::to_string(r->exit_code) + ": " + r->stderr_data);
  return ms;
}

agentproto::CommandSpec argvSpec(std::vector<std::string> argv) {
  agentproto::CommandSpec s;
  s.argv = std::move(argv);
  s.timeout = seconds(60);
  return s;
}

agentproto::CommandSpec shellSpec(const std::string& command) {
  agentproto::CommandSpec s;
  s.command = command;
  s.timeout = seconds(60);
  return s;
}

// One guest of `v`: restored, then the pool's warm-up (an argv and a shell `true`, timed as the
// first execs after the restore).
std::unique_ptr<vmm::Vm> startVariant(const Variant& v, const Template& t, const vmm::NodeFacts& facts,
                                      const std::string& work, VariantResult& out) {
  auto spec = restoreSpec(t, facts);
  spec.tcg_tb_size_mib = v.tb_mib;
  vmm::VmStartOptions options;
  options.run_root = work;
  options.node = &facts;
  options.restore_from = t.state;
  // The child inherits our environment (ChildProcess::spawn); set only around the spawn.
  if (v.arena_max > 0) setenv("MALLOC_ARENA_MAX", std::to_string(v.arena_max).c_str(), 1);
  auto t0 = Clock::now();
  auto vm = vmm::Vm::start(spec, options);
  unsetenv("MALLOC_ARENA_MAX");
  if (!vm.ok()) die(v.name + ": restore: " + vm.error().message);
  out.restore.push_back(Ms(Clock::now() - t0).count());
  vmm::Vm& m = **vm;
  out.first_argv.push_back(timedExec(m, argvSpec({"true"})));
  out.first_shell.push_back(timedExec(m, shellSpec("true")));
  return std::move(vm.value());
}

// Steady execs, a heavier workload (Python start-up and imports: much more guest code than the
// warm-up, so a small buffer fills and is flushed), and the steady execs again.
void useVariant(vmm::Vm& m, int steady, VariantResult& out) {
  for (int i = 0; i < steady; ++i) out.argv.push_back(timedExec(m, argvSpec({"true"})));
  for (int i = 0; i < steady / 2; ++i) out.shell.push_back(timedExec(m, shellSpec("true")));
  for (int i = 0; i < 3; ++i) {
    out.python.push_back(timedExec(m, argvSpec({"python3", "-c", "import json, subprocess, sqlite3, email.parser"})));
  }
  for (int i = 0; i < steady; ++i) out.argv_after.push_back(timedExec(m, argvSpec({"true"})));
  for (int i = 0; i < steady / 2; ++i) out.shell_after.push_back(timedExec(m, shellSpec("true")));
}

Pss mean(const std::vector<Pss>& v) {
  Pss m;
  const double n = static_cast<double>(v.size());
  for (const auto& p : v) {
    m.total += p.total / n;
    m.tb += p.tb / n;
    m.guest += p.guest / n;
    m.heap += p.heap / n;
    m.anon_other += p.anon_other / n;
    m.files += p.files / n;
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string template_dir;
  int startup = 0;
  int memory_rounds = 0;
  int steady = 10;
  int idle_s = 10;
  std::string variants_text = "default,tb=128,tb=64,tb=32,arena=2";
  bool as_json = false;
  std::string qemu = cli::defaultQemuBinary();
  CLI::App app{"QEMU start-up (Vm::prepare vs the bare QEMU floor) and idle memory per TCG setting."};
  app.add_option("--template", template_dir, "template snapshot directory (built there if missing)")->required();
  app.add_option("--startup", startup, "rounds of: bare QEMU floor, Vm::prepare, Vm::restore")
      ->check(CLI::Range(0, 10000));
  app.add_option("--memory-rounds", memory_rounds, "rounds of one guest per variant (kept running until measured)")
      ->check(CLI::Range(0, 100));
  app.add_option("--variants", variants_text, "comma-separated: default, tb=<MiB>, arena=<n>, joined by +")
      ->capture_default_str();
  app.add_option("--steady", steady, "steady-state argv execs per guest (half as many shell execs)")
      ->check(CLI::Range(2, 1000))
      ->capture_default_str();
  app.add_option("--idle-s", idle_s, "seconds the round's guests stay idle before their memory is read")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  app.add_option("--qemu", qemu, "the QEMU measured (and that builds the template); env SPACE_QEMU")
      ->capture_default_str();
  app.add_flag("--json", as_json, "one JSON object on stdout instead of a table");
  CLI11_PARSE(app, argc, argv);

  auto facts = vmm::probeNodeFacts(vmm::Accelerator::kAuto, qemu);
  if (!facts.ok()) die(facts.error().message);
  auto work = TempDir::create("/tmp", "qemu-bench-");
  if (!work.ok()) die(work.error().message);
  const Template t = ensureTemplate(std::filesystem::absolute(template_dir).string(), facts.value());

  json j{{"accelerator", vmm::acceleratorName(facts->accelerator.accelerator)}};
  if (startup > 0) {
    auto s = startupLoop(t, facts.value(), work->path(), startup);
    j["startup"] = json{{"bare_qemu_floor_ms", statsJson(s.floor)},
                        {"vm_prepare_ms", statsJson(s.prepare)},
                        {"vm_prepare_spawn_to_qmp_ms", statsJson(s.prepare_to_qmp)},
                        {"vm_restore_ms", statsJson(s.restore)},
                        {"vm_restore_to_running_ms", statsJson(s.to_running)}};
    if (!as_json) {
      printf("start-up (%s, 1 vCPU, 256 MiB, restored from %s)\n", vmm::acceleratorName(facts->accelerator.accelerator),
             t.dir.c_str());
      printRow("baseline: bare QEMU spawn -> QMP answering", s.floor);
      printRow("Vm::prepare (overlay, QEMU -incoming, QMP)", s.prepare);
      printRow("  of which QEMU spawn -> QMP answering", s.prepare_to_qmp);
      printRow("Vm::restore (state load + agent handshake)", s.restore);
      printRow("  of which state load -> guest running", s.to_running);
    }
  }

  if (memory_rounds > 0) {
    std::vector<Variant> variants;
    std::stringstream in(variants_text);
    for (std::string v; std::getline(in, v, ',');) variants.push_back(parseVariant(v));
    std::map<std::string, VariantResult> results;
    for (int r = 0; r < memory_rounds; ++r) {
      std::vector<std::pair<std::string, std::unique_ptr<vmm::Vm>>> live;
      for (const auto& v : variants) {
        live.emplace_back(v.name, startVariant(v, t, facts.value(), work->path(), results[v.name]));
      }
      std::this_thread::sleep_for(seconds(idle_s));
      for (auto& [name, vm] : live) results[name].pooled.push_back(readPss(vm->pid(), t.memory));
      for (auto& [name, vm] : live) useVariant(*vm, steady, results[name]);
      std::this_thread::sleep_for(seconds(idle_s));
      for (auto& [name, vm] : live) results[name].used.push_back(readPss(vm->pid(), t.memory));
    }
    json mem = json::object();
    if (!as_json) {
      printf(
          "\nidle restored guest's QEMU, PSS in MiB (mean of %d), %d s idle after the pool's warm-up (pooled) and\n"
          "again after %d argv and %d shell execs, 3 python3 runs and the execs again (used)\n",
          memory_rounds, idle_s, steady, steady / 2);
      printf(
          "| variant | pooled: total | TCG buffer | guest RAM map | [heap] | other anon | files "
          "| used: total | TCG buffer | [heap] | other anon |\n");
      printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for (const auto& v : variants) {
      const auto& res = results[v.name];
      const Pss m = mean(res.pooled);
      const Pss u = mean(res.used);
      auto mib = [](const Pss& p) {
        return json{{"total", p.total / 1024}, {"tcg_buffer", p.tb / 1024},         {"guest_ram_map", p.guest / 1024},
                    {"heap", p.heap / 1024},   {"anon_other", p.anon_other / 1024}, {"files", p.files / 1024}};
      };
      mem[v.name] = json{{"pooled_pss_mib", mib(m)},
                         {"used_pss_mib", mib(u)},
                         {"restore_ms", statsJson(res.restore)},
                         {"first_argv_ms", statsJson(res.first_argv)},
                         {"first_shell_ms", statsJson(res.first_shell)},
                         {"argv_ms", statsJson(res.argv)},
                         {"shell_ms", statsJson(res.shell)},
                         {"python_ms", statsJson(res.python)},
                         {"argv_after_ms", statsJson(res.argv_after)},
                         {"shell_after_ms", statsJson(res.shell_after)}};
      if (!as_json) {
        printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", v.name.c_str(),
               m.total / 1024, m.tb / 1024, m.guest / 1024, m.heap / 1024, m.anon_other / 1024, m.files / 1024,
               u.total / 1024, u.tb / 1024, u.heap / 1024, u.anon_other / 1024);
      }
    }
    if (!as_json) {
      auto p50 = [](const std::vector<double>& x) { return bench::stats(x).p50; };
      printf(
          "\nexec latency, ms (p50; first = first after the restore, i.e. the warm-up; after = after the "
          "Python runs)\n");
      printf("| variant | restore | first argv | first shell | argv | shell | python3 | argv after | shell after |\n");
      printf("|---|---|---|---|---|---|---|---|---|\n");
      for (const auto& v : variants) {
        const auto& res = results[v.name];
        printf("| %s | %.0f | %.1f | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f |\n", v.name.c_str(), p50(res.restore),
               p50(res.first_argv), p50(res.first_shell), p50(res.argv), p50(res.shell), p50(res.python),
               p50(res.argv_after), p50(res.shell_after));
      }
    }
    j["memory"] = mem;
  }
  if (as_json) printf("%s\n", j.dump(2).c_str());
  return 0;
}
