// Snapshots of running sandboxes: an immutable saved point (memory, device state, disk) that
// new sandboxes are restored from exactly like from a template, so branching costs what a
// create costs and copies nothing.
//
// A sandbox restored from a template keeps its RAM in a private (copy-on-write) mapping, which
// is not a file anyone can map again. So a snapshot is taken in two steps: the sandbox streams
// its RAM and device state out (it is stopped only for this and for freezing its disk), then a
// helper QEMU that never runs the guest loads that stream into a new shared memory file and
// saves its device state again, now without RAM. The result has the template's layout:
// `memory` (mapped privately by each child), `state` (kilobytes), and a frozen disk layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/fs.h"
#include "common/result.h"
#include "vmm/vm.h"

namespace space::snapshot {

struct SnapshotFiles {
  std::string dir;
  std::string memory_file;
  std::string state_file;
  std::string disk;  // the frozen layer (in the layers directory, shared with children)
  uint64_t size_bytes = 0;
};

struct TakeSnapshotRequest {
  std::string id;             // names the directory and the layer
  std::string snapshots_dir;  // published snapshots: <snapshots_dir>/<id>/
  std::string layers_dir;     // frozen disks: <layers_dir>/<id>.qcow2
  // What the sandbox's QEMU was started with (kernel, size, accelerator, QEMU binary): the
  // helper that makes the memory file is started the same way. Disk and memory are set here.
  vmm::VmSpec vm_spec;
  const vmm::NodeFacts* node = nullptr;  // the node's facts, if the caller has them
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// A snapshot between its two steps: the sandbox's part is done, the helper's is not.
struct SnapshotCapture {
  std::optional<TempDir> build_dir;  // <snapshots_dir>/.build-<id>, removed unless published
  std::string stream;                // RAM + devices as the sandbox saved them
  std::string layer;                 // its frozen disk
  Clock::time_point started;
  std::chrono::milliseconds stopped_for{0};
};

// Step 1, the only part that uses the sandbox: `vm` (running if `was_running`, else paused)
// is stopped, its disk frozen into <layers_dir>/<id>.qcow2, its RAM and device state streamed
// into the build directory, and it is continued if it was running. An error after the disk
// was frozen leaves the layer (the sandbox's disk now stands on it); an error continuing the
// guest is returned (the caller decides the sandbox's fate). ENOSPC is kResourceExhausted.
Result<SnapshotCapture> captureSnapshot(vmm::Vm& vm, bool was_running, const TakeSnapshotRequest& request);
// Step 2, without the sandbox: the helper QEMU makes the memory file and device state, then
// the snapshot is published by rename. On failure nothing of it is left.
Result<SnapshotFiles> finishSnapshot(SnapshotCapture capture, const TakeSnapshotRequest& request);
// Both steps.
Result<SnapshotFiles> takeSnapshot(vmm::Vm& vm, bool was_running, const TakeSnapshotRequest& request);

// The files of the published snapshot in `dir` (as takeSnapshot returned them).
SnapshotFiles snapshotFilesIn(const std::string& dir, const std::string& disk);

}  // namespace space::snapshot
