#include "apiclient/terminal.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>

#include "common/bounded_json.h"

namespace space::apiclient {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using json = nlohmann::json;

namespace {

// Restores a descriptor's file status flags: the terminal's open file is shared with the shell
// that started us, and leaving it non-blocking would break the programs run after us.
class FlagsRestorer {
 public:
  explicit FlagsRestorer(int fd) : fd_(fd), flags_(fd >= 0 ? ::fcntl(fd, F_GETFL) : -1) {}
  ~FlagsRestorer() {
    if (flags_ >= 0) (void)::fcntl(fd_, F_SETFL, flags_);
  }
  FlagsRestorer(const FlagsRestorer&) = delete;
  FlagsRestorer& operator=(const FlagsRestorer&) = delete;

 private:
  int fd_;
  int flags_;
};

class TerminalSession {
 public:
  TerminalSession(const Client& client, const TerminalIo& io)
      : client_(client), io_(io), ws_(asio::ip::tcp::socket(loop_)), input_(loop_), resize_(loop_) {}

  Result<TerminalEnd> run(const std::string& target) {
    auto fd = client_.http().connect(std::chrono::seconds(10));
    if (!fd.ok()) return client_.transportError(fd.error());
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    if (::getpeername(fd.value().get(), reinterpret_cast<sockaddr*>(&peer), &len) != 0) {
      return makeError(ErrorCode::kUnavailable, std::string("getpeername: ") + std::strerror(errno));
    }
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().assign(peer.ss_family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(),
                                                 fd.value().get(), ec);
    if (ec) return makeError(ErrorCode::kInternal, "adopting the socket: " + ec.message());
    (void)fd.value().release();  // the socket owns it now
    if (!adoptDescriptor(input_, io_.input_fd) || !adoptDescriptor(resize_, io_.resize_fd)) {
      return makeError(ErrorCode::kInternal, std::string("dup: ") + std::strerror(errno));
    }

    websocket::stream_base::timeout timeouts{};
    timeouts.handshake_timeout = std::chrono::seconds(60);  // the daemon may resume the sandbox first
    // The daemon pings a quiet session every 30 s: silence for longer means it is gone.
    timeouts.idle_timeout = std::chrono::seconds(90);
    timeouts.keep_alive_pings = false;
    ws_.set_option(timeouts);
    ws_.read_message_max(kMaxTerminalFrame);
    const std::string key = client_.endpoint().key;
    ws_.set_option(websocket::stream_base::decorator([key](websocket::request_type& req) {
      if (!key.empty()) req.set(beast::http::field::authorization, "Bearer " + key);
      req.set(beast::http::field::user_agent, "spacectl");
    }));
    ws_.async_handshake(response_, client_.http().authority(), target, [this](beast::error_code ec) {
      if (ec == websocket::error::upgrade_declined) {
        error_ = client_.apiError(static_cast<int>(response_.result_int()), response_.body());
        return stop();
      }
      if (ec) {
        error_ = client_.transportError(makeError(ErrorCode::kUnavailable, "WebSocket handshake: " + ec.message()));
        return stop();
      }
      readMessage();
      readInput();
      waitResize();
    });
    loop_.run();
    if (error_) return *error_;
    if (!end_) {
      return makeError(ErrorCode::kUnavailable, "the terminal session ended without the process's exit status" +
                                                    (close_reason_.empty() ? std::string() : ": " + close_reason_));
    }
    return *end_;
  }

 private:
  bool adoptDescriptor(asio::posix::stream_descriptor& d, int fd) {
    if (fd < 0) return true;
    int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return false;
    beast::error_code ec;
    d.assign(own, ec);
    if (ec) ::close(own);
    return !ec;
  }

  // ---- from the daemon

  void readMessage() {
    ws_.async_read(in_, [this](beast::error_code ec, size_t) {
      if (ec) {
        if (ec == websocket::error::closed)
          close_reason_ = std::string(ws_.reason().reason.c_str());
        else if (!end_ && !error_)
          error_ = makeError(ErrorCode::kUnavailable, "the terminal session was lost: " + ec.message());
        return stop();
      }
      std::string data = beast::buffers_to_string(in_.data());
      in_.consume(in_.size());
      if (ws_.got_binary()) {
        if (io_.on_output) io_.on_output(data);
      } else {
        control(data);
      }
      readMessage();
    });
  }

  void control(const std::string& text) {
    auto parsed = parseJsonBounded(text, JsonLimits{4, 64});
    if (!parsed.ok() || !parsed.value().is_object()) return;  // not ours to act on
    const json& m = parsed.value();
    const json& type = field(m, "type");
    if (type == "started") {
      const json& pid = field(m, "pid");
      if (io_.on_started && pid.is_number_integer()) io_.on_started(pid.get<int>());
    } else if (type == "exit") {
      TerminalEnd end;
      const json& code = field(m, "exit_code");
      if (code.is_number_integer()) end.exit_code = code.get<int>();
      if (field(m, "status").is_string()) end.status = field(m, "status").get<std::string>();
      end_ = end;
    } else if (type == "error") {
      std::string message = field(m, "message").is_string() ? field(m, "message").get<std::string>() : "";
      std::string code = field(m, "code").is_string() ? field(m, "code").get<std::string>() : "";
      Error e = makeError(ErrorCode::kUnavailable, "the terminal session failed: " + message);
      e.reason = code;
      error_ = e;
    }
  }

  // ---- to the daemon

  // Input is read while less than kMaxQueuedInput waits to go out (a paste or a piped file
  // into a daemon that reads slowly must not pile up here); the write that drains it resumes.
  static constexpr size_t kMaxQueuedInput = 256 * 1024;

  void readInput() {
    if (!input_.is_open() || reading_input_ || stopped_) return;
    if (queued_bytes_ >= kMaxQueuedInput) return;
    reading_input_ = true;
    input_.async_read_some(asio::buffer(keys_), [this](beast::error_code ec, size_t n) {
      reading_input_ = false;
      if (ec) {
        beast::error_code ignored;
        input_.close(ignored);  // the end of input (or of the session): nothing more to send
        return;
      }
      send(false, std::string(keys_.data(), n));
      readInput();
    });
  }

  void waitResize() {
    if (!resize_.is_open()) return;
    resize_.async_wait(asio::posix::stream_descriptor::wait_read, [this](beast::error_code ec) {
      if (ec) return;
      char drain[64];
      while (::read(resize_.native_handle(), drain, sizeof drain) > 0) {
      }
      if (auto size = io_.window_size ? io_.window_size() : std::nullopt) {
        send(true, json{{"type", "resize"}, {"cols", size->first}, {"rows", size->second}}.dump());
      }
      waitResize();
    });
  }

  void send(bool text, std::string data) {
    if (stopped_) return;
    queued_bytes_ += data.size();
    out_.push_back({text, std::move(data)});
    writeNext();
  }

  void writeNext() {
    if (writing_ || out_.empty() || stopped_) return;
    writing_ = true;
    ws_.text(out_.front().first);
    ws_.async_write(asio::buffer(out_.front().second), [this](beast::error_code ec, size_t) {
      writing_ = false;
      queued_bytes_ -= out_.front().second.size();
      out_.pop_front();
      if (ec) return;  // the read side sees the same failure and says why
      writeNext();
      readInput();
    });
  }

  void stop() {
    if (stopped_) return;
    stopped_ = true;
    beast::error_code ignored;
    input_.cancel(ignored);
    resize_.cancel(ignored);
    input_.close(ignored);
    resize_.close(ignored);
    beast::get_lowest_layer(ws_).close();
    loop_.stop();  // Beast's idle timer would keep the loop until it next fires
  }

  const Client& client_;
  const TerminalIo& io_;
  asio::io_context loop_;
  websocket::stream<beast::tcp_stream> ws_;
  asio::posix::stream_descriptor input_;
  asio::posix::stream_descriptor resize_;
  websocket::response_type response_;
  beast::flat_buffer in_;
  std::array<char, 4096> keys_{};
  std::deque<std::pair<bool, std::string>> out_;
  bool writing_ = false;
  bool reading_input_ = false;
  size_t queued_bytes_ = 0;
  bool stopped_ = false;
  std::optional<TerminalEnd> end_;
  std::optional<Error> error_;
  std::string close_reason_;
};

}  // namespace

Result<TerminalEnd> runTerminal(const Client& client, const std::string& sandbox_id, const TerminalOptions& options,
                                const TerminalIo& io) {
  Query query;
  query.add("cols", std::to_string(options.cols)).add("rows", std::to_string(options.rows)).add("term", options.term);
  if (!options.user.empty()) query.add("user", options.user);
  if (!options.cwd.empty()) query.add("cwd", options.cwd);
  if (!options.command.empty()) query.add("command", options.command);
  for (const auto& arg : options.argv) query.add("arg", arg);
  std::string target = client.http().basePath() + query.on(sandboxPath(sandbox_id) + "/pty");
  FlagsRestorer restore_input(io.input_fd);
  TerminalSession session(client, io);
  return session.run(target);
}

}  // namespace space::apiclient
