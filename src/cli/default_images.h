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

}  // namespace space::cli
