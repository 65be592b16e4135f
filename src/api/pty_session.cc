#include "api/pty_session.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "agentproto/base64.h"
#include "common/bounded_json.h"

namespace space::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

bool containsTokenIgnoringCase(std::string_view value, std::string_view token) {
  auto lower = [](std::string_view s) {
    std::string out(s);
    for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return out;
  };
  return lower(value).find(lower(token)) != std::string::npos;
}

std::string messageText(const json& message) { return message.dump(-1, ' ', false, json::error_handler_t::replace); }

class PtyBridge {
 public:
  PtyBridge(guest::GuestOps& ops, guest::ProcessStream& stream, int pid, const PtySessionLimits& limits)
      : ops_(ops), stream_(stream), pid_(pid), limits_(limits), ws_(asio::ip::tcp::socket(io_)), abort_(io_) {}

  PtySessionEnd run(const http::Request& req, const http::TakenConnection& connection,
                    std::vector<guest::ProcessEvent> pending) {
    if (!connection.early_bytes.empty()) {
      // A client sends frames only after our 101: bytes before it are not a WebSocket client.
      return kill({"error"});
    }
    if (auto ok = adopt(connection); !ok.ok()) {
      spdlog::warn("pty: sandbox process {}: {}", pid_, ok.error().message);
      return kill({"error"});
    }
    websocket::stream_base::timeout timeouts{};
    timeouts.handshake_timeout = limits_.handshake_timeout;
    timeouts.idle_timeout = limits_.idle_timeout;
    timeouts.keep_alive_pings = true;  // a silent but present client answers our pings
    ws_.set_option(timeouts);
    ws_.read_message_max(limits_.max_client_message);
    ws_.auto_fragment(false);

    for (const auto& [name, value] : req.headers()) upgrade_.insert(name, value);
    upgrade_.method_string(req.method());
    upgrade_.target(req.target());
    upgrade_.version(11);
    abort_.async_wait(asio::posix::stream_descriptor::wait_read, [this](beast::error_code ec) {
      if (!ec) finish("aborted");
    });
    ws_.async_accept(upgrade_, [this, pending = std::move(pending)](beast::error_code ec) mutable {
      if (ec) {
        spdlog::info("pty: process {}: WebSocket handshake failed: {}", pid_, ec.message());
        return finish("client_closed");
      }
      enqueue(true, messageText(json{{"type", "started"}, {"pid", pid_}}));
      Decoded first = decode(std::move(pending));
      deliver(std::move(first.frames), first.end, guest::ProcessStream::State::kOpen, std::nullopt);
      readNext();
      pump_ = std::thread([this] { pumpEvents(); });
      reauthorizeLater();
    });
    io_.run();
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    room_.notify_all();
    if (pump_.joinable()) pump_.join();
    if (!process_over_) {
      // A hung-up terminal: the shell and its foreground job go with it.
      (void)ops_.sendSignal(pid_, guest::Signal::kKill);
    }
    return end_;
  }

 private:
  struct Outgoing {
    bool text = false;
    std::string data;
  };

  PtySessionEnd kill(PtySessionEnd end) {
    (void)ops_.sendSignal(pid_, guest::Signal::kKill);
    return end;
  }

  // The server keeps (and later closes) the connection's descriptors; the session works on
  // duplicates it owns.
  Status adopt(const http::TakenConnection& connection) {
    int fd = ::fcntl(connection.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return makeError(ErrorCode::kInternal, std::string("dup: ") + std::strerror(errno));
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      ::close(fd);
      return makeError(ErrorCode::kInternal, std::string("getsockname: ") + std::strerror(errno));
    }
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().assign(
        local.ss_family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(), fd, ec);
    if (ec) {
      ::close(fd);
      return makeError(ErrorCode::kInternal, "adopting the socket: " + ec.message());
    }
    int abort_fd = ::fcntl(connection.abort_fd, F_DUPFD_CLOEXEC, 0);
    if (abort_fd < 0) return makeError(ErrorCode::kInternal, std::string("dup: ") + std::strerror(errno));
    abort_.assign(abort_fd, ec);
    if (ec) {
      ::close(abort_fd);
      return makeError(ErrorCode::kInternal, "adopting the abort descriptor: " + ec.message());
    }
    return okStatus();
  }

  // ---- client -> guest (on the loop)

  void readNext() {
    ws_.async_read(input_, [this](beast::error_code ec, size_t) {
      if (ec) return finish("client_closed");
      std::string data = beast::buffers_to_string(input_.data());
      input_.consume(input_.size());
      if (ws_.got_binary()) {
        // Input to a process that just ended fails; its exit message is on its way.
        if (!process_over_) steer(ops_.sendPtyInput(pid_, data));
      } else if (auto refused = control(data); !refused.ok()) {
        return protocolError(refused.error().message);
      }
      if (!ended_ && !closing_) readNext();
    });
  }

  Status control(std::string_view text) {
    auto message = parseJsonBounded(text, JsonLimits{4, 64});
    if (!message.ok()) return makeError(ErrorCode::kInvalidArgument, "a control message is not JSON");
    const json& m = message.value();
    if (!m.is_object() || !m.contains("type") || m["type"] != "resize") {
      return makeError(ErrorCode::kInvalidArgument,
                       R"(the only control message is {"type":"resize","cols":C,"rows":R})");
    }
    auto dimension = [&m](const char* name) -> std::optional<int> {
      auto it = m.find(name);
      if (it == m.end() || !it->is_number_integer()) return std::nullopt;
      int64_t v = it->get<int64_t>();
      if (v < 1 || v > 65535) return std::nullopt;
      return static_cast<int>(v);
    };
    auto cols = dimension("cols");
    auto rows = dimension("rows");
    if (!cols || !rows)
      return makeError(ErrorCode::kInvalidArgument, "resize: cols and rows must be integers in 1..65535");
    if (!process_over_) steer(ops_.resizePty(pid_, guest::PtySize{*cols, *rows}));
    return okStatus();
  }

  // The answer to a keystroke or a resize. These calls run on the loop (output waits meanwhile)
  // with the short control deadline; a guest that does not take them in time, or whose agent is
  // gone, ends the session. Other refusals (the terminal closed as the process ended) are the
  // usual race with the exit message and change nothing.
  void steer(const Status& done) {
    if (done.ok() || ended_ || closing_) return;
    const ErrorCode code = done.error().code;
    if (code != ErrorCode::kDeadlineExceeded && code != ErrorCode::kUnavailable) return;
    enqueue(true,
            messageText(json{{"type", "error"},
                             {"code", code == ErrorCode::kDeadlineExceeded ? "deadline_exceeded" : "unavailable"},
                             {"message", "the guest did not take the terminal's input: " + done.error().message}}));
    closeAfterQueue(websocket::close_code::internal_error, "error");
  }

  void protocolError(const std::string& why) {
    if (ended_) return;
    enqueue(true, messageText(json{{"type", "error"}, {"code", "invalid_argument"}, {"message", why}}));
    closeAfterQueue(websocket::close_code::policy_error, "error");
  }

  // ---- guest -> client

  // The pump thread: takes the process's events as they come, decodes them and hands them to the
  // loop, while the client keeps up. The bytes are counted here, before the loop sees them, so
  // a loop that is busy (an agent call) cannot make the pump run ahead of the bound: the pump
  // waits, the stream's own backlog fills and ends the session as too slow.
  void pumpEvents() {
    while (true) {
      bool stalled = false;
      {
        std::unique_lock lock(mutex_);
        while (!stop_ && queued_bytes_ >= limits_.max_queued_output) {
          room_.wait_for(lock, std::chrono::milliseconds(500));
          if (Clock::now() - last_drain_ > limits_.stalled_client_timeout) {
            stalled = true;
            break;
          }
        }
        if (stop_) return;
      }
      if (stalled) {
        asio::post(io_, [this] { deliver({}, std::nullopt, guest::ProcessStream::State::kOverflow, std::nullopt); });
        return;
      }
      auto batch = stream_.next(std::chrono::milliseconds(500));
      if (batch.events.empty() && batch.state == guest::ProcessStream::State::kOpen) continue;
      Decoded decoded = decode(std::move(batch.events));
      const bool last = decoded.end || batch.state != guest::ProcessStream::State::kOpen;
      asio::post(io_, [this, frames = std::move(decoded.frames), end = decoded.end, state = batch.state,
                       error = std::move(batch.error)]() mutable { deliver(std::move(frames), end, state, error); });
      if (last) return;
    }
  }

  struct Decoded {
    std::vector<Outgoing> frames;
    std::optional<guest::ProcessEnd> end;  // the process's end; events after it do not count
  };
  // Output events become binary frames, counted in queued_bytes_ at once (see pumpEvents).
  Decoded decode(std::vector<guest::ProcessEvent> events) {
    using Kind = guest::ProcessEvent::Kind;
    Decoded out;
    size_t bytes = 0;
    for (auto& event : events) {
      if (event.kind == Kind::kStdout || event.kind == Kind::kStderr) {
        // GuestOps checked it canonical and bounded; decoding cannot fail.
        if (auto data = agentproto::base64Decode(event.data_base64)) {
          bytes += data->size();
          out.frames.push_back({false, std::move(*data)});
        }
      } else if (event.kind == Kind::kEnd) {
        out.end = event.end;
        break;
      }
    }
    std::lock_guard lock(mutex_);
    queued_bytes_ += bytes;
    return out;
  }

  // `frames` are counted in queued_bytes_ already.
  void deliver(std::vector<Outgoing> frames, const std::optional<guest::ProcessEnd>& end,
               guest::ProcessStream::State state, const std::optional<Error>& error) {
    if (ended_ || closing_) return;
    for (auto& frame : frames) out_.push_back(std::move(frame));
    writeNext();
    if (end) {
      process_over_ = true;
      end_ = {"exited", end->exit_code};
      enqueue(true, messageText(json{{"type", "exit"}, {"exit_code", end->exit_code}, {"status", end->status}}));
      return closeAfterQueue(websocket::close_code::normal, "exited");
    }
    using State = guest::ProcessStream::State;
    if (state == State::kOverflow) {
      enqueue(true, messageText(json{{"type", "error"},
                                     {"code", "client_too_slow"},
                                     {"message", "the terminal's output arrived faster than the client read it"}}));
      closeAfterQueue(websocket::close_code::try_again_later, "client_too_slow");
    } else if (state == State::kEnded) {
      // The stream ended without the process's end (a malformed event, the agent's stream
      // reset): the process may still run, and run() kills it.
      std::string message = error ? error->message : "the process's stream ended";
      enqueue(true, messageText(json{{"type", "error"}, {"code", "unavailable"}, {"message", message}}));
      closeAfterQueue(websocket::close_code::internal_error, "error");
    }
  }

  void enqueue(bool text, std::string data) {
    {
      std::lock_guard lock(mutex_);
      queued_bytes_ += data.size();
    }
    out_.push_back({text, std::move(data)});
    writeNext();
  }

  void closeAfterQueue(websocket::close_code code, std::string outcome) {
    if (closing_) return;
    closing_ = true;
    close_code_ = code;
    if (end_.outcome.empty()) end_.outcome = std::move(outcome);
    // What is queued goes out first, but a client that does not read it (the too slow one
    // among others) gets only so long: then the connection is cut.
    close_deadline_.expires_after(kCloseGrace);
    close_deadline_.async_wait([this](beast::error_code ec) {
      if (!ec) shutdown();
    });
    writeNext();
  }

  void writeNext() {
    if (writing_ || ended_) return;
    if (out_.empty()) {
      if (!closing_) return;
      writing_ = true;
      ws_.async_close(close_code_, [this](beast::error_code) { shutdown(); });
      return;
    }
    writing_ = true;
    ws_.text(out_.front().text);
    ws_.async_write(asio::buffer(out_.front().data), [this](beast::error_code ec, size_t) {
      writing_ = false;
      {
        std::lock_guard lock(mutex_);
        queued_bytes_ -= out_.front().data.size();
        last_drain_ = Clock::now();
      }
      room_.notify_all();
      out_.pop_front();
      if (ec) return finish("client_closed");
      writeNext();
    });
  }

  void reauthorizeLater() {
    if (!limits_.authorized) return;
    reauthorize_.expires_after(limits_.reauthorize_every);
    reauthorize_.async_wait([this](beast::error_code ec) {
      if (ec || ended_ || closing_) return;
      if (limits_.authorized()) return reauthorizeLater();
      enqueue(true, messageText(json{{"type", "error"},
                                     {"code", "unauthenticated"},
                                     {"message", "the key or console session that opened this terminal has ended"}}));
      closeAfterQueue(websocket::close_code::policy_error, "unauthenticated");
    });
  }

  // ---- the end

  void finish(const char* outcome) {
    if (end_.outcome.empty()) end_.outcome = outcome;
    shutdown();
  }

  void shutdown() {
    if (ended_) return;
    ended_ = true;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    room_.notify_all();
    beast::error_code ignored;
    abort_.cancel(ignored);
    close_deadline_.cancel();
    reauthorize_.cancel();
    beast::get_lowest_layer(ws_).socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(ws_).close();
    // Beast's idle timer outlives the socket until it next fires (up to idle_timeout): nothing
    // is left to do, so the loop ends now; pending handlers go with it.
    io_.stop();
  }

  guest::GuestOps& ops_;
  guest::ProcessStream& stream_;
  const int pid_;
  const PtySessionLimits limits_;

  asio::io_context io_;
  websocket::stream<beast::tcp_stream> ws_;
  asio::posix::stream_descriptor abort_;
  static constexpr std::chrono::seconds kCloseGrace{5};
  asio::steady_timer close_deadline_{io_};
  asio::steady_timer reauthorize_{io_};
  beast::http::request<beast::http::empty_body> upgrade_;
  beast::flat_buffer input_;
  std::thread pump_;

  // The loop's own.
  std::deque<Outgoing> out_;
  bool writing_ = false;
  bool closing_ = false;  // the queue ends with a close frame
  websocket::close_code close_code_ = websocket::close_code::normal;
  bool ended_ = false;
  bool process_over_ = false;
  PtySessionEnd end_;

  // Shared with the pump.
  std::mutex mutex_;
  std::condition_variable room_;
  size_t queued_bytes_ = 0;
  Clock::time_point last_drain_ = Clock::now();  // the last write the client took
  bool stop_ = false;
};

}  // namespace

bool isWebSocketUpgrade(const http::Request& req) {
  auto upgrade = req.header("upgrade");
  return req.method() == "GET" && upgrade && containsTokenIgnoringCase(*upgrade, "websocket");
}

PtySessionEnd runPtySession(const http::Request& req, http::TakenConnection connection, guest::GuestOps& ops,
                            guest::ProcessStream& stream, int pid, std::vector<guest::ProcessEvent> pending,
                            const PtySessionLimits& limits) {
  PtyBridge bridge(ops, stream, pid, limits);
  return bridge.run(req, connection, std::move(pending));
}

}  // namespace space::api
