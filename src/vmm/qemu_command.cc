#include "vmm/qemu_command.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "net/addressing.h"

namespace space::vmm {

VmPaths VmPaths::inRunDir(const std::string& run_dir) {
  VmPaths p;
  p.run_dir = run_dir;
  p.qmp_socket = run_dir + "/qmp.sock";
  p.agent_socket = run_dir + "/agent.sock";
  p.console_log = run_dir + "/console.log";
  p.disk = run_dir + "/disk.qcow2";
  return p;
}

uint64_t qemuFileSizeLimit(uint64_t disk_bytes, uint64_t memory_mib) {
  constexpr uint64_t kSlack = uint64_t{64} << 20;
  return std::max(disk_bytes + disk_bytes / 128, memory_mib << 20) + kSlack;
}

std::string kernelCmdline(const VmSpec& spec) {
  // panic=-1: a panicking guest resets at once; with -no-reboot QEMU then exits, so a panic is
  // seen as process exit plus "Kernel panic" in the console, never as a silent hang.
  // reboot=t: reset by triple fault. microvm has no i8042, and the default keyboard-controller
  // reset spins ~1.5 s waiting for it before falling back to the triple fault anyway.
  std::string cmdline =
      "console=ttyS0 reboot=t panic=-1 root=/dev/vda rw rootfstype=ext4 init=/sbin/space-agent "
      "i8042.noaux i8042.nomux i8042.dumbkbd tsc=reliable random.trust_cpu=on";
  if (!spec.extra_cmdline.empty()) cmdline += " " + spec.extra_cmdline;
  return cmdline;
}

std::vector<std::string> buildQemuArgv(const VmSpec& spec, const VmPaths& paths, Accelerator accelerator) {
  assert(accelerator != Accelerator::kAuto);
  std::vector<std::string> argv = {spec.qemu_binary};
  auto add = [&argv](std::initializer_list<std::string> args) { argv.insert(argv.end(), args); };

  add({"-name", "space-vm,debug-threads=on"});
  // No ACPI, no option ROMs: the kernel finds its virtio-mmio devices on the command line
  // QEMU appends, and boots straight from its PVH entry point.
  // RAM is always the memory backend "mem" (a file or anonymous): migration streams name RAM
  // blocks by id, so a guest saved from any kind of VM restores into any other.
  std::string machine = "microvm,acpi=off,x-option-roms=off,isa-serial=on,rtc=on,memory-backend=mem";
  add({"-machine", machine});
  add({"-nodefaults", "-no-user-config", "-nographic", "-no-reboot"});
  if (accelerator == Accelerator::kKvm) {
    add({"-accel", "kvm", "-cpu", "host"});
  } else {
    std::string tcg = "tcg,thread=multi";
    if (spec.tcg_tb_size_mib > 0) tcg += ",tb-size=" + std::to_string(spec.tcg_tb_size_mib);
    add({"-accel", tcg, "-cpu", "max"});
  }
  add({"-smp", std::to_string(spec.vcpus), "-m", std::to_string(spec.memory_mib) + "M"});
  if (!spec.memory_file.empty()) {
    add({"-object", "memory-backend-file,id=mem,size=" + std::to_string(spec.memory_mib) +
                        "M,mem-path=" + spec.memory_file + ",share=" + (spec.memory_private ? "off" : "on")});
  } else {
    add({"-object", "memory-backend-ram,id=mem,size=" + std::to_string(spec.memory_mib) + "M"});
  }
  add({"-kernel", spec.kernel_path, "-append", kernelCmdline(spec)});

  // append=on: QEMU writes at the end of the file whatever its size, so the owner can trim it
  // (Vm::trimConsole) while QEMU runs; the guest decides how much it prints.
  add({"-chardev", "file,id=console,path=" + paths.console_log + ",append=on", "-serial", "chardev:console"});

  std::string disk = spec.disk_mode == DiskMode::kOverlay ? paths.disk : spec.rootfs_path;
  std::string format = spec.disk_mode == DiskMode::kOverlay ? "qcow2" : "raw";
  // werror=enospc: when the host's disk is full the guest is stopped (QMP status "io-error",
  // event BLOCK_IO_ERROR) instead of seeing its write fail, which would make its filesystem
  // go read-only or lose data; once there is room, `cont` retries the write. Other errors are
  // the guest's to see. (QEMU's default too; stated because the owner relies on it.)
  // cache.no-flush=on: a guest's flush reaches the host's page cache, never the disk. Disk I/O
  // limits count reads and writes, not flushes, so a guest could otherwise attach a host
  // fdatasync (a device cache flush on the shared disk) to each write it is allowed. Nothing is
  // lost by it: a running sandbox does not outlive a host crash, and whatever must (a suspended
  // disk, a frozen layer, a template) spaced fsyncs itself.
  // The images below an overlay are nodes of their own, bottom first, read-only and without
  // image locking: QEMU's locks are OFD locks on the image file, which any process that can open
  // it may take too, so a compromised QEMU holding the "consistent read" byte of a template's
  // image would stop every other QEMU from opening it. Nothing writes a layer, so the locks
  // protect nothing there; the overlay keeps its lock (two QEMUs on one overlay is an error).
  std::string backing;
  if (spec.disk_mode == DiskMode::kOverlay) {
    for (size_t i = spec.disk_backing.size(); i-- > 0;) {
      const std::string name = "backing-" + std::to_string(i);
      nlohmann::json node{{"driver", spec.disk_backing[i].format},
                          {"node-name", name},
                          {"read-only", true},
                          {"file",
                           {{"driver", "file"},
                            {"filename", spec.disk_backing[i].path},
                            {"aio", "threads"},
                            {"locking", "off"},
                            {"read-only", true}}}};
      if (spec.disk_backing[i].format == "qcow2")
        node["backing"] = backing.empty() ? nlohmann::json() : nlohmann::json(backing);
      // A name from a header need not be UTF-8: replaced rather than thrown on (QEMU then fails
      // to open the mangled name, and that VM's start fails like any other).
      add({"-blockdev", node.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
      backing = name;
    }
  }
  add({"-blockdev",
       "driver=file,node-name=rootfile,filename=" + disk + ",aio=threads,cache.direct=off,cache.no-flush=on",
       "-blockdev",
       "driver=" + format + ",node-name=root,file=rootfile" + (backing.empty() ? "" : ",backing=" + backing), "-device",
       "virtio-blk-device,drive=root,werror=enospc,rerror=report"});

  add({"-chardev", "socket,id=agent,fd=" + std::to_string(kAgentFd) + ",server=on,wait=off", "-device",
       "virtio-serial-device,max_ports=2", "-device",
       std::string("virtserialport,chardev=agent,name=") + kAgentPortName});

  // Rate-limited: each byte the guest takes, QEMU reads from the host's /dev/urandom on its main
  // loop, so a guest draining the device without end would cost the host a core and slow its own
  // QMP and agent I/O. 64 KiB/s is far more than a kernel's CRNG needs (it reseeds from 32 bytes).
  add({"-object", "rng-random,id=rng,filename=/dev/urandom", "-device",
       "virtio-rng-device,rng=rng,max-bytes=" + std::to_string(kRngBytesPerPeriod) +
           ",period=" + std::to_string(kRngPeriodMs)});

  // Last, so the other devices keep their virtio-mmio slots with or without it. Every guest has
  // the same MAC (net/addressing.h): clones of one snapshot land in any slot unchanged. The
  // slot's tap comes as a descriptor (kTapFd); QEMU takes its vnet header from the descriptor's
  // flags (and refuses vnet_hdr= with fd=).
  if (!spec.netns_path.empty()) {
    add({"-netdev", "tap,id=net0,fd=" + std::to_string(kTapFd), "-device",
         std::string("virtio-net-device,netdev=net0,mac=") + net::kGuestMac});
  }

  add({"-chardev", "socket,id=qmp,fd=" + std::to_string(kQmpFd) + ",server=on,wait=off", "-mon",
       "chardev=qmp,mode=control"});
  if (spec.incoming) add({"-incoming", "defer"});
  if (spec.start_paused) add({"-S"});
  // QEMU's own seccomp filter: the process that runs guest code may not exec, raise privileges,
  // or use obsolete syscalls.
  add({"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"});
  return argv;
}

}  // namespace space::vmm
