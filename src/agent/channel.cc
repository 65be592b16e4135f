#include "agent/channel.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace space::agent {

namespace {
constexpr size_t kOutputBudget = 256 << 10;  // pull more from HTTP/2 only below this
constexpr std::string_view kH2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr std::chrono::milliseconds kSafetyPoll{1000};
}  // namespace

Channel::Channel(EventLoop& loop, const Router& router, std::function<Json()> info)
    : loop_(loop), router_(router), info_(std::move(info)) {}

Channel::~Channel() {
  loop_.cancelTimer(safety_timer_);
  session_.reset();
  if (watching_) loop_.removeFd(fd_);
  if (owned_ && fd_ >= 0) close(fd_);
}

Status Channel::open(const std::string& port_path) {
  int fd = ::open(port_path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return makeError(ErrorCode::kInternal, "open " + port_path + ": " + strerror(errno));
  // Ask the virtio console driver for SIGIO when the host attaches or detaches, so the agent
  // can sleep while disconnected instead of spinning on a level-triggered POLLHUP.
  fcntl(fd, F_SETOWN, getpid());
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_ASYNC);
  adopt(fd, true);
  return okStatus();
}

void Channel::adopt(int fd, bool owned) {
  fd_ = fd;
  owned_ = owned;
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  poke();
}

void Channel::poke() {
  checkHost();
  // checkHost's poll() is not a harmless look. On a virtio port it takes the host's next unread
  // buffer off the ring (and reclaims sent ones); the interrupt for that buffer then finds the
  // ring empty and wakes no one, and epoll, which last saw the port empty, sleeps on. The bytes
  // would wait for the host's next write, which a lone request never gets. SIGIO arrives for
  // every write of the host, so this ran after each request, and now and then a lone call was
  // lost (docs/agent.md, "The channel: a look at the port is a read"). So whatever the poll
  // picked up is read, and whatever waits for room is written, now.
  if (state_ != State::kDisconnected) readAvailable();
  armSafetyPoll();
}

void Channel::armSafetyPoll() {
  // Only while no host is attached: SIGIO may miss an attach. An attached port is watched by
  // epoll, which reports the detach (POLLHUP is level-triggered), so a connected guest keeps no
  // timer: an idle pooled guest must not wake every second (bench/RESULTS.md, idle CPU).
  loop_.cancelTimer(safety_timer_);
  safety_timer_ = 0;
  if (fd_ >= 0 && state_ == State::kDisconnected) safety_timer_ = loop_.addTimer(kSafetyPoll, [this] { poke(); });
}

void Channel::checkHost() {
  if (fd_ < 0) return;
  pollfd p{fd_, POLLIN, 0};
  poll(&p, 1, 0);
  bool host_attached = (p.revents & POLLHUP) == 0;
  if (host_attached && state_ == State::kDisconnected) {
    attach();
  } else if (!host_attached && state_ != State::kDisconnected) {
    // Read whatever the host sent before leaving (it may end a stream), then drop the session.
    readAvailable();
    // Unless it came back meanwhile: the driver reports data at once but a port opening only
    // later, so those bytes may have been a new host's hello, already answered. (A restored
    // guest sees exactly this: QEMU reports the host gone and back right after the load.)
    pollfd again{fd_, POLLIN, 0};
    poll(&again, 1, 0);
    if ((again.revents & POLLHUP) == 0) return;
    disconnect("host detached");
  }
}

void Channel::attach() {
  state_ = State::kHandshake;
  scanner_ = std::make_unique<agentproto::HandshakeScanner>(agentproto::kHelloPrefix, "");
  out_.clear();
  out_off_ = 0;
  watching_ = true;
  loop_.addFd(fd_, EPOLLIN, [this](uint32_t ev) { onEvents(ev); });
}

void Channel::disconnect(const char* why) {
  if (state_ == State::kDisconnected) return;
  fprintf(stderr, "space-agent: channel: %s\n", why);
  state_ = State::kDisconnected;
  session_.reset();  // open streams end; services detach from them
  scanner_.reset();
  preface_buf_.clear();
  out_.clear();
  out_off_ = 0;
  if (watching_) {
    loop_.removeFd(fd_);
    watching_ = false;
  }
  armSafetyPoll();
}

void Channel::onEvents(uint32_t events) {
  if (events & EPOLLIN) readAvailable();
  if (state_ == State::kDisconnected) return;
  if (events & (EPOLLHUP | EPOLLERR)) {
    poke();
    return;
  }
  if (events & EPOLLOUT) flush();
}

void Channel::readAvailable() {
  char buf[64 << 10];
  // Bounded per wake-up so a flood from the host cannot starve process output. What is left
  // keeps the port readable, and epoll (level-triggered) reports it on the next turn.
  for (int round = 0; round < 16 && state_ != State::kDisconnected; ++round) {
    ssize_t n = read(fd_, buf, sizeof buf);
    if (traceEnabled()) {
      const int saved = errno;  // the checks below read it
      fprintf(stderr, "space-agent: channel: read %zd (state %d)\n", n, static_cast<int>(state_));
      errno = saved;
    }
    if (n > 0) {
      handleBytes(std::string_view(buf, static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 && !owned_) {
      disconnect("peer closed");  // a socket (tests): EOF is final
    }
    break;  // EAGAIN, or 0 on the port while detached (poke() decides)
  }
  flush();
}

void Channel::handleBytes(std::string_view bytes) {
  // A loop, not recursion: one read may hold many handshakes' worth of bytes, and each state
  // change hands the remaining bytes to the next state.
  std::string carry;
  std::string_view in = bytes;
  auto restartHandshake = [this] {
    state_ = State::kHandshake;
    scanner_ = std::make_unique<agentproto::HandshakeScanner>(agentproto::kHelloPrefix, "");
  };
  while (!in.empty()) {
    switch (state_) {
      case State::kDisconnected: return;
      case State::kHandshake: {
        auto match = scanner_->feed(in);
        in = {};
        if (!match.ok()) {
          restartHandshake();  // too much junk: forget it and keep listening
          break;
        }
        if (!match.value()) break;
        Json info = info_();
        out_ += agentproto::makeOlleh(match.value()->nonce, info.dump(-1, ' ', true, Json::error_handler_t::replace));
        state_ = State::kAwaitPreface;
        preface_buf_.clear();
        carry = std::move(match.value()->rest);
        in = carry;
        break;
      }
      case State::kAwaitPreface: {
        preface_buf_.append(in);
        in = {};
        // The host either sends another hello (it retried before our answer arrived) or HTTP/2.
        std::string_view buf = preface_buf_;
        std::string_view hello = agentproto::kHelloPrefix;
        size_t cmp_hello = std::min(buf.size(), hello.size());
        size_t cmp_h2 = std::min(buf.size(), kH2Preface.size());
        bool maybe_hello = buf.substr(0, cmp_hello) == hello.substr(0, cmp_hello);
        bool maybe_h2 = buf.substr(0, cmp_h2) == kH2Preface.substr(0, cmp_h2);
        if ((maybe_hello && buf.size() < hello.size()) || (maybe_h2 && buf.size() < kH2Preface.size())) break;
        std::string pending = std::move(preface_buf_);
        preface_buf_.clear();
        if (maybe_h2) {
          state_ = State::kHttp2;
          ++sessions_;
          session_ = std::make_unique<H2ServerSession>(loop_, router_, [this] { loop_.post([this] { flush(); }); });
        } else {
          restartHandshake();  // another hello, or garbage: scan again
        }
        carry = std::move(pending);
        in = carry;
        break;
      }
      case State::kHttp2: {
        auto st = session_->receive(in);
        if (st.ok() && !session_->terminated()) {
          in = {};
          break;
        }
        // Either the host broke HTTP/2 or a new host took over the port so quickly that no
        // detach was visible: it opens with filler that ends any frame in progress, so the old
        // session fails here. Start over and look for its hello in these same bytes.
        fprintf(stderr, "space-agent: channel: session ended (%s); waiting for a new handshake\n",
                st.ok() ? "goaway" : st.error().message.c_str());
        session_.reset();
        restartHandshake();
        carry = std::string(in);
        in = carry;
        break;
      }
    }
  }
}

void Channel::flush() {
  if (state_ == State::kDisconnected) return;
  while (true) {
    if (out_off_ == out_.size()) {
      out_.clear();
      out_off_ = 0;
    }
    if (session_ && out_.size() - out_off_ < kOutputBudget) out_ += session_->takeOutput(kOutputBudget);
    if (out_off_ == out_.size()) break;
    ssize_t n = write(fd_, out_.data() + out_off_, out_.size() - out_off_);
    if (traceEnabled()) {
      const int saved = errno;
      fprintf(stderr, "space-agent: channel: wrote %zd of %zu (errno %d)\n", n, out_.size() - out_off_,
              n < 0 ? saved : 0);
      errno = saved;
    }
    if (n > 0) {
      out_off_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: the host is slow; wait for EPOLLOUT
  }
  updateInterest();
}

void Channel::updateInterest() {
  if (!watching_) return;
  bool pending = out_off_ < out_.size() || (session_ && session_->wantsToWrite());
  loop_.modifyFd(fd_, EPOLLIN | (pending ? EPOLLOUT : 0u));
}

}  // namespace space::agent
