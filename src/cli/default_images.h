// Where the command-line tools find the guest images by default.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace space::cli {

// `env` if set, else the build's images/ directory (links into the image cache) next to bin/.
inline std::string defaultImagePath(const char* env, const std::string& name) {
  if (const char* v = std::getenv(env); v != nullptr && *v != '\0') return v;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return name;
  return (exe.parent_path().parent_path() / "images" / name).string();
}

// SPACE's QEMU: env SPACE_QEMU if set, else the build's images/qemu-system-x86_64 (`make images`
// builds it from the installed Debian QEMU's source, for microvm and virtio-mmio only), else
// Debian's own from PATH (a build whose images predate it).
inline std::string defaultQemuBinary() {
  if (const char* v = std::getenv("SPACE_QEMU"); v != nullptr && *v != '\0') return v;
  const std::string built = defaultImagePath("SPACE_QEMU", "qemu-system-x86_64");
  std::error_code ec;
  return std::filesystem::exists(built, ec) ? built : "qemu-system-x86_64";
}

}  // namespace space::cli
