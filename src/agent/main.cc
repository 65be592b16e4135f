// space-agent: the guest's PID 1. Sets up the guest (guest_init), then serves the host over the
// virtio-serial port "space.agent" (channel + HTTP/2 + the process and filesystem services),
// reaping every child on the way. Also runs as an ordinary process for tests: `--connect SOCKET`
// serves a Unix socket instead of the port.
#include <fcntl.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "agent/channel.h"
#include "agent/event_loop.h"
#include "agent/fs_service.h"
#include "agent/guest_init.h"
#include "agent/guest_stats.h"
#include "agent/process_service.h"
#include "agent/trust_store.h"
#include "agent/users.h"
#include "agentproto/base64.h"

namespace {

using namespace space::agent;

constexpr const char* kVersion = "0.1.0";
constexpr const char* kPortName = "space.agent";

Json agentInfo() {
  utsname u{};
  uname(&u);
  double uptime = 0;
  std::ifstream("/proc/uptime") >> uptime;
  return Json{{"version", kVersion},
              {"kernel", u.release},
              {"hostname", u.nodename},
              {"uptime", uptime},
              {"pid1", getpid() == 1}};
}

int connectSocket(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || path.size() >= sizeof addr.sun_path) return -1;
  memcpy(addr.sun_path, path.data(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  std::string connect_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--connect" && i + 1 < argc) {
      connect_path = argv[++i];
    } else if (a == "--help" || a == "-h") {
      printf(
          "usage: space-agent [--connect UNIX_SOCKET]\n"
          "Runs as PID 1 of a SPACE guest and serves the host on the virtio-serial port \"%s\".\n"
          "--connect serves a Unix socket instead (for tests on a host).\n",
          kPortName);
      return 0;
    } else if (getpid() != 1) {
      fprintf(stderr, "space-agent: unknown argument %s (try --help)\n", a.c_str());
      return 2;
    }
    // As PID 1 the kernel passes unknown boot arguments along: ignore them.
  }
  const bool pid1 = getpid() == 1;
  if (pid1) initGuest();

  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGCHLD, SIGIO, SIGTERM, SIGINT, SIGPWR}) sigaddset(&mask, sig);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);

  EventLoop loop;
  UserDb users;
  Router router;
  ProcessService processes(loop, users);
  FsService files(loop, users);
  processes.registerWith(router);
  files.registerWith(router);

  bool shutdown_requested = false;
  auto shutdown = [&] {
    if (!pid1) {
      loop.stop();
      return;
    }
    shutdownGuest();
  };
  router.unary("/agent.Agent/Info", [](const Json&, const CallContext&) -> UnaryResult { return agentInfo(); });
  router.unary("/agent.Agent/Stats", [](const Json&, const CallContext&) -> UnaryResult { return readGuestStats(); });
  router.unary("/agent.Agent/Configure", [&](const Json& req, const CallContext&) -> UnaryResult {
    std::map<std::string, std::string> env;
    if (req.contains("envVars")) {
      const Json& vars = req["envVars"];
      if (!vars.is_object()) return rpcError(RpcCode::kInvalidArgument, "envVars must be an object");
      for (const auto& [k, v] : vars.items()) {
        if (!v.is_string() || k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
          return rpcError(RpcCode::kInvalidArgument, "envVars: bad entry \"" + k + "\"");
        }
        env[k] = v.get<std::string>();
      }
    }
    std::string hostname;
    int64_t time_ms = 0;
    std::string entropy;
    if (req.contains("hostname")) {
      const Json& h = req["hostname"];
      if (!h.is_string() || h.get_ref<const std::string&>().empty() || h.get_ref<const std::string&>().size() > 64 ||
          h.get_ref<const std::string&>().find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") !=
              std::string::npos) {
        return rpcError(RpcCode::kInvalidArgument, "hostname must be 1..64 of [a-z0-9-]");
      }
      hostname = h.get<std::string>();
    }
    if (req.contains("timeMs")) {
      if (!req["timeMs"].is_number_integer() || req["timeMs"].get<int64_t>() <= 0) {
        return rpcError(RpcCode::kInvalidArgument, "timeMs must be a positive integer");
      }
      time_ms = req["timeMs"].get<int64_t>();
    }
    if (req.contains("entropy")) {
      auto bytes = req["entropy"].is_string() ? space::agentproto::base64Decode(req["entropy"].get<std::string>())
                                              : std::nullopt;
      if (!bytes || bytes->empty() || bytes->size() > 512) {
        return rpcError(RpcCode::kInvalidArgument, "entropy must be 1..512 bytes of base64");
      }
      entropy = std::move(*bytes);
    }
    std::map<std::string, std::string> credential_env;
    if (req.contains("credentialEnv")) {
      const Json& vars = req["credentialEnv"];
      if (!vars.is_object() || vars.size() > 64)
        return rpcError(RpcCode::kInvalidArgument, "credentialEnv must be an object");
      for (const auto& [k, v] : vars.items()) {
        if (!v.is_string() || k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
            v.get_ref<const std::string&>().find('\0') != std::string::npos) {
          return rpcError(RpcCode::kInvalidArgument, "credentialEnv: bad entry \"" + k + "\"");
        }
        credential_env[k] = v.get<std::string>();
      }
    }
    std::string credential_ca;
    if (req.contains("credentialCa")) {
      if (!req["credentialCa"].is_string()) return rpcError(RpcCode::kInvalidArgument, "credentialCa must be a string");
      credential_ca = req["credentialCa"].get<std::string>();
      if (auto bad = space::agent::checkCredentialCaPem(credential_ca); !bad.empty()) {
        return rpcError(RpcCode::kInvalidArgument, bad);
      }
    }
    if (req.contains("envVars")) processes.setSandboxEnv(std::move(env));
    // The identity first: a CA that cannot be installed (a guest that broke its own /etc/ssl)
    // must not leave a clone with its template's clock and random state.
    if (auto failed = applyIdentity(hostname, time_ms, entropy); !failed.empty()) {
      return rpcError(RpcCode::kInternal, "identity: " + failed);
    }
    if (!credential_ca.empty()) {
      // The trust variables, then the placeholders; the sandbox's own envVars override both.
      auto base = space::agent::credentialCaEnv();
      for (auto& [k, v] : credential_env) base[k] = std::move(v);
      processes.setBaseEnv(std::move(base));
      if (auto failed = space::agent::installCredentialCa(credential_ca); !failed.empty()) {
        return rpcError(RpcCode::kInternal, "credentialCa: " + failed);
      }
    }
    return Json::object();
  });
  router.unary("/agent.Agent/Shutdown", [&](const Json&, const CallContext&) -> UnaryResult {
    if (!shutdown_requested) {
      shutdown_requested = true;
      // Let the reply reach the host first.
      loop.addTimer(std::chrono::milliseconds(50), shutdown);
    }
    return Json::object();
  });

  Channel channel(loop, router, agentInfo);
  if (!connect_path.empty()) {
    int fd = connectSocket(connect_path);
    if (fd < 0) {
      fprintf(stderr, "space-agent: cannot connect to %s: %s\n", connect_path.c_str(), strerror(errno));
      return 1;
    }
    channel.adopt(fd, false);
  } else {
    std::string port;
    for (int i = 0; i < 200 && port.empty(); ++i) {  // the port appears once its driver probed
      port = findVirtioPort(kPortName);
      if (port.empty()) usleep(50000);
    }
    if (port.empty()) {
      fprintf(stderr, "space-agent: no virtio-serial port named %s\n", kPortName);
      if (pid1) shutdownGuest();
      return 1;
    }
    if (auto st = channel.open(port); !st.ok()) {
      fprintf(stderr, "space-agent: %s\n", st.error().message.c_str());
      if (pid1) shutdownGuest();
      return 1;
    }
  }

  loop.addFd(sfd, EPOLLIN, [&](uint32_t) {
    signalfd_siginfo si{};
    while (read(sfd, &si, sizeof si) == sizeof si) {
      switch (si.ssi_signo) {
        case SIGCHLD: {
          int status = 0;
          pid_t pid;
          while ((pid = waitpid(-1, &status, WNOHANG)) > 0) processes.onChildExit(pid, status);
          break;
        }
        case SIGIO: channel.poke(); break;
        default:  // SIGTERM, SIGINT, SIGPWR
          shutdown();
      }
    }
  });
  loop.run();
  return 0;
}
