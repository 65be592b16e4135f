// The guest's trust in its sandbox's credential CA (see src/net/tls_ca.h): the gateway
// terminates TLS to credential rules' hosts with certificates that CA signs. The host sends the
// CA's certificate (never its key) at create, resume or when rules are added; the agent puts it
// where the guest's TLS clients look:
//   - the system bundle /etc/ssl/certs/ca-certificates.crt (OpenSSL, curl, wget, git, Debian's
//     Python and pip), as one marked block replaced on every install;
//   - /etc/space/credential-ca.pem, named by NODE_EXTRA_CA_CERTS (Node and npm add it to their
//     own store) and REQUESTS_CA_BUNDLE/PIP_CERT/SSL_CERT_FILE point at the bundle (a certifi
//     installed from PyPI, a pip upgraded from PyPI).
// Installed at run time, not baked into the image: each sandbox has its own CA.
#pragma once

#include <map>
#include <string>

namespace space::agent {

inline constexpr const char* kSystemBundle = "/etc/ssl/certs/ca-certificates.crt";
inline constexpr const char* kCredentialCaFile = "/etc/space/credential-ca.pem";
inline constexpr size_t kMaxCredentialCaBytes = 8 * 1024;

// `bundle` with its credential CA block (if any) replaced by one holding `pem`.
std::string bundleWithCredentialCa(const std::string& bundle, const std::string& pem);

// Whether `pem` is one PEM certificate of plausible size (a check, not a parse: the guest's
// TLS libraries parse it). Empty when it is, else why not.
std::string checkCredentialCaPem(const std::string& pem);

// Writes both files under `root` ("" for the real root), each by temp file and rename. Returns
// "" or what failed.
std::string installCredentialCa(const std::string& pem, const std::string& root = "");

// The variables every process started afterwards gets (below the sandbox's own envVars).
std::map<std::string, std::string> credentialCaEnv();

}  // namespace space::agent
