#include "snapshot/sandbox_snapshot.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "common/fs.h"

namespace space::snapshot {

namespace {

using std::chrono::milliseconds;

Status fsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return makeError(ErrorCode::kInternal, "open " + path + ": " + strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) {
    return makeError(err == ENOSPC ? ErrorCode::kResourceExhausted : ErrorCode::kInternal,
                     "fsync " + path + ": " + strerror(err));
  }
  return okStatus();
}

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
    return makeError(ErrorCode::kResourceExhausted, "not enough disk space for the snapshot's memory: " +
                                                        std::to_string(needed >> 20) + " MiB needed, " +
                                                        std::to_string(free_bytes >> 20) + " MiB free");
  }
  return okStatus();
}

}  // namespace

SnapshotFiles snapshotFilesIn(const std::string& dir, const std::string& disk) {
  SnapshotFiles f{dir, dir + "/memory", dir + "/state", disk, 0};
  f.size_bytes = allocatedBytes(f.memory_file) + allocatedBytes(f.state_file) + allocatedBytes(disk);
  return f;
}

Result<SnapshotFiles> takeSnapshot(vmm::Vm& vm, bool was_running, const TakeSnapshotRequest& req) {
  auto started = Clock::now();
  auto tmp = TempDir::createAt(req.snapshots_dir + "/.build-" + req.id);
  if (!tmp.ok()) return tmp.error();
  const std::string dir = tmp->path();
  const std::string stream = dir + "/stream";
  const std::string layer = req.layers_dir + "/" + req.id + ".qcow2";

  // Step 1, the only part the sandbox waits for: RAM + devices out, disk frozen, continue.
  milliseconds stopped_for{0};
  {
    auto stopped_at = Clock::now();
    auto saved = vm.saveState(stream, req.timeout, /*ignore_shared=*/false);
    Status frozen = saved.ok() ? vm.freezeDisk(layer) : Status(saved.error());
    if (was_running) {
      if (auto resumed = vm.resume(); !resumed.ok() && frozen.ok()) {
        spdlog::warn("snapshot {}: the sandbox did not continue: {}", req.id, resumed.error().message);
      }
    }
    stopped_for = std::chrono::duration_cast<milliseconds>(Clock::now() - stopped_at);
    if (!frozen.ok()) return frozen.error();
  }

  // Step 2: a helper QEMU that never runs the guest turns the stream into a mappable memory file.
  SPACE_TRY(checkRoom(dir, allocatedBytes(stream)));
  {
    vmm::VmSpec spec;
    spec.kernel_path = req.kernel_path;
    spec.rootfs_path = layer;
    spec.rootfs_format = "qcow2";
    spec.vcpus = req.vcpus;
    spec.memory_mib = req.memory_mib;
    spec.accelerator = req.accelerator;
    spec.memory_file = dir + "/memory";  // shared: the loaded RAM lands in the file
    spec.boot_timeout = req.timeout;
    vmm::VmStartOptions options;
    options.run_dir = dir + "/vm";
    options.restore_from = stream;
    options.stay_paused = true;
    options.restore_ignore_shared = false;
    auto helper = vmm::Vm::start(spec, options);
    if (!helper.ok()) {
      return makeError(helper.error().code == ErrorCode::kResourceExhausted ? ErrorCode::kResourceExhausted
                                                                             : ErrorCode::kInternal,
                       "snapshot " + req.id + ": loading the saved memory failed: " + helper.error().message);
    }
    SPACE_TRY((*helper)->saveState(dir + "/state", req.timeout));
    (*helper)->quit();
  }  // its run directory (overlay, sockets) goes with it
  std::error_code ec;
  std::filesystem::remove(stream, ec);
  for (const char* file : {"/memory", "/state"}) SPACE_TRY(fsyncPath(dir + file, O_RDONLY));
  SPACE_TRY(fsyncPath(layer, O_RDONLY));
  SPACE_TRY(fsyncPath(req.layers_dir, O_RDONLY | O_DIRECTORY));
  const std::string final_dir = req.snapshots_dir + "/" + req.id;
  std::filesystem::rename(dir, final_dir, ec);
  if (ec) return makeError(ErrorCode::kInternal, "publish " + final_dir + ": " + ec.message());
  tmp->release();
  SPACE_TRY(fsyncPath(req.snapshots_dir, O_RDONLY | O_DIRECTORY));
  auto files = snapshotFilesIn(final_dir, layer);
  spdlog::info("snapshot {}: taken in {} ms (sandbox stopped for {} ms; {} MiB)", req.id,
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count(), stopped_for.count(),
               files.size_bytes >> 20);
  return files;
}

}  // namespace space::snapshot
