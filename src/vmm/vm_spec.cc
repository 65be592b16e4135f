#include "vmm/vm_spec.h"

#include <unistd.h>

#include <sstream>

#include "common/fs.h"

namespace space::vmm {

const char* acceleratorName(Accelerator a) {
  switch (a) {
    case Accelerator::kAuto: return "auto";
    case Accelerator::kKvm: return "kvm";
    case Accelerator::kTcg: return "tcg";
  }
  return "auto";
}

Result<Accelerator> parseAccelerator(const std::string& name) {
  if (name == "auto") return Accelerator::kAuto;
  if (name == "kvm") return Accelerator::kKvm;
  if (name == "tcg") return Accelerator::kTcg;
  return makeError(ErrorCode::kInvalidArgument, "unknown accelerator \"" + name + "\" (expected auto, kvm or tcg)");
}

Result<uint64_t> parseMemAvailableMib(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib / 1024;
  }
  return makeError(ErrorCode::kInternal, "MemAvailable missing from /proc/meminfo");
}

Result<HostCapacity> probeHostCapacity() {
  auto meminfo = readSmallFile("/proc/meminfo", 1 << 16);
  if (!meminfo.ok()) return meminfo.error();
  auto mem = parseMemAvailableMib(meminfo.value());
  if (!mem.ok()) return mem.error();
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  HostCapacity host;
  host.max_vcpus = cpus > 0 ? static_cast<uint32_t>(cpus) : 1;
  host.available_memory_mib = mem.value();
  return host;
}

Status validateSpec(const VmSpec& spec, const HostCapacity& host) {
  auto invalid = [](std::string msg) { return makeError(ErrorCode::kInvalidArgument, std::move(msg)); };
  if (spec.vcpus == 0) return invalid("vcpus = 0: a VM needs at least 1 vCPU");
  if (spec.vcpus > host.max_vcpus) {
    return invalid("vcpus = " + std::to_string(spec.vcpus) + ": more than the " + std::to_string(host.max_vcpus) +
                   " allowed on this host");
  }
  if (spec.memory_mib < kMinMemoryMib) {
    return invalid("memory_mib = " + std::to_string(spec.memory_mib) + ": below the minimum of " +
                   std::to_string(kMinMemoryMib) + " MiB the guest needs to boot");
  }
  if (spec.memory_mib > host.available_memory_mib) {
    // The host's free memory follows from every tenant's VMs: it is not told to the caller.
    return makeError(ErrorCode::kResourceExhausted,
                     "memory_mib = " + std::to_string(spec.memory_mib) + ": more than the host has available now",
                     "insufficient_capacity");
  }
  if (spec.kernel_path.empty()) return invalid("kernel_path is empty");
  if (spec.rootfs_path.empty()) return invalid("rootfs_path is empty");
  if (access(spec.kernel_path.c_str(), R_OK) != 0)
    return makeError(ErrorCode::kNotFound, "kernel not readable: " + spec.kernel_path);
  if (access(spec.rootfs_path.c_str(), R_OK) != 0)
    return makeError(ErrorCode::kNotFound, "rootfs not readable: " + spec.rootfs_path);
  if (spec.boot_timeout.count() <= 0) return invalid("boot_timeout must be positive");
  if (spec.extra_cmdline.find('\n') != std::string::npos) return invalid("extra_cmdline contains a newline");
  return okStatus();
}

}  // namespace space::vmm
