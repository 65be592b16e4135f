#include "vmm/node_facts.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "common/bounded_json.h"
#include "common/fs.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace space::vmm {

std::string NodeFacts::guestKernelArgs(Accelerator a) const {
  if (a == Accelerator::kTcg && tsc_khz > 0) return "tsc_early_khz=" + std::to_string(tsc_khz);
  return "";
}

namespace {

// Whether access() said "there is no such executable" (kNotFound) rather than "cannot tell now"
// (EIO, ENOMEM, ELOOP...): callers evict templates keyed by a binary that is gone, so a
// transient failure must not read as one.
Error accessError(const std::string& path) {
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR || err == EACCES) {
    return makeError(ErrorCode::kNotFound, path + " is not executable");
  }
  return makeError(ErrorCode::kInternal, "cannot look at " + path + ": " + std::strerror(err));
}

}  // namespace

Result<std::string> findExecutable(const std::string& binary) {
  if (binary.find('/') != std::string::npos) {
    if (::access(binary.c_str(), X_OK) != 0) return accessError(binary);
    return binary;
  }
  const char* path = getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  std::optional<Error> unknown;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    // An empty PATH entry means the current directory: never for the binary that runs guests.
    if (!dir.empty() && dir[0] == '/') {
      std::string candidate = dir + "/" + binary;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      // Not there, or cannot tell: a later entry may still have it; "cannot tell" is said if none does.
      if (errno != ENOENT && errno != ENOTDIR && errno != EACCES && !unknown) unknown = accessError(candidate);
    }
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (unknown) return *unknown;
  return makeError(ErrorCode::kNotFound, binary + " not found in PATH");
}

uint64_t measureTscKhz(int window_ms) {
#if defined(__x86_64__)
  // A (TSC, clock) pair read as close together as possible: the tightest of a few tries, so a
  // preemption between the two reads does not skew the figure.
  auto pair = [](uint64_t& tsc, int64_t& ns) {
    uint64_t best_gap = UINT64_MAX;
    for (int i = 0; i < 5; ++i) {
      timespec ts{};
      uint64_t before = __rdtsc();
      clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
      uint64_t after = __rdtsc();
      if (after - before < best_gap) {
        best_gap = after - before;
        tsc = before + (after - before) / 2;
        ns = static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
      }
    }
  };
  uint64_t tsc0 = 0, tsc1 = 0;
  int64_t ns0 = 0, ns1 = 0;
  pair(tsc0, ns0);
  usleep(static_cast<useconds_t>(window_ms) * 1000);
  pair(tsc1, ns1);
  if (ns1 <= ns0 || tsc1 <= tsc0) return 0;
  double khz = static_cast<double>(tsc1 - tsc0) * 1e6 / static_cast<double>(ns1 - ns0);
  return static_cast<uint64_t>(khz + 0.5);
#else
  (void)window_ms;
  return 0;
#endif
}

uint64_t rememberedTscKhz(const std::string& file, uint64_t measured) {
  if (measured == 0) return 0;
  if (auto text = readSmallFile(file, 4096); text.ok()) {
    auto saved = parseJsonBounded(text.value());
    if (saved.ok() && saved->is_object() && saved->contains("tsc_khz") && (*saved)["tsc_khz"].is_number_unsigned()) {
      const uint64_t khz = (*saved)["tsc_khz"].get<uint64_t>();
      const uint64_t diff = khz > measured ? khz - measured : measured - khz;
      if (khz > 0 && diff * 10000 <= khz) return khz;
      spdlog::warn("node: the TSC now measures {} kHz, {} remembered {} kHz; using the new figure", measured, file,
                   khz);
    }
  }
  if (auto written = writeFileAtomic(file, nlohmann::json{{"tsc_khz", measured}}.dump() + "\n", 0644); !written.ok()) {
    spdlog::warn("node: cannot remember the TSC frequency in {}: {}", file, written.error().message);
  }
  return measured;
}

Result<uint64_t> availableMemoryMib() {
  auto meminfo = readSmallFile("/proc/meminfo", 1 << 16);
  if (!meminfo.ok()) return meminfo.error();
  return parseMemAvailableMib(meminfo.value());
}

Status checkTrustedExecutable(const std::string& path, uid_t trusted_uid) {
  if (path.empty() || path.front() != '/') {
    return makeError(ErrorCode::kInvalidArgument, "not an absolute path: " + path);
  }
  auto judge = [&](const std::string& at, bool last) -> Status {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0) {
      return makeError(ErrorCode::kNotFound, "cannot inspect " + at + ": " + std::strerror(errno));
    }
    const bool is_dir = S_ISDIR(st.st_mode);
    if (last ? !S_ISREG(st.st_mode) : !is_dir) {
      return makeError(ErrorCode::kPermissionDenied,
                       at + (last ? " is not a regular file" : " is not a directory (links are resolved first)"));
    }
    if (st.st_uid != 0 && st.st_uid != trusted_uid) {
      return makeError(ErrorCode::kPermissionDenied,
                       at + " belongs to uid " + std::to_string(st.st_uid) + ", who could change the QEMU spaced runs");
    }
    const bool group_writable = (st.st_mode & S_IWGRP) != 0 && st.st_gid != 0;
    const bool other_writable = (st.st_mode & S_IWOTH) != 0;
    const bool sticky = is_dir && (st.st_mode & S_ISVTX) != 0;
    if ((group_writable || other_writable) && !sticky) {
      return makeError(ErrorCode::kPermissionDenied,
                       at + " is writable by " +
                           (other_writable ? std::string("every user") : "group " + std::to_string(st.st_gid)) +
                           ", who could change the QEMU spaced runs");
    }
    return okStatus();
  };
  SPACE_TRY(judge("/", false));
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const bool last = slash == std::string::npos;
    SPACE_TRY(judge(last ? path : path.substr(0, slash), last));
    if (last) return okStatus();
  }
}

std::optional<std::string> installedSourceVersion(std::string_view dpkg_status, std::string_view package) {
  // Stanzas of "Field: value" lines, separated by blank lines.
  auto field = [](std::string_view stanza, std::string_view name) -> std::optional<std::string_view> {
    for (size_t at = 0; at < stanza.size();) {
      size_t end = stanza.find('\n', at);
      std::string_view line = stanza.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
      if (line.size() > name.size() + 1 && line.substr(0, name.size()) == name && line[name.size()] == ':') {
        std::string_view value = line.substr(name.size() + 1);
        while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
        return value;
      }
      if (end == std::string_view::npos) break;
      at = end + 1;
    }
    return std::nullopt;
  };
  for (size_t at = 0; at < dpkg_status.size();) {
    size_t end = dpkg_status.find("\n\n", at);
    std::string_view stanza = dpkg_status.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    at = end == std::string_view::npos ? dpkg_status.size() : end + 2;
    if (field(stanza, "Package") != package) continue;
    auto status = field(stanza, "Status");
    if (!status || status->find(" installed") == std::string_view::npos) continue;
    if (auto source = field(stanza, "Source")) {
      size_t open = source->find('(');
      size_t close = source->rfind(')');
      if (open != std::string_view::npos && close != std::string_view::npos && close > open + 1) {
        return std::string(source->substr(open + 1, close - open - 1));
      }
    }
    if (auto version = field(stanza, "Version")) return std::string(*version);
  }
  return std::nullopt;
}

std::optional<std::string> staleQemuBuild(const std::string& qemu_binary, const std::string& dpkg_status_file) {
  auto manifest_text =
      readSmallFile((std::filesystem::path(qemu_binary).parent_path() / "manifest.json").string(), 1 << 16);
  if (!manifest_text.ok()) return std::nullopt;  // not SPACE's build
  auto manifest = parseJsonBounded(manifest_text.value());
  if (!manifest.ok() || !manifest->is_object() || manifest->value("kind", "") != "qemu" ||
      !manifest->contains("source_version") || !(*manifest)["source_version"].is_string()) {
    return std::nullopt;
  }
  const std::string built = (*manifest)["source_version"].get<std::string>();
  auto status = readSmallFile(dpkg_status_file, 256 << 20);
  if (!status.ok()) return std::nullopt;
  auto installed = installedSourceVersion(status.value(), "qemu-system-x86");
  if (!installed || *installed == built) return std::nullopt;
  return "SPACE's QEMU (" + qemu_binary + ") is built from qemu " + built + ", but the installed qemu-system-x86 is " +
         *installed + " (a security update?): run make images and restart spaced to use it";
}

QemuBuildWatch::QemuBuildWatch(std::string qemu_binary, std::string dpkg_status_file)
    : qemu_binary_(std::move(qemu_binary)), dpkg_status_file_(std::move(dpkg_status_file)) {}

std::optional<std::string> QemuBuildWatch::check() {
  std::lock_guard lock(mu_);
  struct stat st {};
  FileState now;
  if (::stat(dpkg_status_file_.c_str(), &st) == 0) {
    now = {static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
           static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
  }
  if (checked_ && now == seen_) return stale_;
  auto stale = staleQemuBuild(qemu_binary_, dpkg_status_file_);
  if (stale && (!checked_ || !stale_)) spdlog::warn("node: {}", *stale);
  if (!stale && checked_ && stale_)
    spdlog::info("node: SPACE's QEMU build agrees with the installed qemu-system-x86 again");
  checked_ = true;
  seen_ = now;
  stale_ = std::move(stale);
  return stale_;
}

Result<NodeFacts> probeNodeFacts(Accelerator requested, const std::string& qemu_binary) {
  NodeFacts facts;
  facts.kvm = probeKvm();
  auto choice = chooseAccelerator(requested, facts.kvm);
  if (!choice.ok()) return choice.error();
  facts.accelerator = choice.value();
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  facts.max_vcpus = cpus > 0 ? static_cast<uint32_t>(cpus) : 1;
  auto qemu = findExecutable(qemu_binary);
  if (!qemu.ok()) return qemu.error();
  // The file itself, not a link to it (the build's images/ link into the image cache): a
  // rebuild that moves the link changes nothing for a running node, and a jail binds the file.
  std::error_code ec;
  auto resolved = std::filesystem::canonical(qemu.value(), ec);
  if (ec) return makeError(ErrorCode::kNotFound, "cannot resolve " + qemu.value() + ": " + ec.message());
  facts.qemu_binary = resolved.string();
  if (auto trusted = checkTrustedExecutable(facts.qemu_binary, geteuid()); !trusted.ok()) {
    return makeError(ErrorCode::kPermissionDenied,
                     "refusing QEMU " + facts.qemu_binary + ": " + trusted.error().message);
  }
  if (facts.accelerator.accelerator == Accelerator::kTcg) facts.tsc_khz = measureTscKhz();
  spdlog::info("node: accelerator {} ({}), {} CPUs, {}{}", acceleratorName(facts.accelerator.accelerator),
               facts.accelerator.reason, facts.max_vcpus, facts.qemu_binary,
               facts.tsc_khz ? ", TSC " + std::to_string(facts.tsc_khz) + " kHz" : std::string());
  return facts;
}

uint64_t qemuShareMib(Accelerator accelerator, uint32_t tb_size_mib) {
  return kQemuOwnMemoryMib + tcgBufferMib(accelerator, tb_size_mib);
}

uint64_t tcgBufferMib(Accelerator accelerator, uint32_t tb_size_mib) {
  if (accelerator != Accelerator::kTcg) return 0;
  return tb_size_mib > 0 ? tb_size_mib : kQemuDefaultTcgTbSizeMib;
}

uint64_t tcgBufferMibOfCommandLine(std::string_view cmdline) {
  std::vector<std::string_view> args;
  for (size_t at = 0; at < cmdline.size();) {
    const size_t end = std::min(cmdline.find('\0', at), cmdline.size());
    args.push_back(cmdline.substr(at, end - at));
    at = end + 1;
  }
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] != "-accel" || args[i + 1].substr(0, 3) != "tcg") continue;
    const std::string_view options = args[i + 1];
    constexpr std::string_view kKey = ",tb-size=";
    const size_t key = options.find(kKey);
    if (key == std::string_view::npos) return kQemuDefaultTcgTbSizeMib;
    const std::string_view digits = options.substr(key + kKey.size());
    uint64_t mib = 0;
    const auto parsed = std::from_chars(digits.data(), digits.data() + digits.size(), mib);
    // Unreadable or absurd (over 1 TiB): taken as QEMU's default, which a caller's floor may raise.
    if (parsed.ec != std::errc{} || mib > (uint64_t{1} << 20)) return kQemuDefaultTcgTbSizeMib;
    return mib > 0 ? mib : kQemuDefaultTcgTbSizeMib;
  }
  return 0;
}

uint64_t adoptedTcgBufferMib(std::string_view cmdline, uint64_t floor_mib, uint64_t most_mib) {
  return std::clamp(tcgBufferMibOfCommandLine(cmdline), floor_mib, std::max(floor_mib, most_mib));
}

namespace {
// QEMU's own memory beyond the guest's (what a node counts, kQemuOwnMemoryMib, is 32; devices, I/O
// buffers and the disk's page cache, dirty included, take more under load), with room to spare:
// the limit is there to stop a runaway, not to squeeze.
constexpr uint64_t kQemuOverheadMib = 384;
// Per vCPU: under TCG each one's software TLB grows with use.
constexpr uint64_t kPerVcpuMib = 64;
}  // namespace

uint64_t tcgBufferMibWithin(uint64_t memory_limit_bytes, uint64_t memory_mib, uint32_t vcpus) {
  const uint64_t limit_mib = memory_limit_bytes >> 20;
  const uint64_t rest = memory_mib + kQemuOverheadMib + kPerVcpuMib * vcpus;
  return limit_mib > rest ? limit_mib - rest : 0;
}

jail::CgroupLimits vmCgroupLimits(const VmSpec& spec, Accelerator accelerator,
                                  const std::vector<std::string>& io_devices) {
  // QEMU's threads: the main loop, one per vCPU, RCU, and its I/O worker pool (at most 64).
  constexpr uint32_t kTasksBeyondVcpus = 128;
  jail::CgroupLimits limits;
  limits.memory_bytes =
      (spec.memory_mib + tcgBufferMib(accelerator, spec.tcg_tb_size_mib) + kQemuOverheadMib + kPerVcpuMib * spec.vcpus)
      << 20;
  limits.pids = kTasksBeyondVcpus + 2 * spec.vcpus;
  limits.cpu_period_us = 100000;
  limits.cpu_quota_us = uint64_t{spec.vcpus + 1} * limits.cpu_period_us;
  constexpr uint64_t kQemuIoOverGuest = 4;
  if (spec.disk_io.limited()) {
    for (const auto& device : io_devices) {
      limits.io.push_back(jail::CgroupIoLimit{device, spec.disk_io.bytes_per_sec * kQemuIoOverGuest,
                                              spec.disk_io.iops * kQemuIoOverGuest});
    }
  }
  return limits;
}

DiskIoRate vmDiskIoLimits(uint32_t vcpus, const NodeFacts& node) {
  return DiskIoRate{node.disk_io_per_vcpu.bytes_per_sec * vcpus, node.disk_io_per_vcpu.iops * vcpus};
}

}  // namespace space::vmm
