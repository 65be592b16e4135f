// Chooses the accelerator a VM runs under. `auto` means hardware KVM where the host really has
// it, TCG (software emulation) everywhere else. A /dev/kvm provided by the kvm_pvm module
// (shadow-paging PVM, found on our development machines) exists and opens, yet cannot run an
// unmodified guest at a usable speed, so it does not count as KVM.
#pragma once

#include <string>

#include "common/result.h"
#include "vmm/vm_spec.h"

namespace space::vmm {

struct KvmProbe {
  bool dev_kvm_usable = false;  // /dev/kvm opens and answers KVM_GET_API_VERSION == 12
  bool pvm_module = false;      // /sys/module/kvm_pvm exists
  bool hw_module = false;       // /sys/module/kvm_intel or kvm_amd exists
};

// Looks at the real host; `sys_root` lets tests point it at a fake /sys.
KvmProbe probeKvm(const std::string& dev_kvm = "/dev/kvm", const std::string& sys_root = "/sys");

struct AcceleratorChoice {
  Accelerator accelerator;  // never kAuto
  std::string reason;       // why, for the log
};

// Resolves `requested` against the probe. An explicit kvm on a host without usable KVM is an error.
Result<AcceleratorChoice> chooseAccelerator(Accelerator requested, const KvmProbe& probe);

}  // namespace space::vmm
