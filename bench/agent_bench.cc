// Agent benchmark: exec round trip and file throughput through the real channel of a real
// microVM. Baselines measured in the same run: the bare RPC round trip (agent.Agent/Info: the
// channel without fork/exec), and the guest's own in-memory copy speed (dd into its tmpfs).
// Usage: space-agent-bench [--runs N] [--file-mib M] [--json]   (--help for more)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/default_images.h"
#include "percentiles.h"  // next to this file
#include "vmm/vm.h"

namespace {

using namespace space;
using std::chrono::duration;
using Ms = duration<double, std::milli>;

using bench::Stats;
using bench::stats;

std::string imagePath(const char* env, const char* name) {
  if (const char* v = getenv(env); v != nullptr && *v != '\0') return v;
  return std::string(SPACE_IMAGES_DIR) + "/" + name;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 200;
  int file_mib = 64;
  bool json = false;
  CLI::App app{
      "Exec round trip and file throughput through the agent channel of one microVM (2 vCPUs, 1 GiB),\n"
      "with the bare RPC round trip and the guest's own copy speed as baselines."};
  app.add_option("--runs", runs, "round trips per measure")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--file-mib", file_mib, "size of the file moved each way")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_flag("--json", json, "one JSON object on stdout instead of a table");
  CLI11_PARSE(app, argc, argv);
  vmm::VmSpec spec;
  spec.kernel_path = imagePath("SPACE_KERNEL", "vmlinux");
  spec.rootfs_path = imagePath("SPACE_ROOTFS", "rootfs.ext4");
  spec.qemu_binary = cli::defaultQemuBinary();
  spec.memory_mib = 1024;
  vmm::VmStartOptions options;
  options.run_root = "/tmp/space-bench";
  auto vm = vmm::Vm::start(spec, options);
  if (!vm.ok()) {
    fprintf(stderr, "space-agent-bench: %s\n", vm.error().message.c_str());
    return 1;
  }
  auto& agent = (*vm)->agent();

  std::vector<double> rpc, exec;
  for (int i = 0; i < runs; ++i) {
    auto t0 = Clock::now();
    if (!agent.call("/agent.Agent/Info", nlohmann::json::object()).ok()) return 1;
    rpc.push_back(Ms(Clock::now() - t0).count());
  }
  agentproto::CommandSpec t;
  t.argv = {"true"};
  for (int i = 0; i < runs; ++i) {
    auto t0 = Clock::now();
    auto r = (*vm)->exec(t);
    if (!r.ok() || r->exit_code != 0) return 1;
    exec.push_back(Ms(Clock::now() - t0).count());
  }

  std::string data(static_cast<size_t>(file_mib) << 20, 'x');
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>(i >> 12);
  auto t0 = Clock::now();
  auto up = agent.upload("/tmp/bench.bin", data, agentproto::CallOptions{std::chrono::seconds(600), ""});
  double up_s = duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  auto down = agent.download("/tmp/bench.bin", data.size() + 1, agentproto::CallOptions{std::chrono::seconds(600), ""});
  double down_s = duration<double>(Clock::now() - t0).count();
  if (!up.ok() || !down.ok() || down.value() != data) {
    fprintf(stderr, "space-agent-bench: file transfer failed\n");
    return 1;
  }
  auto dd = (*vm)->exec("rm -f /tmp/bench.bin; dd if=/dev/zero of=/tmp/dd.bin bs=1M count=" + std::to_string(file_mib) +
                        " 2>&1 | tail -1; rm -f /tmp/dd.bin");
  (void)(*vm)->shutdown(std::chrono::seconds(10));

  Stats r = stats(rpc), e = stats(exec);
  double mib = file_mib;
  if (json) {
    nlohmann::json out{{"runs", runs},
                       {"accelerator", vmm::acceleratorName((*vm)->accelerator())},
                       {"rpc_info_ms",
                        {{"p50", r.p50},
                         {"p90", r.p90},
                         {"p99", std::isnan(r.p99) ? nlohmann::json() : nlohmann::json(r.p99)},
                         {"max", r.max}}},
                       {"exec_true_ms",
                        {{"p50", e.p50},
                         {"p90", e.p90},
                         {"p99", std::isnan(e.p99) ? nlohmann::json() : nlohmann::json(e.p99)},
                         {"max", e.max}}},
                       {"upload_mib_s", mib / up_s},
                       {"download_mib_s", mib / down_s},
                       {"guest_dd", dd.ok() ? dd->stdout_data : ""}};
    printf("%s\n", out.dump().c_str());
  } else {
    printf("accelerator: %s, %d runs\n", vmm::acceleratorName((*vm)->accelerator()), runs);
    printf("baseline  Info RPC round trip   p50 %7.2f ms  p90 %7.2f  %s  max %7.2f\n", r.p50, r.p90,
           bench::p99Text(r, 7).c_str(), r.max);
    printf("exec `true` round trip          p50 %7.2f ms  p90 %7.2f  %s  max %7.2f\n", e.p50, e.p90,
           bench::p99Text(e, 7).c_str(), e.max);
    printf("upload   %d MiB: %7.1f MiB/s\n", file_mib, mib / up_s);
    printf("download %d MiB: %7.1f MiB/s\n", file_mib, mib / down_s);
    printf("baseline guest dd to tmpfs: %s", dd.ok() ? dd->stdout_data.c_str() : "(failed)\n");
  }
  return 0;
}
