#include "agent/trust_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace space::agent {

namespace {

constexpr std::string_view kBegin = "# BEGIN SPACE credential CA (managed by space-agent)\n";
constexpr std::string_view kEnd = "# END SPACE credential CA\n";
constexpr std::string_view kPemBegin = "-----BEGIN CERTIFICATE-----\n";
constexpr std::string_view kPemEnd = "-----END CERTIFICATE-----\n";

std::string writeFile(const std::string& path, const std::string& text) {
  const std::string temp = path + ".space-tmp";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return "open " + temp + ": " + strerror(errno);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = "write " + temp + ": " + strerror(errno);
      ::close(fd);
      ::unlink(temp.c_str());
      return why;
    }
    done += static_cast<size_t>(n);
  }
  ::fchmod(fd, 0644);
  ::fsync(fd);
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    std::string why = "rename " + temp + ": " + strerror(errno);
    ::unlink(temp.c_str());
    return why;
  }
  return "";
}

}  // namespace

std::string checkCredentialCaPem(const std::string& pem) {
  if (pem.empty() || pem.size() > kMaxCredentialCaBytes)
    return "credentialCa must be 1.." + std::to_string(kMaxCredentialCaBytes) + " bytes";
  if (pem.rfind(kPemBegin, 0) != 0 || pem.size() < kPemEnd.size() ||
      pem.compare(pem.size() - kPemEnd.size(), kPemEnd.size(), kPemEnd) != 0 ||
      pem.find(kPemBegin, 1) != std::string::npos) {
    return "credentialCa must be one PEM certificate";
  }
  for (char c : pem) {
    const bool base64 = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
                        c == '/' || c == '=' || c == '\n' || c == '-' || c == ' ';
    if (!base64) return "credentialCa holds a character no PEM certificate has";
  }
  return "";
}

std::string bundleWithCredentialCa(const std::string& bundle, const std::string& pem) {
  std::string out = bundle;
  if (size_t begin = out.find(kBegin); begin != std::string::npos) {
    size_t end = out.find(kEnd, begin);
    out.erase(begin, end == std::string::npos ? std::string::npos : end + kEnd.size() - begin);
  }
  if (!out.empty() && out.back() != '\n') out += '\n';
  out += kBegin;
  out += pem;
  out += kEnd;
  return out;
}

std::string installCredentialCa(const std::string& pem, const std::string& root) {
  if (auto bad = checkCredentialCaPem(pem); !bad.empty()) return bad;
  const std::string dir = root + "/etc/space";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return "mkdir " + dir + ": " + ec.message();
  if (auto failed = writeFile(root + kCredentialCaFile, pem); !failed.empty()) return failed;
  // The bundle is a file (Debian's update-ca-certificates writes it); a guest without one gets
  // one holding only this CA, so that the variables below point at something.
  const std::string bundle_path = root + kSystemBundle;
  std::ifstream in(bundle_path);
  std::stringstream bundle;
  if (in) bundle << in.rdbuf();
  if (!in) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(bundle_path).parent_path(), ec);
  }
  return writeFile(bundle_path, bundleWithCredentialCa(bundle.str(), pem));
}

std::map<std::string, std::string> credentialCaEnv() {
  return {{"NODE_EXTRA_CA_CERTS", kCredentialCaFile},
          {"REQUESTS_CA_BUNDLE", kSystemBundle},
          {"PIP_CERT", kSystemBundle},
          {"SSL_CERT_FILE", kSystemBundle}};
}

}  // namespace space::agent
