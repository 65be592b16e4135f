#include "jail/cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "common/fs.h"

namespace space::jail {

const char* cgroupVersionName(CgroupVersion v) {
  switch (v) {
    case CgroupVersion::kV1: return "v1";
    case CgroupVersion::kV2: return "v2";
    case CgroupVersion::kNone: break;
  }
  return "none";
}

namespace {

constexpr const char* kControllers[] = {"memory", "pids", "cpu"};
constexpr const char* kV1IoController = "blkio";
constexpr const char* kV2IoController = "io";
constexpr const char* kGroupOfVms = "space";
constexpr const char* kDaemonLeaf = "spaced";

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string_view::npos) end = text.size();
    out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool hasToken(std::string_view list, std::string_view token, char sep) {
  for (const auto& t : split(list, sep)) {
    if (t == token) return true;
  }
  return false;
}

struct Mount {
  std::string root;         // the mount's root within its hierarchy
  std::string mount_point;  // where it is mounted
  std::string fstype;
  std::string super_options;
};

std::vector<Mount> parseMountinfo(std::string_view mountinfo) {
  std::vector<Mount> mounts;
  for (const auto& line : split(mountinfo, '\n')) {
    const auto fields = split(line, ' ');
    size_t dash = 0;
    for (size_t i = 6; i < fields.size(); ++i) {
      if (fields[i] == "-") {
        dash = i;
        break;
      }
    }
    if (dash == 0 || fields.size() < dash + 4) continue;
    mounts.push_back(Mount{fields[3], fields[4], fields[dash + 1], fields[dash + 3]});
  }
  return mounts;
}

// "/a/b" under a mount whose root is "/a": "/b". A path outside the mount's root (another
// namespace's view) is taken as the mount's own root.
std::string relativeTo(const std::string& path, const std::string& root) {
  if (root == "/" || root.empty()) return path;
  if (path == root) return "/";
  if (path.rfind(root + "/", 0) == 0) return path.substr(root.size());
  return "/";
}

std::string join(const std::string& mount_point, const std::string& rel) {
  if (rel == "/" || rel.empty()) return mount_point;
  return mount_point + rel;
}

Status writeText(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return makeError(ErrorCode::kUnavailable, "opening " + path + ": " + strerror(errno));
  ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return makeError(ErrorCode::kUnavailable,
                     "writing \"" + text + "\" to " + path + ": " + (n < 0 ? strerror(err) : "short write"));
  }
  return okStatus();
}

// What a v2 group on the way down to VMs' groups hands on to its children.
std::string subtreeControl(const CgroupLayout& layout) {
  return std::string("+memory +pids +cpu") + (layout.io ? " +io" : "");
}

// One device's I/O limits in a group's directory (of the blkio hierarchy on v1).
Status writeIoLimit(const std::string& dir, bool v2, const CgroupIoLimit& limit) {
  const std::string bytes = std::to_string(limit.bytes_per_sec), ops = std::to_string(limit.iops);
  if (v2) {
    auto rate = [](uint64_t n) { return n == 0 ? std::string("max") : std::to_string(n); };
    return writeText(dir + "/io.max", limit.device + " rbps=" + rate(limit.bytes_per_sec) +
                                          " wbps=" + rate(limit.bytes_per_sec) + " riops=" + rate(limit.iops) +
                                          " wiops=" + rate(limit.iops));
  }
  // v1 takes one rule a file; "MAJOR:MINOR 0" removes the device's rule.
  for (const char* way : {"read", "write"}) {
    SPACE_TRY(writeText(dir + "/blkio.throttle." + way + "_bps_device", limit.device + " " + bytes));
    SPACE_TRY(writeText(dir + "/blkio.throttle." + way + "_iops_device", limit.device + " " + ops));
  }
  return okStatus();
}

Status makeDir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return makeError(ErrorCode::kUnavailable, "creating " + path + ": " + ec.message());
  return okStatus();
}

}  // namespace

bool validGroupName(std::string_view name) {
  return !name.empty() && name.size() <= 200 && name != "." && name != ".." &&
         name.find_first_of("/\n") == std::string_view::npos;
}

CgroupLayout planCgroupLayout(std::string_view mountinfo, std::string_view self_cgroup,
                              std::string_view v2_controllers) {
  CgroupLayout layout;
  const auto mounts = parseMountinfo(mountinfo);
  // Our own group in each hierarchy: "N:controllers:/path" (v2: "0::/path").
  std::string v2_path;
  auto ownPathV1 = [&](const std::string& controller) -> std::optional<std::string> {
    for (const auto& line : split(self_cgroup, '\n')) {
      const auto parts = split(line, ':');
      if (parts.size() < 3) continue;
      if (hasToken(parts[1], controller, ',')) return line.substr(parts[0].size() + parts[1].size() + 2);
    }
    return std::nullopt;
  };
  for (const auto& line : split(self_cgroup, '\n')) {
    if (line.rfind("0::", 0) == 0) v2_path = line.substr(3);
  }

  std::vector<CgroupRoot> v1_roots;
  std::string v1_missing;
  auto v1Root = [&](const char* controller) -> std::optional<CgroupRoot> {
    const Mount* found = nullptr;
    for (const auto& m : mounts) {
      if (m.fstype == "cgroup" && hasToken(m.super_options, controller, ',')) {
        found = &m;
        break;
      }
    }
    auto own = ownPathV1(controller);
    if (found == nullptr || !own) return std::nullopt;
    return CgroupRoot{controller, join(found->mount_point, relativeTo(*own, found->root)) + "/" + kGroupOfVms};
  };
  for (const char* controller : kControllers) {
    if (auto root = v1Root(controller)) {
      v1_roots.push_back(std::move(*root));
    } else {
      v1_missing += std::string(v1_missing.empty() ? "" : ", ") + controller;
    }
  }
  if (v1_missing.empty()) {
    layout.version = CgroupVersion::kV1;
    layout.roots = std::move(v1_roots);
    if (auto io = v1Root(kV1IoController)) {
      layout.roots.push_back(std::move(*io));
      layout.io = true;
    }
    return layout;
  }

  const Mount* unified = nullptr;
  for (const auto& m : mounts) {
    if (m.fstype == "cgroup2") {
      unified = &m;
      break;
    }
  }
  if (unified == nullptr) {
    layout.why_none = "no cgroup v2 hierarchy, and no v1 hierarchy for " + v1_missing;
    return layout;
  }
  std::string v2_missing;
  const std::string offered(v2_controllers.substr(0, v2_controllers.find('\n')));
  for (const char* controller : kControllers) {
    if (!hasToken(offered, controller, ' ')) v2_missing += std::string(v2_missing.empty() ? "" : ", ") + controller;
  }
  if (!v2_missing.empty()) {
    layout.why_none = "the cgroup v2 hierarchy at " + unified->mount_point + " offers no " + v2_missing +
                      " controller (bound to v1?), and no v1 hierarchy for " + v1_missing;
    return layout;
  }
  const std::string rel = relativeTo(v2_path.empty() ? "/" : v2_path, unified->root);
  const std::string own_dir = join(unified->mount_point, rel);
  layout.version = CgroupVersion::kV2;
  layout.io = hasToken(offered, kV2IoController, ' ');
  if (rel != "/") {
    // spaced's group holds spaced: it moves into a leaf, and the VMs' group sits beside it.
    layout.v2_own_dir = own_dir;
    layout.v2_daemon_leaf = own_dir + "/" + kDaemonLeaf;
  }
  layout.roots.push_back(CgroupRoot{"", own_dir + "/" + kGroupOfVms});
  return layout;
}

Result<CgroupLayout> setUpCgroups(const std::string& instance) {
  if (!validGroupName(instance)) return makeError(ErrorCode::kInvalidArgument, "bad cgroup name '" + instance + "'");
  auto mountinfo = readSmallFile("/proc/self/mountinfo", 1 << 20);
  if (!mountinfo.ok()) return makeError(ErrorCode::kUnavailable, mountinfo.error().message);
  auto self = readSmallFile("/proc/self/cgroup", 1 << 16);
  if (!self.ok()) return makeError(ErrorCode::kUnavailable, self.error().message);
  // On v2 what may be handed down is what our own group has (a service manager may pass only
  // some controllers down to it), so a first plan finds our group, and it is asked. Nothing is
  // written before the plan says the controllers are there.
  CgroupLayout layout = planCgroupLayout(mountinfo.value(), self.value(), "memory pids cpu io");
  if (layout.version == CgroupVersion::kV2) {
    const std::string own = !layout.v2_own_dir.empty()
                                ? layout.v2_own_dir
                                : std::filesystem::path(layout.roots[0].dir).parent_path().string();
    auto c = readSmallFile(own + "/cgroup.controllers", 4096);
    layout = planCgroupLayout(mountinfo.value(), self.value(), c.ok() ? c.value() : "");
  }
  if (!layout.usable()) return makeError(ErrorCode::kUnavailable, layout.why_none);
  if (layout.version == CgroupVersion::kV2) {
    // Every group on the way down hands the controllers on; none of them holds a process.
    const std::string enable = subtreeControl(layout);
    const std::string space_dir = layout.roots[0].dir;
    std::string parent = layout.v2_own_dir;
    if (!parent.empty()) {
      SPACE_TRY(makeDir(layout.v2_daemon_leaf));
      SPACE_TRY(writeText(layout.v2_daemon_leaf + "/cgroup.procs", std::to_string(getpid())));
    } else {
      parent = std::filesystem::path(space_dir).parent_path().string();
    }
    SPACE_TRY(writeText(parent + "/cgroup.subtree_control", enable));
    SPACE_TRY(makeDir(space_dir));
    SPACE_TRY(writeText(space_dir + "/cgroup.subtree_control", enable));
    layout.roots[0].dir = space_dir + "/" + instance;
    SPACE_TRY(makeDir(layout.roots[0].dir));
    SPACE_TRY(writeText(layout.roots[0].dir + "/cgroup.subtree_control", enable));
    // The controller without the kernel's throttling has no io.max.
    layout.io = layout.io && ::access((layout.roots[0].dir + "/io.max").c_str(), F_OK) == 0;
  } else {
    for (auto& root : layout.roots) {
      root.dir += "/" + instance;
      SPACE_TRY(makeDir(root.dir));
    }
    // Every blkio group has the throttle's files where the kernel throttles; without them the
    // hierarchy holds nothing of ours.
    auto blkio = std::find_if(layout.roots.begin(), layout.roots.end(),
                              [](const CgroupRoot& root) { return root.controller == kV1IoController; });
    if (blkio != layout.roots.end() && ::access((blkio->dir + "/blkio.throttle.read_bps_device").c_str(), F_OK) != 0) {
      ::rmdir(blkio->dir.c_str());
      layout.roots.erase(blkio);
      layout.io = false;
    }
  }
  return layout;
}

Result<CgroupLayout> nestedLayout(const CgroupLayout& layout, const std::string& name) {
  if (!validGroupName(name)) return makeError(ErrorCode::kInvalidArgument, "bad cgroup name '" + name + "'");
  if (!layout.usable()) return makeError(ErrorCode::kUnavailable, "no cgroups: " + layout.why_none);
  CgroupLayout nested = layout;
  for (auto& root : nested.roots) {
    root.dir += "/" + name;
    SPACE_TRY(makeDir(root.dir));
    if (layout.version == CgroupVersion::kV2)
      SPACE_TRY(writeText(root.dir + "/cgroup.subtree_control", subtreeControl(layout)));
  }
  return nested;
}

Result<VmCgroup> VmCgroup::create(const CgroupLayout& layout, const std::string& name, const CgroupLimits& limits) {
  if (!validGroupName(name)) return makeError(ErrorCode::kInvalidArgument, "bad cgroup name '" + name + "'");
  VmCgroup group = existing(layout, name);
  // A failure removes only the directories this call made: one that was there (an adopted
  // gateway's group, which holds it) stays as it was, and its removal would not wait out a
  // process that is not leaving.
  VmCgroup made;
  auto fail = [&](const Error& e) {
    (void)made.remove();
    return e;
  };
  for (size_t i = 0; i < layout.roots.size(); ++i) {
    const std::string& dir = group.dirs_[i];
    if (::mkdir(dir.c_str(), 0755) == 0) {
      made.dirs_.push_back(dir);
    } else if (errno != EEXIST) {
      return fail(makeError(ErrorCode::kUnavailable, "creating cgroup " + dir + ": " + strerror(errno)));
    }
    const std::string& controller = layout.roots[i].controller;
    const bool v2 = layout.version == CgroupVersion::kV2;
    Status st = okStatus();
    if ((v2 || controller == "memory") && limits.memory_bytes > 0) {
      st = writeText(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), std::to_string(limits.memory_bytes));
    }
    if (st.ok() && (v2 || controller == "pids") && limits.pids > 0) {
      st = writeText(dir + "/pids.max", std::to_string(limits.pids));
    }
    if (st.ok() && (v2 || controller == "cpu") && limits.cpu_quota_us > 0) {
      if (v2) {
        st = writeText(dir + "/cpu.max",
                       std::to_string(limits.cpu_quota_us) + " " + std::to_string(limits.cpu_period_us));
      } else {
        st = writeText(dir + "/cpu.cfs_period_us", std::to_string(limits.cpu_period_us));
        if (st.ok()) st = writeText(dir + "/cpu.cfs_quota_us", std::to_string(limits.cpu_quota_us));
      }
    }
    if (!st.ok()) return fail(st.error());
    if (layout.io && (v2 || controller == kV1IoController)) {
      for (const auto& io : limits.io) {
        if (Status written = writeIoLimit(dir, v2, io); !written.ok() && group.io_error_.empty())
          group.io_error_ = written.error().message;
      }
    }
  }
  return group;
}

VmCgroup VmCgroup::existing(const CgroupLayout& layout, const std::string& name) {
  VmCgroup group;
  if (!validGroupName(name)) return group;
  for (const auto& root : layout.roots) group.dirs_.push_back(root.dir + "/" + name);
  return group;
}

std::optional<uint64_t> VmCgroup::memoryLimitBytes() const {
  for (const auto& dir : dirs_) {
    for (const char* file : {"/memory.max", "/memory.limit_in_bytes"}) {
      auto text = readSmallFile(dir + file, 64);
      if (!text.ok()) continue;
      uint64_t bytes = 0;
      const std::string& t = text.value();
      const auto parsed = std::from_chars(t.data(), t.data() + t.size(), bytes);
      if (parsed.ec != std::errc{} || (parsed.ptr != t.data() + t.size() && *parsed.ptr != '\n')) return std::nullopt;
      return bytes;  // "max" (v2's none) fails the parse above
    }
  }
  return std::nullopt;
}

std::vector<std::string> VmCgroup::procsFiles() const {
  std::vector<std::string> out;
  for (const auto& dir : dirs_) out.push_back(dir + "/cgroup.procs");
  return out;
}

std::vector<pid_t> processesInGroupDir(const std::string& dir) {
  std::vector<pid_t> out;
  auto text = readSmallFile(dir + "/cgroup.procs", 1 << 20);
  if (!text.ok()) return out;
  std::istringstream lines(text.value());
  for (long pid; lines >> pid;) out.push_back(static_cast<pid_t>(pid));
  return out;
}

std::vector<pid_t> VmCgroup::processes() const {
  std::set<pid_t> all;
  for (const auto& dir : dirs_) {
    for (pid_t pid : processesInGroupDir(dir)) all.insert(pid);
  }
  return {all.begin(), all.end()};
}

bool VmCgroup::holds(pid_t pid) const {
  if (dirs_.empty()) return false;
  for (const auto& dir : dirs_) {
    const auto in = processesInGroupDir(dir);
    if (std::find(in.begin(), in.end(), pid) == in.end()) return false;
  }
  return true;
}

Status VmCgroup::remove() {
  std::string busy;
  for (const auto& dir : dirs_) {
    // A process just reaped can take a moment to leave its group.
    for (int attempt = 0;; ++attempt) {
      if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) break;
      if (errno != EBUSY || attempt == 50) {
        busy += (busy.empty() ? "" : "; ") + dir + ": " + strerror(errno);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (!busy.empty()) return makeError(ErrorCode::kUnavailable, "cannot remove cgroup " + busy);
  dirs_.clear();
  return okStatus();
}

std::optional<std::string> blockDeviceUnder(const std::string& path, const std::string& sysfs) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  const std::string device = std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  const std::string dir = sysfs + "/dev/block/" + device;
  if (::access(dir.c_str(), F_OK) != 0) return std::nullopt;  // no block device: tmpfs, btrfs...
  if (::access((dir + "/partition").c_str(), F_OK) != 0) return device;
  // A partition's directory sits in its disk's, whose "dev" names the disk.
  auto disk = readSmallFile(dir + "/../dev", 64);
  if (!disk.ok()) return std::nullopt;
  std::string text = disk.value();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  unsigned disk_major = 0, disk_minor = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%u:%u%c", &disk_major, &disk_minor, &tail) != 2) return std::nullopt;
  return text;
}

int removeEmptyVmGroups(const CgroupLayout& layout) {
  std::set<std::string> removed;
  for (const auto& root : layout.roots) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(root.dir, ec)) {
      if (!entry.is_directory(ec)) continue;
      // Fails (EBUSY) for a group that still holds a process: it stays.
      if (::rmdir(entry.path().c_str()) == 0) removed.insert(entry.path().filename().string());
    }
  }
  return static_cast<int>(removed.size());
}

}  // namespace space::jail
