#include "api/pty_session.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "agentproto/base64.h"
#include "common/bounded_json.h"
#include "common/unix_socket.h"

namespace space::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using Socket = asio::local::stream_protocol::socket;
using Upgrade = beast::http::request<beast::http::empty_body>;

namespace {

std::string messageText(const json& message) { return message.dump(-1, ' ', false, json::error_handler_t::replace); }

// Hands work to the loop from any thread, for as long as the loop exists: the agent client's
// callbacks may run after the sessions object is gone, and then drop their work instead.
class Poster {
 public:
  explicit Poster(asio::io_context& io) : io_(&io) {}
  void post(std::function<void()> task) {
    std::lock_guard lock(mu_);
    if (io_ != nullptr) asio::post(*io_, std::move(task));
  }
  void forget() {
    std::lock_guard lock(mu_);
    io_ = nullptr;
  }

 private:
  std::mutex mu_;
  asio::io_context* io_;
};

class Terminal;

}  // namespace

namespace detail {

// How many Terminal objects exist, for the end to wait on. Shared, so a session destroyed last
// (by a loop stopped by force) still finds it.
struct Tally {
  std::mutex mu;
  std::condition_variable changed;
  size_t live = 0;   // guarded by mu
  size_t kills = 0;  // guarded by mu: calls to kill a session's process not yet answered
};

struct PtyLoop {
  explicit PtyLoop(PtySessionLimits l) : limits(std::move(l)) {}

  // First, so it goes last: sessions destroyed with the members below still have their loop, and
  // handlers that only a loop stopped by force left behind destroy theirs with it.
  asio::io_context io;
  const PtySessionLimits limits;
  std::shared_ptr<Poster> poster;
  std::shared_ptr<Tally> tally = std::make_shared<Tally>();

  std::mutex mu;
  struct Entry {
    // The session's owner while it runs: a session whose reading is paused, with a call to the
    // guest out, has no handler of its own pending.
    std::shared_ptr<Terminal> terminal;
    std::shared_ptr<const std::function<bool()>> authorized;  // null: never asked
  };
  std::map<uint64_t, Entry> sessions;  // guarded by mu: those not ended
  uint64_t next_id = 0;                // guarded by mu
  bool stopping = false;               // guarded by mu
  // What ended sessions leave to release off the loop (see Terminal::shutdown).
  std::vector<std::shared_ptr<void>> releases;  // guarded by mu
  std::condition_variable changed;              // stopping was set, or releases came (for the side thread)

  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
};

}  // namespace detail

namespace {

using detail::PtyLoop;

class Terminal : public std::enable_shared_from_this<Terminal> {
 public:
  Terminal(PtyLoop& loop, uint64_t id, Socket socket, PtyProcess process)
      : loop_(loop),
        limits_(loop.limits),
        id_(id),
        process_(std::move(process)),
        ws_(std::move(socket)),
        close_deadline_(loop.io),
        stall_timer_(loop.io),
        tally_(loop.tally) {
    std::lock_guard lock(tally_->mu);
    ++tally_->live;
  }

  ~Terminal() {
    if (!ended_) {
      // Only a loop stopped by force leaves a session unended: its process goes all the same.
      process_.stream->cancel();
      if (!process_over_) kill();
    }
    {
      std::lock_guard lock(tally_->mu);
      --tally_->live;
    }
    tally_->changed.notify_all();
  }

  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  // Before start(), on the handler's thread: the agent client wakes the session (on the loop)
  // when the process has events. At most one wake-up waits at a time.
  void listen() {
    auto posted = std::make_shared<std::atomic<bool>>(false);
    process_.stream->onReady([weak = weak_from_this(), poster = loop_.poster, posted] {
      if (posted->exchange(true)) return;
      poster->post([weak, posted] {
        posted->store(false);
        if (auto self = weak.lock()) self->guarded([&self] { self->drain(); });
      });
    });
  }

  // ---- on the loop from here on

  void start(Upgrade upgrade) {
    if (ended_) return;
    upgrade_ = std::move(upgrade);
    websocket::stream_base::timeout timeouts{};
    timeouts.handshake_timeout = limits_.handshake_timeout;
    timeouts.idle_timeout = limits_.idle_timeout;
    timeouts.keep_alive_pings = true;  // a silent but present client answers our pings
    ws_.set_option(timeouts);
    ws_.read_message_max(limits_.max_client_message);
    ws_.auto_fragment(false);
    ws_.async_accept(upgrade_, [self = shared_from_this()](beast::error_code ec) {
      if (ec) {
        spdlog::info("pty: process {}: WebSocket handshake failed: {}", self->process_.pid, ec.message());
        return self->finish("client_closed");
      }
      self->guarded([&self] { self->opened(); });
    });
  }

  // Runs a handler's work: one that throws (memory ran out) ends its session, which would
  // otherwise stay with nothing pending, holding its place and its process.
  template <class Work>
  void guarded(Work&& work) {
    try {
      work();
    } catch (const std::exception& e) {
      spdlog::error("pty: process {}: {}; the session ends", process_.pid, e.what());
      finish("error");
    }
  }

  // The sessions object is going: so is the session.
  void abort() { finish("aborted"); }

  // What let the client in has ended.
  void unauthorized() {
    if (ended_ || closing_) return;
    if (!accepted_) return finish("unauthenticated");
    enqueue(true, messageText(json{{"type", "error"},
                                   {"code", "unauthenticated"},
                                   {"message", "the key or console session that opened this terminal has ended"}}));
    closeAfterQueue(websocket::close_code::policy_error, "unauthenticated");
  }

  // The process has events (or the client drained some output): take them while the client
  // keeps up.
  void drain() {
    if (!accepted_ || ended_ || closing_) return;
    output_paused_ = false;
    for (int turn = 0; queued_bytes_ < limits_.max_queued_output; ++turn) {
      if (turn == kBatchesPerTurn) {
        // A guest that keeps events coming (empty ones too) must not hold the loop that every
        // terminal shares: this session goes on after the others' waiting work.
        asio::post(loop_.io, [self = shared_from_this()] { self->guarded([&self] { self->drain(); }); });
        return;
      }
      auto batch = process_.stream->poll();
      if (batch.events.empty() && batch.state == guest::ProcessStream::State::kOpen) return;
      Decoded decoded = decode(std::move(batch.events));
      const bool last = decoded.end || batch.state != guest::ProcessStream::State::kOpen;
      deliver(std::move(decoded.frames), decoded.end, batch.state, batch.error);
      if (last || ended_ || closing_) return;
    }
    // Full: the stream's own backlog takes what comes meanwhile (and overflows past its bound).
    output_paused_ = true;
    watchStall();
  }

 private:
  struct Outgoing {
    bool text = false;
    std::string data;
  };
  // Something for the guest's terminal: keystrokes, or a new window size.
  struct Steer {
    std::optional<guest::PtySize> resize;
    std::string keys;
    size_t cost = 0;  // counted in queued_input_
  };
  static constexpr size_t kResizeCost = 64;
  static constexpr size_t kFrameBytes = 64 * 1024;
  // What a queued frame costs beyond its bytes (its entry, its frame header), so the queue's
  // bound holds for many small frames too.
  static constexpr size_t kFrameOverhead = 64;
  // Batches taken per wake-up: then the loop serves the other sessions before this one goes on.
  static constexpr int kBatchesPerTurn = 8;

  void opened() {
    if (ended_) return;
    accepted_ = true;
    enqueue(true, messageText(json{{"type", "started"}, {"pid", process_.pid}}));
    Decoded first = decode(std::move(process_.pending));
    process_.pending.clear();
    deliver(std::move(first.frames), first.end, guest::ProcessStream::State::kOpen, std::nullopt);
    readNext();
    drain();
  }

  // ---- client -> guest

  void readNext() {
    if (reading_ || ended_ || closing_) return;
    // A guest slower than the typing: read on once it took some.
    if (queued_input_ >= limits_.max_queued_input) return;
    reading_ = true;
    ws_.async_read(input_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->reading_ = false;
      if (ec) return self->finish("client_closed");
      self->guarded([&self] { self->received(); });
    });
  }

  void received() {
    std::string data = beast::buffers_to_string(input_.data());
    input_.consume(input_.size());
    if (ws_.got_binary()) {
      // Input to a process that just ended fails; its exit message is on its way.
      if (!process_over_ && !data.empty()) queueKeys(std::move(data));
    } else if (auto refused = control(data); !refused.ok()) {
      return protocolError(refused.error().message);
    }
    readNext();
  }

  void queueKeys(std::string keys) {
    queued_input_ += keys.size();
    // Keystrokes typed while the guest takes the last ones go together, in one call.
    if (!to_guest_.empty() && !to_guest_.back().resize &&
        to_guest_.back().keys.size() + keys.size() <= limits_.max_client_message) {
      to_guest_.back().keys += keys;
      to_guest_.back().cost += keys.size();
    } else {
      const size_t cost = keys.size();
      to_guest_.push_back(Steer{std::nullopt, std::move(keys), cost});
    }
    steerNext();
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
    if (process_over_) return okStatus();
    // Only the latest of sizes not yet sent matters.
    if (!to_guest_.empty() && to_guest_.back().resize) {
      to_guest_.back().resize = guest::PtySize{*cols, *rows};
    } else {
      queued_input_ += kResizeCost;
      to_guest_.push_back(Steer{guest::PtySize{*cols, *rows}, {}, kResizeCost});
    }
    steerNext();
    return okStatus();
  }

  // One call to the guest at a time, so keystrokes and resizes arrive in the order typed.
  void steerNext() {
    if (steering_ || to_guest_.empty() || ended_ || closing_ || process_over_) return;
    steering_ = true;
    Steer next = std::move(to_guest_.front());
    to_guest_.pop_front();
    auto done = [weak = weak_from_this(), poster = loop_.poster, cost = next.cost](Status status) {
      poster->post([weak, cost, status = std::move(status)] {
        if (auto self = weak.lock()) self->guarded([&] { self->steered(status, cost); });
      });
    };
    if (next.resize) {
      process_.ops.resizePtyAsync(process_.pid, *next.resize, std::move(done));
    } else {
      process_.ops.sendPtyInputAsync(process_.pid, next.keys, std::move(done));
    }
  }

  // The answer to a keystroke or a resize. A guest that does not take one within the control
  // deadline, or whose agent is gone, ends the session. Other refusals (the terminal closed as
  // the process ended) are the usual race with the exit message and change nothing.
  void steered(const Status& done, size_t cost) {
    steering_ = false;
    queued_input_ -= cost;
    if (ended_ || closing_) return;
    if (!done.ok()) {
      const ErrorCode code = done.error().code;
      if (code == ErrorCode::kDeadlineExceeded || code == ErrorCode::kUnavailable) {
        enqueue(true,
                messageText(json{{"type", "error"},
                                 {"code", code == ErrorCode::kDeadlineExceeded ? "deadline_exceeded" : "unavailable"},
                                 {"message", "the guest did not take the terminal's input: " + done.error().message}}));
        return closeAfterQueue(websocket::close_code::internal_error, "error");
      }
    }
    steerNext();
    readNext();
  }

  void protocolError(const std::string& why) {
    if (ended_) return;
    enqueue(true, messageText(json{{"type", "error"}, {"code", "invalid_argument"}, {"message", why}}));
    closeAfterQueue(websocket::close_code::policy_error, "error");
  }

  // ---- guest -> client

  struct Decoded {
    std::vector<Outgoing> frames;
    std::optional<guest::ProcessEnd> end;  // the process's end; events after it do not count
  };
  // Output events become binary frames of up to kFrameBytes each: a guest that writes a byte
  // (or nothing) per event makes no more frames than one that writes in large pieces.
  static Decoded decode(std::vector<guest::ProcessEvent> events) {
    using Kind = guest::ProcessEvent::Kind;
    Decoded out;
    for (auto& event : events) {
      if (event.kind == Kind::kStdout || event.kind == Kind::kStderr) {
        // GuestOps checked it canonical and bounded; decoding cannot fail.
        auto data = agentproto::base64Decode(event.data_base64);
        if (!data || data->empty()) continue;
        if (out.frames.empty() || out.frames.back().data.size() + data->size() > kFrameBytes) {
          out.frames.push_back({false, std::move(*data)});
        } else {
          out.frames.back().data += *data;
        }
      } else if (event.kind == Kind::kEnd) {
        out.end = event.end;
        break;
      }
    }
    return out;
  }

  void deliver(std::vector<Outgoing> frames, const std::optional<guest::ProcessEnd>& end,
               guest::ProcessStream::State state, const std::optional<Error>& error) {
    if (ended_ || closing_) return;
    for (auto& frame : frames) {
      queued_bytes_ += frame.data.size() + kFrameOverhead;
      out_.push_back(std::move(frame));
    }
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
      // reset): the process may still run, and the end kills it.
      std::string message = error ? error->message : "the process's stream ended";
      enqueue(true, messageText(json{{"type", "error"}, {"code", "unavailable"}, {"message", message}}));
      closeAfterQueue(websocket::close_code::internal_error, "error");
    }
  }

  // While the queue is full: a client that has taken nothing of it for stalled_client_timeout is
  // too slow, even if it answers pings.
  void watchStall() {
    if (stall_watched_ || ended_ || closing_) return;
    stall_watched_ = true;
    stall_timer_.expires_at(last_drain_ + limits_.stalled_client_timeout);
    stall_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      self->stall_watched_ = false;
      if (ec || self->ended_ || self->closing_ || !self->output_paused_) return;
      if (Clock::now() - self->last_drain_ >= self->limits_.stalled_client_timeout) {
        return self->guarded(
            [&self] { self->deliver({}, std::nullopt, guest::ProcessStream::State::kOverflow, std::nullopt); });
      }
      self->watchStall();
    });
  }

  void enqueue(bool text, std::string data) {
    queued_bytes_ += data.size() + kFrameOverhead;
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
    close_deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->shutdown();
    });
    writeNext();
  }

  void writeNext() {
    if (writing_ || ended_ || !accepted_) return;
    if (out_.empty()) {
      if (!closing_) return;
      writing_ = true;
      ws_.async_close(close_code_, [self = shared_from_this()](beast::error_code) { self->shutdown(); });
      return;
    }
    writing_ = true;
    ws_.text(out_.front().text);
    ws_.async_write(asio::buffer(out_.front().data), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->queued_bytes_ -= self->out_.front().data.size() + kFrameOverhead;
      self->last_drain_ = Clock::now();
      self->out_.pop_front();
      if (ec) return self->finish("client_closed");
      self->guarded([&self] {
        self->writeNext();
        if (self->output_paused_ && self->queued_bytes_ < self->limits_.max_queued_output) self->drain();
      });
    });
  }

  // ---- the end

  // Counted until the guest answers, so the end of all sessions (a daemon stopping) can wait for
  // their processes to go.
  void kill() {
    {
      std::lock_guard lock(tally_->mu);
      ++tally_->kills;
    }
    process_.ops.sendSignalAsync(process_.pid, guest::Signal::kKill, [tally = tally_](Status) {
      {
        std::lock_guard lock(tally->mu);
        --tally->kills;
      }
      tally->changed.notify_all();
    });
  }

  void finish(const char* outcome) {
    if (end_.outcome.empty()) end_.outcome = outcome;
    shutdown();
  }

  void shutdown() {
    if (ended_) return;
    // Made first, so that nothing past the point of no return allocates (see guarded()).
    auto leftovers = std::make_shared<std::optional<PtyProcess>>();
    ended_ = true;
    auto self = shared_from_this();  // the registry's reference goes below
    beast::error_code ignored;
    close_deadline_.cancel();
    stall_timer_.cancel();
    // The client's bytes left unread at the close would reset the socket pair (ECONNRESET), and
    // the relay would then cut the client's connection instead of letting it read the last frames.
    char unread[16384];
    for (int i = 0; i < 64 && ::recv(ws_.next_layer().native_handle(), unread, sizeof unread, MSG_DONTWAIT) > 0; ++i) {
    }
    ws_.next_layer().shutdown(Socket::shutdown_both, ignored);
    ws_.next_layer().close(ignored);
    process_.stream->cancel();
    if (!process_over_) kill();  // a hung-up terminal: the shell and its foreground job go with it
    std::shared_ptr<Terminal> registered;
    {
      std::lock_guard lock(loop_.mu);
      if (auto it = loop_.sessions.find(id_); it != loop_.sessions.end()) {
        registered = std::move(it->second.terminal);
        loop_.sessions.erase(it);
      }
    }
    try {
      if (process_.ended) process_.ended(end_);
    } catch (const std::exception& e) {
      spdlog::warn("pty: process {}: reporting the session's end failed: {}", process_.pid, e.what());
    }
    // What ties the session to its sandbox (the lease, the place, the agent client) goes now, not
    // when the last handler of this session has run, and on the side thread: the last reference
    // to an agent client (its sandbox was deleted) joins that client's thread, which must not
    // stall every terminal. The kill above holds nothing of it: a sandbox that still runs holds
    // its client.
    leftovers->emplace(std::move(process_));
    try {
      std::lock_guard lock(loop_.mu);
      loop_.releases.push_back(std::move(leftovers));
    } catch (const std::exception&) {
      // Memory ran out: released here, on the loop, rather than never.
    }
    loop_.changed.notify_all();
  }

  PtyLoop& loop_;
  const PtySessionLimits& limits_;
  const uint64_t id_;
  PtyProcess process_;
  websocket::stream<Socket> ws_;
  Upgrade upgrade_;  // the request the handshake answers; it must outlive async_accept
  static constexpr std::chrono::seconds kCloseGrace{5};
  asio::steady_timer close_deadline_;
  asio::steady_timer stall_timer_;
  beast::flat_buffer input_;
  const std::shared_ptr<detail::Tally> tally_;

  std::deque<Outgoing> out_;
  size_t queued_bytes_ = 0;
  Clock::time_point last_drain_ = Clock::now();  // the last write the client took
  bool output_paused_ = false;                   // the queue was full: drain again when it has room
  bool stall_watched_ = false;
  std::deque<Steer> to_guest_;
  size_t queued_input_ = 0;  // read from the client, not yet taken by the guest
  bool steering_ = false;    // a call to the guest is out
  bool reading_ = false;
  bool writing_ = false;
  bool accepted_ = false;  // the handshake is done
  bool closing_ = false;   // the queue ends with a close frame
  websocket::close_code close_code_ = websocket::close_code::normal;
  bool ended_ = false;
  bool process_over_ = false;
  PtySessionEnd end_;
};

// The side thread: releases what ended sessions leave (see Terminal::shutdown), and asks each
// session's `authorized` every reauthorize_every, since it may read the state store. Both may
// block, so neither runs on the loop.
void sideWork(PtyLoop& loop) {
  auto next_check = Clock::now() + loop.limits.reauthorize_every;
  std::unique_lock lock(loop.mu);
  while (true) {
    loop.changed.wait_until(lock, next_check, [&loop] { return loop.stopping || !loop.releases.empty(); });
    if (!loop.releases.empty()) {
      std::vector<std::shared_ptr<void>> released;
      released.swap(loop.releases);
      lock.unlock();
      released.clear();
      lock.lock();
      continue;
    }
    if (loop.stopping) return;
    if (Clock::now() < next_check) continue;
    next_check = Clock::now() + loop.limits.reauthorize_every;
    // Weak: the last reference to a session must not go on this thread.
    std::vector<std::pair<std::weak_ptr<Terminal>, std::shared_ptr<const std::function<bool()>>>> asked;
    for (const auto& [id, entry] : loop.sessions) {
      if (entry.authorized) asked.emplace_back(entry.terminal, entry.authorized);
    }
    lock.unlock();
    for (const auto& [terminal, authorized] : asked) {
      // Releases do not wait for a whole round of checks (each may read the store).
      std::vector<std::shared_ptr<void>> released;
      {
        std::lock_guard take(loop.mu);
        released.swap(loop.releases);
      }
      released.clear();
      try {
        if ((*authorized)()) continue;
      } catch (const std::exception& e) {
        // The store failed us, not the session's client: it goes on until the next check.
        spdlog::warn("pty: checking a terminal's key or login failed: {}", e.what());
        continue;
      }
      loop.poster->post([weak = terminal] {
        if (auto terminal = weak.lock()) terminal->guarded([&terminal] { terminal->unauthorized(); });
      });
    }
    asked.clear();
    lock.lock();
  }
}

}  // namespace

bool isWebSocketUpgrade(const http::Request& req) {
  // What Beast's accept checks (RFC 6455, 4.2.1), before a process starts for the handshake.
  Upgrade upgrade;
  for (const auto& [name, value] : req.headers()) upgrade.insert(name, value);
  upgrade.method_string(req.method());
  upgrade.version(11);
  auto key = req.header("sec-websocket-key");
  auto version = req.header("sec-websocket-version");
  return websocket::is_upgrade(upgrade) && req.header("host") && key && !key->empty() && key->size() <= 24 && version &&
         *version == "13";
}

PtySessions::PtySessions(PtySessionLimits limits) : loop_(std::make_unique<detail::PtyLoop>(std::move(limits))) {
  loop_->poster = std::make_shared<Poster>(loop_->io);
  loop_->work.emplace(loop_->io.get_executor());
  thread_ = std::thread([loop = loop_.get()] {
    // A handler that throws (memory ran out) costs its session, not the daemon.
    while (true) {
      try {
        loop->io.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("pty: a terminal session failed: {}; the others go on", e.what());
      }
    }
  });
  side_ = std::thread([loop = loop_.get()] { sideWork(*loop); });
}

PtySessions::~PtySessions() {
  detail::PtyLoop& loop = *loop_;
  {
    // First: a session opened from now on is refused, so the sweep below finds every one.
    std::lock_guard lock(loop.mu);
    loop.stopping = true;
  }
  asio::post(loop.io, [&loop] {
    std::vector<std::shared_ptr<Terminal>> open;
    {
      std::lock_guard lock(loop.mu);
      for (const auto& [id, entry] : loop.sessions) open.push_back(entry.terminal);
    }
    for (const auto& terminal : open) terminal->abort();
  });
  loop.work.reset();
  loop.changed.notify_all();
  {
    // Ended sessions go once their last handler has run, at once, and their processes once their
    // guests take the kill; a loop that would not end (a bug) or a guest that does not answer must
    // not hold the daemon's exit.
    std::unique_lock lock(loop.tally->mu);
    if (!loop.tally->changed.wait_for(lock, std::chrono::seconds(5),
                                      [&loop] { return loop.tally->live == 0 && loop.tally->kills == 0; })) {
      spdlog::warn("pty: {} terminal sessions did not end in 5 s ({} processes not yet killed); stopping their loop",
                   loop.tally->live, loop.tally->kills);
      loop.io.stop();
    }
  }
  thread_.join();
  side_.join();
  loop.poster->forget();
  loop_.reset();
}

size_t PtySessions::openSessions() const {
  std::lock_guard lock(loop_->mu);
  return loop_->sessions.size();
}

Result<http::RelayPlan> PtySessions::open(const std::string& target,
                                          const std::vector<std::pair<std::string, std::string>>& headers,
                                          PtyProcess process) {
  auto refuse = [&process](Error error) -> Result<http::RelayPlan> {
    (void)process.ops.sendSignal(process.pid, guest::Signal::kKill);
    return error;
  };
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    return refuse(makeError(ErrorCode::kUnavailable, std::string("socketpair: ") + std::strerror(errno)));
  }
  auto peer = std::make_shared<UniqueFd>(pair[1]);
  Socket socket(loop_->io);
  beast::error_code ec;
  socket.assign(asio::local::stream_protocol(), pair[0], ec);
  if (ec) {
    ::close(pair[0]);
    return refuse(makeError(ErrorCode::kUnavailable, "adopting a socket: " + ec.message()));
  }
  Upgrade upgrade;
  for (const auto& [name, value] : headers) upgrade.insert(name, value);
  upgrade.method(beast::http::verb::get);
  upgrade.target(target);
  upgrade.version(11);
  auto authorized =
      process.authorized ? std::make_shared<const std::function<bool()>>(std::move(process.authorized)) : nullptr;
  uint64_t id = 0;
  {
    std::lock_guard lock(loop_->mu);
    id = ++loop_->next_id;
  }
  const int pid = process.pid;
  guest::GuestOps ops = process.ops;
  std::shared_ptr<Terminal> terminal;
  try {
    terminal = std::make_shared<Terminal>(*loop_, id, std::move(socket), std::move(process));
    // Woken before it is found (the side thread) or started.
    terminal->listen();
    {
      std::lock_guard lock(loop_->mu);
      if (loop_->stopping) throw std::runtime_error("the terminals are ending (the daemon stops)");
      loop_->sessions.emplace(id, detail::PtyLoop::Entry{terminal, std::move(authorized)});
    }
    asio::post(loop_->io, [terminal, upgrade = std::move(upgrade)]() mutable {
      terminal->guarded([&] { terminal->start(std::move(upgrade)); });
    });
  } catch (const std::exception& e) {
    {
      std::lock_guard lock(loop_->mu);
      loop_->sessions.erase(id);
    }
    (void)ops.sendSignal(pid, guest::Signal::kKill);
    return makeError(ErrorCode::kUnavailable, std::string("opening the terminal: ") + e.what());
  }

  http::RelayPlan plan;
  plan.peer = peer->get();
  plan.both_ways = true;
  // The session's pings cross the relay at least every half idle timeout while it lives.
  plan.idle_timeout = loop_->limits.idle_timeout * 2;
  plan.keep = std::move(peer);
  return plan;
}

}  // namespace space::api
