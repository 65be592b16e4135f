#include "vmm/accelerator.h"

#include <fcntl.h>
#include <linux/kvm.h>
#include <sys/ioctl.h>
#include <unistd.h>

namespace space::vmm {

KvmProbe probeKvm(const std::string& dev_kvm, const std::string& sys_root) {
  KvmProbe p;
  int fd = open(dev_kvm.c_str(), O_RDWR | O_CLOEXEC);
  if (fd >= 0) {
    p.dev_kvm_usable = ioctl(fd, KVM_GET_API_VERSION, 0) == KVM_API_VERSION;
    close(fd);
  }
  p.pvm_module = access((sys_root + "/module/kvm_pvm").c_str(), F_OK) == 0;
  p.hw_module = access((sys_root + "/module/kvm_intel").c_str(), F_OK) == 0 ||
                access((sys_root + "/module/kvm_amd").c_str(), F_OK) == 0;
  return p;
}

Result<AcceleratorChoice> chooseAccelerator(Accelerator requested, const KvmProbe& probe) {
  bool hardware_kvm = probe.dev_kvm_usable && probe.hw_module && !probe.pvm_module;
  std::string why_not;
  if (!probe.dev_kvm_usable) {
    why_not = "/dev/kvm is missing or not usable";
  } else if (probe.pvm_module) {
    why_not = "/dev/kvm is provided by kvm_pvm (shadow-paging PVM), not hardware KVM";
  } else if (!probe.hw_module) {
    why_not = "neither kvm_intel nor kvm_amd is loaded";
  }
  switch (requested) {
    case Accelerator::kTcg: return AcceleratorChoice{Accelerator::kTcg, "tcg requested"};
    case Accelerator::kKvm:
      if (!hardware_kvm) return makeError(ErrorCode::kInvalidArgument, "accelerator kvm requested but " + why_not);
      return AcceleratorChoice{Accelerator::kKvm, "kvm requested"};
    case Accelerator::kAuto:
      if (hardware_kvm) return AcceleratorChoice{Accelerator::kKvm, "hardware KVM available"};
      return AcceleratorChoice{Accelerator::kTcg, "software emulation (TCG): " + why_not};
  }
  return makeError(ErrorCode::kInvalidArgument, "unknown accelerator");
}

}  // namespace space::vmm
