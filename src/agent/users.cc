#include "agent/users.h"

#include <climits>
#include <fstream>
#include <sstream>

namespace space::agent {

namespace {

std::vector<std::string> splitColons(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ':')) out.push_back(field);
  if (!line.empty() && line.back() == ':') out.emplace_back();
  return out;
}

template <class F>
void forEachLine(const std::string& path, F&& f) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (!f(splitColons(line))) return;
  }
}

bool parseId(const std::string& s, unsigned long* out) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoul(s);
  return true;
}

}  // namespace

std::variant<UserInfo, RpcError> UserDb::lookup(const std::string& requested) const {
  const std::string name = requested.empty() ? kDefaultUser : requested;
  std::optional<UserInfo> found;
  forEachLine(etc_dir_ + "/passwd", [&](const std::vector<std::string>& f) {
    unsigned long uid = 0, gid = 0;
    if (f.size() < 7 || f[0] != name || !parseId(f[2], &uid) || !parseId(f[3], &gid)) return true;
    UserInfo u;
    u.name = f[0];
    u.uid = static_cast<uid_t>(uid);
    u.gid = static_cast<gid_t>(gid);
    u.home = f[5].empty() ? "/" : f[5];
    u.shell = f[6].empty() ? "/bin/sh" : f[6];
    found = u;
    return false;
  });
  if (!found) return rpcError(RpcCode::kInvalidArgument, "unknown user \"" + name + "\"");
  found->groups.push_back(found->gid);
  forEachLine(etc_dir_ + "/group", [&](const std::vector<std::string>& f) {
    unsigned long gid = 0;
    if (f.size() < 4 || !parseId(f[2], &gid)) return true;
    std::istringstream members(f[3]);
    std::string m;
    while (std::getline(members, m, ',')) {
      if (m == found->name && static_cast<gid_t>(gid) != found->gid) found->groups.push_back(static_cast<gid_t>(gid));
    }
    return true;
  });
  return *found;
}

std::string UserDb::userName(uid_t uid) const {
  std::string name = std::to_string(uid);
  forEachLine(etc_dir_ + "/passwd", [&](const std::vector<std::string>& f) {
    unsigned long id = 0;
    if (f.size() >= 3 && parseId(f[2], &id) && id == uid) {
      name = f[0];
      return false;
    }
    return true;
  });
  return name;
}

std::string UserDb::groupName(gid_t gid) const {
  std::string name = std::to_string(gid);
  forEachLine(etc_dir_ + "/group", [&](const std::vector<std::string>& f) {
    unsigned long id = 0;
    if (f.size() >= 3 && parseId(f[2], &id) && id == gid) {
      name = f[0];
      return false;
    }
    return true;
  });
  return name;
}

std::variant<std::string, RpcError> resolvePath(const std::string& path, const UserInfo& user) {
  if (path.find('\0') != std::string::npos) return rpcError(RpcCode::kInvalidArgument, "path contains a NUL byte");
  if (path.size() >= PATH_MAX) return rpcError(RpcCode::kInvalidArgument, "path is longer than PATH_MAX");
  std::string p = path;
  if (p.empty() || p == "~") {
    p = user.home;
  } else if (p.rfind("~/", 0) == 0) {
    p = user.home + p.substr(1);
  } else if (p[0] != '/') {
    p = user.home + "/" + p;
  }
  // Lexical normalisation: ".." above "/" stays at "/".
  std::vector<std::string> parts;
  std::istringstream in(p);
  std::string seg;
  while (std::getline(in, seg, '/')) {
    if (seg.empty() || seg == ".") continue;
    if (seg == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(seg);
  }
  // Built by appends into one string, the root returned apart: GCC 12 at -O3 reports a false
  // -Wrestrict overlap for `out += "/" + s` and `out = "/"` (GCC bug 105651), which -Werror
  // turns into a failed Release build.
  if (parts.empty()) return std::string(1, '/');
  std::string out;
  for (const auto& s : parts) {
    out += '/';
    out += s;
  }
  if (out.size() >= PATH_MAX) return rpcError(RpcCode::kInvalidArgument, "path is longer than PATH_MAX");
  return out;
}

}  // namespace space::agent
