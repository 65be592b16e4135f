// PID 1 duties of the agent: the mounts, names and devices a Linux userland expects, and the
// orderly end (kill processes, sync, unmount, reset). Kept apart from the agent's services so
// the services can be tested as an ordinary process on the host.
#pragma once

#include <cstdint>
#include <string>

namespace space::agent {

// Mounts proc, sys, devtmpfs, devpts, /dev/shm, /run, /tmp; creates /dev/fd & co; sets the
// hostname from /etc/hostname; brings up loopback. Failures are logged, not fatal: a guest that
// lacks one mount is still more useful reachable than dead.
void initGuest();

// A restored snapshot is a clone: it must not keep the identity of the guest it was saved
// from. Sets the hostname, steps the wall clock (frozen since the snapshot) and mixes fresh
// host entropy into the kernel's RNG, forcing a reseed, so clones do not share random streams.
// Returns "" or what failed.
std::string applyIdentity(const std::string& hostname, int64_t unix_time_ms, const std::string& entropy);

// Finds the /dev node of the virtio-serial port named `name` (no udev, so no by-name links).
// Empty if absent.
std::string findVirtioPort(const std::string& name);

// Ends the guest: SIGTERM to everything, a grace period, SIGKILL, sync, read-only remount,
// then reboot(2) — QEMU runs with -no-reboot, so the VM exits. Never returns.
[[noreturn]] void shutdownGuest();

}  // namespace space::agent
