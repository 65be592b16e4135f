#include "snapshot/sandbox_snapshot.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "common/fault.h"
#include "common/fs.h"

namespace space::snapshot {

namespace {

using std::chrono::milliseconds;

uint64_t allocatedBytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// The helper QEMU writes RAM through a shared mapping; on a full disk that is a SIGBUS in
// QEMU, not an error code. So the room is checked first: the memory file needs at most what
// the stream holds (zero pages are neither streamed nor written).
Status checkRoom(const std::string& dir, uint64_t needed) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return okStatus();  // unknown: let the write decide
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes < needed + (64u << 20)) {
    // The free space follows from every tenant's snapshots: the log has it, the caller does not.
    spdlog::warn("snapshot: {} has {} MiB free, {} MiB needed", dir, free_bytes >> 20, needed >> 20);
    return makeError(ErrorCode::kResourceExhausted, "not enough disk space on the node for the snapshot's memory (" +
                                                        std::to_string(needed >> 20) + " MiB needed)");
  }
  return okStatus();
}

}  // namespace

SnapshotFiles snapshotFilesIn(const std::string& dir, const std::string& disk) {
  SnapshotFiles f{dir, dir + "/memory", dir + "/state", disk, 0};
  f.size_bytes = allocatedBytes(f.memory_file) + allocatedBytes(f.state_file) + allocatedBytes(disk);
  return f;
}

Result<SnapshotCapture> captureSnapshot(vmm::Vm& vm, bool was_running, const TakeSnapshotRequest& req) {
  SnapshotCapture capture;
  capture.started = Clock::now();
  auto tmp = TempDir::createAt(req.snapshots_dir + "/.build-" + req.id);
  if (!tmp.ok()) return tmp.error();
  capture.build_dir.emplace(std::move(tmp.value()));
  capture.stream = capture.build_dir->path() + "/stream";
  capture.layer = req.layers_dir + "/" + req.id + ".qcow2";
  // The disk is frozen while the guest is stopped but before the migration (which leaves
  // QEMU's images inactive until the guest continues); the stream then matches the layer.
  auto stopped_at = Clock::now();
  Status done = was_running ? vm.pause() : okStatus();
  if (done.ok()) done = vm.freezeDisk(capture.layer);
  if (done.ok()) faultPoint("snapshot.disk_frozen");
  if (done.ok()) done = vm.saveState(capture.stream, req.timeout, /*ignore_shared=*/false);
  if (auto again = was_running ? vm.resume() : vm.reactivateStopped(); !again.ok()) {
    return makeError(ErrorCode::kInternal, std::string("the sandbox could not be ") +
                                               (was_running ? "continued: " : "kept usable while paused: ") +
                                               again.error().message);
  }
  capture.stopped_for = std::chrono::duration_cast<milliseconds>(Clock::now() - stopped_at);
  if (!done.ok()) return done.error();
  return capture;
}

Result<SnapshotFiles> finishSnapshot(SnapshotCapture capture, const TakeSnapshotRequest& req) {
  const std::string dir = capture.build_dir->path();
  SPACE_TRY(checkRoom(dir, allocatedBytes(capture.stream)));
  {
    vmm::VmSpec spec = req.vm_spec;
    spec.rootfs_path = capture.layer;
    spec.rootfs_format = "qcow2";
    spec.disk_mode = vmm::DiskMode::kOverlay;
    spec.memory_file = dir + "/memory";  // shared: the loaded RAM lands in the file
    spec.memory_private = false;
    spec.incoming = false;
    spec.start_paused = false;
    spec.boot_timeout = req.timeout;
    vmm::VmStartOptions options;
    options.node = req.node;
    options.run_dir = dir + "/vm";
    options.restore_from = capture.stream;
    options.stay_paused = true;
    options.restore_ignore_shared = false;
    auto helper = vmm::Vm::start(spec, options);
    if (!helper.ok()) {
      return makeError(
          helper.error().code == ErrorCode::kResourceExhausted ? ErrorCode::kResourceExhausted : ErrorCode::kInternal,
          "snapshot " + req.id + ": loading the saved memory failed: " + helper.error().message);
    }
    SPACE_TRY((*helper)->saveState(dir + "/state", req.timeout));
    (*helper)->quit();
  }  // its run directory (overlay, sockets) goes with it
  std::error_code ec;
  std::filesystem::remove(capture.stream, ec);
  for (const char* file : {"/memory", "/state"}) SPACE_TRY(fsyncPath(dir + file));
  SPACE_TRY(fsyncPath(capture.layer));
  SPACE_TRY(fsyncPath(req.layers_dir));
  const std::string final_dir = req.snapshots_dir + "/" + req.id;
  std::filesystem::rename(dir, final_dir, ec);
  if (ec) return makeError(ErrorCode::kInternal, "publish " + final_dir + ": " + ec.message());
  capture.build_dir->release();
  SPACE_TRY(fsyncPath(req.snapshots_dir));
  auto files = snapshotFilesIn(final_dir, capture.layer);
  spdlog::info("snapshot {}: taken in {} ms (sandbox stopped for {} ms; {} MiB)", req.id,
               std::chrono::duration_cast<milliseconds>(Clock::now() - capture.started).count(),
               capture.stopped_for.count(), files.size_bytes >> 20);
  return files;
}

Result<SnapshotFiles> takeSnapshot(vmm::Vm& vm, bool was_running, const TakeSnapshotRequest& req) {
  auto capture = captureSnapshot(vm, was_running, req);
  if (!capture.ok()) return capture.error();
  return finishSnapshot(std::move(capture.value()), req);
}

}  // namespace space::snapshot
