#include "agentproto/agent_client.h"

#include <fcntl.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <system_error>
#include <thread>

#include "agentproto/wire.h"
#include "common/bounded_json.h"

namespace space::agentproto {

namespace {

constexpr size_t kMaxHeaderBytes = 64 << 10;
constexpr size_t kMaxErrorBody = 64 << 10;
constexpr int32_t kWindow = 8 << 20;
constexpr std::chrono::milliseconds kHelloInterval{250};
// How long a request may go unanswered (no response headers) before the client writes a PING.
// A guest can miss the notification of a request that reached it: the virtio console driver
// takes a buffer off the ring when the port is merely polled, and the interrupt for it then
// wakes no one (docs/agent.md, "The channel: a look at the port is a read"). The agent guards
// against the case it knows; any next write of the host makes the guest look again, so the
// client makes one. Its answer proves nothing, and nothing waits for it.
constexpr std::chrono::milliseconds kUnansweredNudge{1000};
// How long a stream may stay open after its EndStream envelope. The agent ends the HTTP/2
// stream with that envelope; a guest that keeps it open holds nothing of the host's for longer.
constexpr std::chrono::milliseconds kEndedStreamGrace{2000};

ErrorCode errorCodeFromRpcName(std::string_view name) {
  for (ErrorCode c :
       {ErrorCode::kInvalidArgument, ErrorCode::kNotFound, ErrorCode::kAlreadyExists, ErrorCode::kPermissionDenied,
        ErrorCode::kFailedPrecondition, ErrorCode::kResourceExhausted, ErrorCode::kDeadlineExceeded,
        ErrorCode::kUnavailable, ErrorCode::kUnimplemented, ErrorCode::kCanceled, ErrorCode::kInternal}) {
    if (name == errorCodeName(c)) return c;
  }
  return ErrorCode::kInternal;
}

Error errorFromJson(const Json& j, int http_status) {
  if (j.is_object() && j.contains("code") && j["code"].is_string()) {
    std::string message = j.contains("message") && j["message"].is_string() ? j["message"].get<std::string>() : "";
    return makeError(errorCodeFromRpcName(j["code"].get<std::string>()), message);
  }
  RpcCode code = rpcCodeFromHttpStatus(http_status);
  return makeError(code == RpcCode::kUnknown ? ErrorCode::kInternal : errorCodeFromRpcName(rpcCodeName(code)),
                   "agent answered HTTP " + std::to_string(http_status));
}

std::string randomNonce() {
  std::random_device rd;
  std::string out;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) out += hex[rd() & 15];
  return out;
}

std::string percentEncode(const std::string& s) {
  std::string out;
  const char* hex = "0123456789ABCDEF";
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace

// One call in flight. Touched by the I/O thread; waiters only read it under `m`.
struct Call : std::enable_shared_from_this<Call>, AgentStream {
  enum class Kind { kUnary, kStream, kUpload, kDownload } kind;
  std::weak_ptr<AgentClient::Impl> impl;  // a stream handle may outlive its client
  int32_t stream_id = -1;
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point submitted_at;  // I/O thread only
  size_t counted = 0;              // I/O thread only: its bytes in the client's `buffered`
  size_t header_bytes = 0;
  int status = 0;
  // request
  std::string path;
  std::string content_type;
  std::string user;
  std::vector<std::pair<std::string, std::string>> metadata_headers;  // ("x-metadata-<key>", value)
  std::optional<std::chrono::milliseconds> timeout_header;
  std::string req_body;
  size_t req_off = 0;
  // An upload fed by a source (`piped`) comes through `up_chunks`: the caller's thread appends,
  // readBody takes, both under `m`, never waiting on each other for longer than a copy.
  bool piped = false;
  std::deque<std::string> up_chunks;
  size_t up_front_off = 0;   // bytes of up_chunks.front() already sent
  size_t up_bytes = 0;       // bytes in up_chunks not yet sent
  bool up_eof = false;       // the source said it was done
  bool up_deferred = false;  // readBody found nothing and parked the stream: resume it
  // A download's bytes on their way to the caller's thread (under `m`). Never more than the
  // stream's window: the window reopens only as the caller takes them.
  std::string down_buf;
  // response
  std::string body;
  EnvelopeDecoder decoder{AgentClient::kMaxEnvelope};
  bool got_end = false;
  AgentClient::MessageFn on_message;
  AgentClient::RawMessageFn on_payload;  // instead of on_message: data envelopes unparsed
  AgentClient::EndFn on_end;
  AgentClient::ValueFn on_value;                         // a unary call nobody waits for (callAsync)
  size_t max_response = AgentClient::kMaxUnaryResponse;  // a successful unary answer's bytes
  // completion
  std::mutex m;
  std::condition_variable cv;
  bool completing = false;  // I/O thread only
  bool finished = false;
  Status end_status = okStatus();
  Json value;

  // Runs on the I/O thread only. Waiters wake after the callbacks returned, so a caller may
  // let its callbacks' captures die as soon as wait() returns.
  void complete(Status st, Json v = nullptr) {
    if (completing) return;
    completing = true;
    auto end_cb = std::move(on_end);
    auto value_cb = std::move(on_value);
    on_end = nullptr;
    on_value = nullptr;
    on_message = nullptr;
    on_payload = nullptr;
    if (end_cb) end_cb(st);
    // Moved: nobody reads `value` of a call whose answer goes to a callback.
    if (value_cb) value_cb(st.ok() ? Result<Json>(std::move(v)) : Result<Json>(st.error()));
    {
      std::lock_guard<std::mutex> lock(m);
      finished = true;
      end_status = st;
      value = std::move(v);
    }
    cv.notify_all();
  }

  Status waitDone(std::optional<std::chrono::milliseconds> timeout) {
    std::unique_lock<std::mutex> lock(m);
    if (timeout) {
      if (!cv.wait_for(lock, *timeout, [&] { return finished; })) {
        return makeError(ErrorCode::kDeadlineExceeded, "stream still running");
      }
    } else {
      cv.wait(lock, [&] { return finished; });
    }
    return end_status;
  }

  void cancel() override;
  Status wait(std::chrono::milliseconds timeout) override { return waitDone(timeout); }
  bool done() const override {
    auto* self = const_cast<Call*>(this);
    std::lock_guard<std::mutex> lock(self->m);
    return finished;
  }
};

struct AgentClient::Impl : std::enable_shared_from_this<AgentClient::Impl> {
  UniqueFd fd;
  UniqueFd wake;
  nghttp2_session* session = nullptr;
  std::thread thread;
  std::mutex queue_mutex;
  std::vector<std::function<void()>> queue;
  std::atomic<bool> stopping{false};
  std::atomic<bool> dead{false};
  std::string dead_reason;
  std::map<int32_t, std::shared_ptr<Call>> calls;
  // Bytes of answers not finished yet (unary bodies, partial stream envelopes) over all calls:
  // each alone is bounded, but a guest that starts a message on every stream it holds and never
  // finishes it would make the host keep 8 MiB per stream. I/O thread only.
  size_t buffered = 0;
  std::string out;
  size_t out_off = 0;
  bool peer_settings = false;  // the guest's SETTINGS arrived: its session took our preface
  Clock::time_point last_nudge;
  std::atomic<uint64_t> nudges{0};

  ~Impl() {
    if (session != nullptr) nghttp2_session_del(session);
  }

  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      queue.push_back(std::move(fn));
    }
    uint64_t one = 1;
    (void)!write(wake.get(), &one, sizeof one);
  }

  // Brings `call`'s share of `buffered` up to date; false once the client holds more than
  // kMaxBufferedAnswers.
  bool recount(Call& call) {
    const size_t now = call.decoder.bufferedBytes() + (call.body.empty() ? 0 : call.body.capacity());
    buffered = buffered - call.counted + now;
    call.counted = now;
    return buffered <= AgentClient::kMaxBufferedAnswers;
  }
  // Every way a call leaves `calls` goes through here or fail(). What it held of an answer goes
  // too: a caller may keep its handle long after (an ended watcher until its tenant's next one).
  void forget(std::map<int32_t, std::shared_ptr<Call>>::iterator it) {
    Call& call = *it->second;
    buffered -= call.counted;
    call.counted = 0;
    dropBuffers(call);
    calls.erase(it);
  }
  static void dropBuffers(Call& call) {
    call.decoder = EnvelopeDecoder(AgentClient::kMaxEnvelope);
    std::string().swap(call.body);
  }

  void fail(const std::string& why) {
    if (!dead.exchange(true)) dead_reason = why;
    auto all = std::move(calls);
    calls.clear();
    buffered = 0;
    for (auto& [id, call] : all) {
      call->counted = 0;
      dropBuffers(*call);
    }
    for (auto& [id, call] : all) call->complete(makeError(ErrorCode::kUnavailable, "agent channel: " + why));
  }

  void submit(const std::shared_ptr<Call>& call) {
    if (dead) {
      call->complete(makeError(ErrorCode::kUnavailable, "agent channel: " + dead_reason));
      return;
    }
    std::vector<nghttp2_nv> nv;
    auto add = [&nv](const std::string& n, const std::string& v) {
      nv.push_back({(uint8_t*)n.data(), (uint8_t*)v.data(), n.size(), v.size(), NGHTTP2_NV_FLAG_NONE});
    };
    static const std::string kMethod = ":method", kScheme = ":scheme", kAuthority = ":authority", kPath = ":path",
                             kCt = "content-type", kUser = "x-space-user", kProto = "connect-protocol-version",
                             kTimeout = "connect-timeout-ms", kHttp = "http", kAgent = "agent", kOne = "1";
    const std::string method = call->kind == Call::Kind::kDownload ? "GET" : "POST";
    std::string timeout = call->timeout_header ? std::to_string(call->timeout_header->count()) : "";
    add(kMethod, method);
    add(kScheme, kHttp);
    add(kAuthority, kAgent);
    add(kPath, call->path);
    if (!call->content_type.empty()) add(kCt, call->content_type);
    if (!call->user.empty()) add(kUser, call->user);
    for (const auto& [name, value] : call->metadata_headers) add(name, value);
    add(kProto, kOne);
    if (call->timeout_header) add(kTimeout, timeout);
    nghttp2_data_provider provider{};
    provider.source.ptr = call.get();
    provider.read_callback = readBody;
    int32_t id = nghttp2_submit_request(session, nullptr, nv.data(), nv.size(),
                                        call->kind == Call::Kind::kDownload ? nullptr : &provider, call.get());
    if (id < 0) {
      call->complete(makeError(ErrorCode::kResourceExhausted, std::string("HTTP/2: ") + nghttp2_strerror(id)));
      return;
    }
    call->stream_id = id;
    call->submitted_at = Clock::now();
    calls[id] = call;
  }

  void cancel(const std::shared_ptr<Call>& call, Error why) {
    if (auto it = call->stream_id >= 0 ? calls.find(call->stream_id) : calls.end(); it != calls.end()) {
      nghttp2_session_set_stream_user_data(session, call->stream_id, nullptr);
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
      forget(it);
    }
    call->complete(std::move(why));
  }

  // The caller-thread side of piped uploads and downloads reaches the session only through
  // these, run on the I/O thread. They capture `this` rather than a shared_ptr (a queued task
  // owning its Impl would keep it alive forever if the thread never ran it): they are posted
  // only from inside upload()/download(), while the client, and so its thread, is alive.
  void abortLater(const std::shared_ptr<Call>& call, Error why) {
    post([this, call, why = std::move(why)] { cancel(call, why); });
  }
  void resumeLater(const std::shared_ptr<Call>& call) {
    post([this, call] {
      if (!dead && calls.count(call->stream_id) > 0) (void)nghttp2_session_resume_data(session, call->stream_id);
    });
  }
  // The caller took `n` bytes of a download: the guest may send that many more on its stream.
  void consumeLater(const std::shared_ptr<Call>& call, size_t n) {
    post([this, call, n] {
      if (!dead && calls.count(call->stream_id) > 0) {
        (void)nghttp2_session_consume_stream(session, call->stream_id, n);
      }
    });
  }

  static ssize_t readBody(nghttp2_session*, int32_t id, uint8_t* buf, size_t len, uint32_t* flags, nghttp2_data_source*,
                          void* ud) {
    auto* impl = static_cast<Impl*>(ud);
    auto it = impl->calls.find(id);
    if (it == impl->calls.end()) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // cancelled
    Call* call = it->second.get();
    if (call->piped) {
      std::lock_guard<std::mutex> lock(call->m);
      if (call->up_bytes == 0) {
        if (call->up_eof) {
          *flags |= NGHTTP2_DATA_FLAG_EOF;
          return 0;
        }
        call->up_deferred = true;
        return NGHTTP2_ERR_DEFERRED;
      }
      size_t n = 0;
      while (n < len && !call->up_chunks.empty()) {
        const std::string& front = call->up_chunks.front();
        size_t take = std::min(len - n, front.size() - call->up_front_off);
        memcpy(buf + n, front.data() + call->up_front_off, take);
        n += take;
        call->up_front_off += take;
        if (call->up_front_off == front.size()) {
          call->up_chunks.pop_front();
          call->up_front_off = 0;
        }
      }
      call->up_bytes -= n;
      if (call->up_bytes == 0 && call->up_eof) *flags |= NGHTTP2_DATA_FLAG_EOF;
      call->cv.notify_all();  // room for the producer
      return static_cast<ssize_t>(n);
    }
    size_t n = std::min(len, call->req_body.size() - call->req_off);
    memcpy(buf, call->req_body.data() + call->req_off, n);
    call->req_off += n;
    if (call->req_off == call->req_body.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }

  // Calls are found through `calls` only: a cancelled call is gone from it at once, while
  // nghttp2 may still deliver the rest of a header block for its stream.
  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                      const uint8_t* value, size_t valuelen, uint8_t, void* ud) {
    auto* impl = static_cast<Impl*>(ud);
    auto it = impl->calls.find(frame->hd.stream_id);
    if (it == impl->calls.end()) return 0;
    Call* call = it->second.get();
    call->header_bytes += namelen + valuelen;
    if (call->header_bytes > kMaxHeaderBytes) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    std::string_view n(reinterpret_cast<const char*>(name), namelen);
    std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":status") {
      int st = 0;
      for (char c : v) st = (c >= '0' && c <= '9' && st < 1000) ? st * 10 + (c - '0') : 1000;
      call->status = st;
    }
    return 0;
  }

  // Window updates are ours to send (NGHTTP2_OPT_NO_AUTO_WINDOW_UPDATE). The connection's
  // window reopens at once for every byte, so no stream can hold up the others; a stream's own
  // window reopens at once too, except a download's, which waits for its reader.
  static int onData(nghttp2_session* s, uint8_t, int32_t id, const uint8_t* data, size_t len, void* ud) {
    auto* impl = static_cast<Impl*>(ud);
    (void)nghttp2_session_consume_connection(s, len);
    auto it = impl->calls.find(id);
    if (it == impl->calls.end()) {
      (void)nghttp2_session_consume_stream(s, id, len);
      return 0;
    }
    auto call = it->second;
    if (call->kind == Call::Kind::kDownload && call->status == 200) {
      {
        std::lock_guard<std::mutex> lock(call->m);
        call->down_buf.append(reinterpret_cast<const char*>(data), len);
      }
      call->cv.notify_all();
      return 0;
    }
    (void)nghttp2_session_consume_stream(s, id, len);
    std::string_view chunk(reinterpret_cast<const char*>(data), len);
    auto abort = [&](Error e) {
      impl->cancel(call, std::move(e));
      return 0;
    };
    if (call->kind == Call::Kind::kStream && call->status == 200) {
      // The call is over once its EndStream envelope came: more is not buffered, ever.
      if (call->got_end && len > 0)
        return abort(makeError(ErrorCode::kUnavailable, "agent stream: data after EndStream"));
      auto fed = call->decoder.feed(chunk);
      if (!fed.ok()) return abort(makeError(ErrorCode::kUnavailable, "agent stream: " + fed.error().message));
      while (true) {
        auto env = call->decoder.next();
        if (!env.ok()) return abort(makeError(ErrorCode::kUnavailable, "agent stream: " + env.error().message));
        if (!env.value()) break;
        // (After the EndStream envelope complete() has cleared on_payload: the check below holds.)
        if (call->on_payload && !(env.value()->flags & kEnvelopeEndStream)) {
          call->on_payload(env.value()->payload);
          continue;
        }
        auto parsed = parseJsonBounded(env.value()->payload);
        if (!parsed.ok()) return abort(makeError(ErrorCode::kUnavailable, "agent stream: " + parsed.error().message));
        Json msg = std::move(parsed.value());
        if (!msg.is_object()) {
          return abort(makeError(ErrorCode::kUnavailable, "agent stream: message is not a JSON object"));
        }
        if (env.value()->flags & kEnvelopeEndStream) {
          call->got_end = true;
          // The stream must end with it; one the guest keeps open is reset by the sweep.
          call->deadline = std::min(call->deadline, Clock::now() + kEndedStreamGrace);
          if (msg.contains("error")) {
            call->complete(errorFromJson(msg["error"], 500));
          } else {
            call->complete(okStatus());
          }
          continue;
        }
        if (call->got_end) return abort(makeError(ErrorCode::kUnavailable, "agent stream: data after EndStream"));
        if (call->on_message) call->on_message(msg);
      }
      if (!impl->recount(*call)) return abort(tooMuchUnfinished());
      return 0;
    }
    size_t limit = call->status == 200 ? call->max_response : std::min(kMaxErrorBody, call->max_response);
    if (call->body.size() + len > limit) {
      return abort(makeError(ErrorCode::kUnavailable, "agent response exceeds " + std::to_string(limit) + " bytes"));
    }
    call->body.append(chunk);
    if (!impl->recount(*call)) return abort(tooMuchUnfinished());
    return 0;
  }

  static Error tooMuchUnfinished() {
    return makeError(ErrorCode::kUnavailable, "this sandbox's agent holds back more than " +
                                                  std::to_string(AgentClient::kMaxBufferedAnswers >> 20) +
                                                  " MiB of unfinished answers at once");
  }

  static int onFrame(nghttp2_session*, const nghttp2_frame* frame, void* ud) {
    if (frame->hd.type == NGHTTP2_SETTINGS && !(frame->hd.flags & NGHTTP2_FLAG_ACK)) {
      static_cast<Impl*>(ud)->peer_settings = true;
    }
    return 0;
  }

  static int onStreamClose(nghttp2_session*, int32_t id, uint32_t error_code, void* ud) {
    auto* impl = static_cast<Impl*>(ud);
    auto it = impl->calls.find(id);
    if (it == impl->calls.end()) return 0;
    auto call = it->second;
    std::string answer;  // taken first: forget() drops the call's buffers
    answer.swap(call->body);
    impl->forget(it);
    if (call->kind == Call::Kind::kStream && call->status == 200) {
      if (!call->got_end) {
        call->complete(makeError(ErrorCode::kUnavailable,
                                 error_code != 0 ? "agent reset the stream" : "agent stream ended without EndStream"));
      }
      return 0;
    }
    // A reset after a 200 means a truncated body: never report it as success.
    if (error_code != 0) {
      call->complete(makeError(ErrorCode::kUnavailable,
                               std::string("agent reset the stream: ") + nghttp2_http2_strerror(error_code)));
      return 0;
    }
    Json body = Json::object();
    std::string malformed;
    if (!answer.empty()) {
      auto parsed = parseJsonBounded(answer);
      if (parsed.ok()) {
        body = std::move(parsed.value());
      } else {
        malformed = parsed.error().message;
        body = Json(Json::value_t::discarded);
      }
    }
    if (call->status != 200) {
      call->complete(errorFromJson(body, call->status));
      return 0;
    }
    if (call->kind == Call::Kind::kDownload) {
      call->complete(okStatus());
      return 0;
    }
    if (body.is_discarded()) {
      call->complete(makeError(ErrorCode::kUnavailable, "agent answered with malformed JSON: " + malformed));
      return 0;
    }
    call->complete(okStatus(), std::move(body));
    return 0;
  }

  void flushOut() {
    while (true) {
      if (out_off == out.size()) {
        out.clear();
        out_off = 0;
        const uint8_t* data = nullptr;
        ssize_t n;
        while (out.size() < (1 << 20) && (n = nghttp2_session_mem_send(session, &data)) > 0) {
          out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
        }
        if (out.empty()) return;
      }
      ssize_t n = ::send(fd.get(), out.data() + out_off, out.size() - out_off, MSG_NOSIGNAL);
      if (n > 0) {
        out_off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      fail(std::string("write: ") + strerror(errno));
      return;
    }
  }

  void run() {
    char buf[64 << 10];
    while (!stopping) {
      std::vector<std::function<void()>> batch;
      {
        std::lock_guard<std::mutex> lock(queue_mutex);
        batch.swap(queue);
      }
      for (auto& fn : batch) fn();
      if (!dead) flushOut();
      // A protocol error makes nghttp2 queue GOAWAY and stop reading; notice it now, not when
      // some later event happens to wake the loop.
      if (!dead && nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0) {
        fail("session ended by the guest");
      }

      auto now = Clock::now();
      Clock::time_point next = Clock::time_point::max();
      std::vector<std::shared_ptr<Call>> expired;
      Clock::time_point oldest_unanswered = Clock::time_point::max();
      for (auto& [id, call] : calls) {
        if (call->deadline <= now) expired.push_back(call);
        next = std::min(next, call->deadline);
        if (call->status == 0) oldest_unanswered = std::min(oldest_unanswered, call->submitted_at);
      }
      for (auto& call : expired) cancel(call, makeError(ErrorCode::kDeadlineExceeded, "agent call timed out"));
      if (!expired.empty()) continue;
      if (!dead && oldest_unanswered != Clock::time_point::max()) {
        const auto due = std::max(oldest_unanswered, last_nudge) + kUnansweredNudge;
        // Only onto an idle socket: bytes still waiting to go are a write the guest will see
        // anyway, and a guest that stops reading must not make PINGs pile up (each one queued
        // goes out at the next flush, so none is added while the socket is backed up). Frames
        // nghttp2 holds back (HEADERS over the guest's stream limit) must not stop the PING.
        const bool idle = out_off == out.size();
        if (due > now) {
          next = std::min(next, due);
        } else if (!idle) {
          next = std::min(next, now + kUnansweredNudge);  // look again later; a write wakes us first
        } else {
          (void)nghttp2_submit_ping(session, NGHTTP2_FLAG_NONE, nullptr);
          last_nudge = now;
          ++nudges;
          continue;  // flushOut sends it
        }
      }

      // A dead connection is not polled at all: POLLHUP would be reported forever.
      pollfd fds[2] = {{wake.get(), POLLIN, 0}, {dead ? -1 : fd.get(), POLLIN, 0}};
      if (!dead && out_off < out.size()) fds[1].events |= POLLOUT;
      int timeout = next == Clock::time_point::max() ? -1 : pollTimeoutMs(next) + 1;  // clamped, no overflow
      int rc = poll(fds, 2, timeout);
      if (rc < 0 && errno == EINTR) continue;
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        (void)!read(wake.get(), &v, sizeof v);
      }
      if (dead) continue;
      if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
        for (int round = 0; round < 16; ++round) {
          ssize_t n = read(fd.get(), buf, sizeof buf);
          if (n > 0) {
            ssize_t used = nghttp2_session_mem_recv(session, reinterpret_cast<uint8_t*>(buf), static_cast<size_t>(n));
            if (used < 0) {
              fail(std::string("protocol error from the guest: ") + nghttp2_strerror(static_cast<int>(used)));
              break;
            }
            continue;
          }
          if (n == 0) {
            fail("connection closed");
          } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            fail(std::string("read: ") + strerror(errno));
          }
          break;
        }
      }
    }
    fail("client closed");
    // Calls posted but never submitted: submit() sees `dead` and fails each of them.
    std::vector<std::function<void()>> rest;
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      rest.swap(queue);
    }
    for (auto& fn : rest) fn();
  }
};

void Call::cancel() {
  auto owner = impl.lock();
  if (!owner || done()) return;  // the client is gone (and failed every call) or it ended
  auto self = shared_from_this();
  owner->post([owner, self] { owner->cancel(self, makeError(ErrorCode::kCanceled, "stream canceled")); });
}

namespace {

// How long the guest gets to answer our HTTP/2 preface with its SETTINGS before the handshake
// counts as lost and is made again. Its answer takes one round trip; a second is generous even
// for a guest under TCG that has just been restored.
constexpr std::chrono::milliseconds kSessionConfirm{1000};

// One wait for handshake bytes: until `until`, or until a watched fd (QMP, the QEMU pidfd) has
// news for watch.check. The number of bytes read into `buf`; none when nothing came in time.
Result<std::optional<size_t>> readHandshakeBytes(int fd, const HandshakeWatch& watch, Clock::time_point until,
                                                 char* buf, size_t size) {
  if (watch.check) {
    if (auto err = watch.check()) return *err;
  }
  std::vector<pollfd> fds{{fd, POLLIN, 0}};
  for (int w : watch.fds) fds.push_back({w, POLLIN, 0});
  int rc = poll(fds.data(), fds.size(), pollTimeoutMs(until));
  if (rc < 0 && errno != EINTR) return makeError(ErrorCode::kInternal, std::string("poll: ") + strerror(errno));
  if (rc <= 0 || !(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) return std::optional<size_t>();
  ssize_t n = read(fd, buf, size);
  if (n == 0) return makeError(ErrorCode::kUnavailable, "agent channel closed during the handshake");
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return std::optional<size_t>();
    return makeError(ErrorCode::kUnavailable, std::string("agent channel: ") + strerror(errno));
  }
  return std::optional<size_t>(static_cast<size_t>(n));
}

}  // namespace

Result<std::unique_ptr<AgentClient>> AgentClient::connect(UniqueFd fd, Clock::time_point deadline,
                                                          const HandshakeWatch& watch) {
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  char buf[4096];
  // Waits for the guest's answer to a hello, saying it again (with a new nonce, so that a late
  // answer to an old one is never taken for the current one) while the port may be unopened.
  auto awaitOlleh = [&]() -> Result<HandshakeScanner::Match> {
    std::string nonce = randomNonce();
    HandshakeScanner scanner(kOllehPrefix, nonce);
    SPACE_TRY(writeAll(fd.get(), std::string(kHelloFiller, '\0') + makeHello(nonce), deadline));
    auto next_hello = Clock::now() + kHelloInterval;
    while (true) {
      if (Clock::now() >= deadline)
        return makeError(ErrorCode::kDeadlineExceeded, "the guest agent did not answer in time");
      if (Clock::now() >= next_hello) {
        nonce = randomNonce();
        scanner.expectNonce(nonce);
        SPACE_TRY(writeAll(fd.get(), makeHello(nonce), deadline));
        next_hello = Clock::now() + kHelloInterval;
      }
      auto n = readHandshakeBytes(fd.get(), watch, std::min(deadline, next_hello), buf, sizeof buf);
      if (!n.ok()) return n.error();
      if (!n.value()) continue;
      auto got = scanner.feed(std::string_view(buf, *n.value()));
      if (!got.ok()) return got.error();
      if (got.value()) return std::move(*got.value());
    }
  };

  std::unique_ptr<AgentClient> client(new AgentClient());
  std::shared_ptr<Impl> impl;
  for (int attempt = 1;; ++attempt) {
    auto match = awaitOlleh();
    if (!match.ok()) return match.error();
    auto parsed_info = parseJsonBounded(match->payload);
    Json info = parsed_info.ok() ? std::move(parsed_info.value()) : Json();
    if (!info.is_object()) return makeError(ErrorCode::kUnavailable, "agent handshake carries malformed info");
    auto text = [&info](const char* key) {
      auto it = info.find(key);
      return it != info.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    client->info_ = {};
    client->info_.raw = info;
    client->info_.version = text("version");
    client->info_.kernel = text("kernel");
    client->info_.hostname = text("hostname");
    if (info.contains("uptime") && info["uptime"].is_number()) client->info_.uptime_s = info["uptime"].get<double>();

    impl = std::make_shared<Impl>();
    nghttp2_session_callbacks* cbs = nullptr;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_header_callback(cbs, Impl::onHeader);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, Impl::onData);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, Impl::onStreamClose);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, Impl::onFrame);
    nghttp2_option* opt = nullptr;
    nghttp2_option_new(&opt);
    nghttp2_option_set_max_reserved_remote_streams(opt, 0);
    nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
    // A download's reader may be slow (it writes to an API client); holding back only its
    // stream's window is what keeps it from stalling the rest (see onData).
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_session_client_new2(&impl->session, cbs, impl.get(), opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(kWindow)},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(kMaxHeaderBytes)},
    };
    nghttp2_submit_settings(impl->session, NGHTTP2_FLAG_NONE, settings, 3);
    nghttp2_session_set_local_window_size(impl->session, NGHTTP2_FLAG_NONE, 0, kWindow * 4);
    // The guest's first frame must be its SETTINGS (RFC 9113 3.4), within the default frame
    // size: anything else is a broken or hostile agent, refused now rather than at a deadline.
    std::string first_header;
    auto feed = [&impl, &first_header](std::string_view bytes) -> Status {
      if (bytes.empty()) return okStatus();
      if (first_header.size() < 9) {
        first_header.append(bytes.substr(0, 9 - first_header.size()));
        if (first_header.size() == 9) {
          const auto* h = reinterpret_cast<const uint8_t*>(first_header.data());
          const uint32_t length = (uint32_t{h[0]} << 16) | (uint32_t{h[1]} << 8) | h[2];
          if (h[3] != NGHTTP2_SETTINGS || (h[4] & NGHTTP2_FLAG_ACK) || length > 16384 || length % 6 != 0) {
            return makeError(ErrorCode::kUnavailable,
                             "agent broke HTTP/2 during the handshake: its first frame is "
                             "not SETTINGS");
          }
        }
      }
      ssize_t used =
          nghttp2_session_mem_recv(impl->session, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      if (used < 0) return makeError(ErrorCode::kUnavailable, "agent sent garbage after the handshake");
      return okStatus();
    };
    SPACE_TRY(feed(match->rest));

    // What the session has to say (our preface first; later a SETTINGS ack, or a GOAWAY for a
    // guest that broke the protocol), written at once.
    auto sendPending = [&]() -> Status {
      std::string pending;
      const uint8_t* data = nullptr;
      for (ssize_t n; (n = nghttp2_session_mem_send(impl->session, &data)) > 0;) {
        pending.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
      }
      return pending.empty() ? okStatus() : writeAll(fd.get(), pending, deadline);
    };
    SPACE_TRY(sendPending());
    // The answer alone does not prove the guest's channel is still in that handshake: a
    // restored guest is told its host left and came back (QEMU reports the port's saved
    // connection state after a load), and its agent may drop the state that answered us just
    // after answering. It then scans for a hello and would take our HTTP/2 for junk, leaving
    // every call to time out. The guest sends its SETTINGS only once a session took our
    // preface, so wait for them; without them, make the handshake again. The wait is doubled
    // with each attempt: a guest that is merely slow gets there, while a lost handshake is made
    // again within a second. (It costs no measurable create time: bench/RESULTS.md.)
    const auto confirm_until = std::min(deadline, Clock::now() + kSessionConfirm * (1 << std::min(attempt - 1, 4)));
    while (!impl->peer_settings && Clock::now() < confirm_until) {
      auto n = readHandshakeBytes(fd.get(), watch, confirm_until, buf, sizeof buf);
      if (!n.ok()) return n.error();
      if (!n.value()) continue;
      SPACE_TRY(feed(std::string_view(buf, *n.value())));
      SPACE_TRY(sendPending());
      if (!impl->peer_settings && nghttp2_session_want_read(impl->session) == 0) {
        return makeError(ErrorCode::kUnavailable, "agent broke HTTP/2 during the handshake");
      }
    }
    if (impl->peer_settings) break;
    if (Clock::now() >= deadline)
      return makeError(ErrorCode::kDeadlineExceeded, "the guest agent did not answer in time");
    spdlog::warn("agent: handshake {} answered but no HTTP/2 session followed; making it again", attempt);
  }

  impl->fd = std::move(fd);
  impl->wake = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  // Both fail when the host runs out of threads or descriptors: the VM is fine, this node is
  // full, so the caller gets an error rather than a terminated daemon.
  if (!impl->wake.valid()) {
    return makeError(ErrorCode::kResourceExhausted, std::string("agent client: eventfd: ") + strerror(errno),
                     "insufficient_capacity");
  }
  Impl* raw = impl.get();
  try {
    impl->thread = std::thread([raw] { raw->run(); });
  } catch (const std::system_error& e) {
    return makeError(ErrorCode::kResourceExhausted,
                     std::string("agent client: cannot start its I/O thread: ") + e.what(), "insufficient_capacity");
  }
  client->impl_ = std::move(impl);
  return client;
}

AgentClient::~AgentClient() {
  if (impl_ && impl_->thread.joinable()) {
    impl_->stopping = true;
    impl_->post([] {});
    impl_->thread.join();
  }
}

std::unique_ptr<AgentClient> AgentClient::disconnected(const std::string& reason) {
  std::unique_ptr<AgentClient> client(new AgentClient());
  client->impl_ = std::make_shared<Impl>();
  client->impl_->dead = true;
  client->impl_->dead_reason = reason;
  return client;
}

bool AgentClient::alive() const { return !impl_->dead; }

uint64_t AgentClient::nudges() const { return impl_->nudges.load(); }

namespace {

constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 100);

std::shared_ptr<Call> newCall(const std::shared_ptr<AgentClient::Impl>& impl, Call::Kind kind, std::string path,
                              const CallOptions& options) {
  auto call = std::make_shared<Call>();
  call->kind = kind;
  call->impl = impl;
  call->path = std::move(path);
  call->user = options.user;
  for (const auto& [key, value] : options.metadata) call->metadata_headers.emplace_back("x-metadata-" + key, value);
  if (options.timeout.count() > 0) {
    call->deadline = Clock::now() + std::min(options.timeout, kMaxTimeout) + options.local_grace;
  }
  if (options.max_response_bytes > 0) {
    call->max_response = std::min(options.max_response_bytes, AgentClient::kMaxUnaryResponse);
  }
  return call;
}

// Starts `call` on the client's I/O thread, or fails it at once if the client is disconnected.
void start(const std::shared_ptr<AgentClient::Impl>& impl, const std::shared_ptr<Call>& call) {
  if (!impl->thread.joinable()) {
    call->complete(makeError(ErrorCode::kUnavailable, "agent channel: " + impl->dead_reason));
    return;
  }
  impl->post([impl, call] { impl->submit(call); });
}

}  // namespace

Result<Json> AgentClient::call(const std::string& method, const Json& request, const CallOptions& options) {
  auto call = newCall(impl_, Call::Kind::kUnary, method, options);
  call->content_type = "application/json";
  call->req_body = request.dump(-1, ' ', false, Json::error_handler_t::replace);
  start(impl_, call);
  auto st = call->waitDone(std::nullopt);
  if (!st.ok()) return st.error();
  return std::move(call->value);
}

void AgentClient::callAsync(const std::string& method, const Json& request, const CallOptions& options, ValueFn done) {
  auto call = newCall(impl_, Call::Kind::kUnary, method, options);
  call->content_type = "application/json";
  call->req_body = request.dump(-1, ' ', false, Json::error_handler_t::replace);
  call->on_value = std::move(done);
  start(impl_, call);
}

namespace {

// A server-streaming call (either callback style), not yet started.
std::shared_ptr<Call> newStreamCall(const std::shared_ptr<AgentClient::Impl>& impl, const std::string& method,
                                    const Json& request, const CallOptions& options, AgentClient::EndFn on_end) {
  auto call = newCall(impl, Call::Kind::kStream, method, options);
  call->content_type = "application/connect+json";
  call->req_body = encodeEnvelope(0, request.dump(-1, ' ', false, Json::error_handler_t::replace));
  if (options.timeout.count() > 0) call->timeout_header = std::min(options.timeout, kMaxTimeout);
  call->on_end = std::move(on_end);
  return call;
}

}  // namespace

std::shared_ptr<AgentStream> AgentClient::stream(const std::string& method, const Json& request,
                                                 const CallOptions& options, MessageFn on_message, EndFn on_end) {
  auto call = newStreamCall(impl_, method, request, options, std::move(on_end));
  call->on_message = std::move(on_message);
  start(impl_, call);
  return call;
}

std::shared_ptr<AgentStream> AgentClient::streamRaw(const std::string& method, const Json& request,
                                                    const CallOptions& options, RawMessageFn on_payload, EndFn on_end) {
  auto call = newStreamCall(impl_, method, request, options, std::move(on_end));
  call->on_payload = std::move(on_payload);
  start(impl_, call);
  return call;
}

Result<Json> AgentClient::upload(const std::string& path, UploadSource source, const CallOptions& options) {
  auto call = newCall(impl_, Call::Kind::kUpload, "/files?path=" + percentEncode(path), options);
  call->content_type = "application/octet-stream";
  call->piped = true;
  start(impl_, call);
  // The source runs here, on the caller's thread, so a client that trickles its body holds up
  // this call and nothing else. The I/O thread only ever copies what is already buffered.
  std::string chunk;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(call->m);
      call->cv.wait(lock, [&] { return call->finished || call->up_bytes + kUploadChunk <= kUploadBuffer; });
      if (call->finished) break;
    }
    chunk.resize(kUploadChunk);
    auto n = source(chunk.data(), chunk.size());
    if (!n.ok()) {
      impl_->abortLater(call, n.error());
      break;
    }
    assert(n.value() <= kUploadChunk);
    chunk.resize(n.value());
    bool resume = false;
    {
      std::lock_guard<std::mutex> lock(call->m);
      if (call->finished) break;  // e.g. the deadline passed while the source was blocked
      if (chunk.empty()) {
        call->up_eof = true;
      } else {
        call->up_bytes += chunk.size();
        call->up_chunks.push_back(std::move(chunk));
      }
      resume = std::exchange(call->up_deferred, false);
    }
    if (resume) impl_->resumeLater(call);
    if (n.value() == 0) break;
    chunk = std::string();
  }
  auto st = call->waitDone(std::nullopt);
  if (!st.ok()) return st.error();
  return std::move(call->value);
}

Result<Json> AgentClient::upload(const std::string& path, std::string data, const CallOptions& options) {
  // All of it is at hand: sent from req_body like a unary request, no producer needed.
  auto call = newCall(impl_, Call::Kind::kUpload, "/files?path=" + percentEncode(path), options);
  call->content_type = "application/octet-stream";
  call->req_body = std::move(data);
  start(impl_, call);
  auto st = call->waitDone(std::nullopt);
  if (!st.ok()) return st.error();
  return std::move(call->value);
}

Status AgentClient::download(const std::string& path, DownloadSink sink, const CallOptions& options) {
  std::string target = "/files?path=" + percentEncode(path);
  if (options.offset > 0) target += "&offset=" + std::to_string(options.offset);
  if (options.length) target += "&length=" + std::to_string(*options.length);
  auto call = newCall(impl_, Call::Kind::kDownload, target, options);
  start(impl_, call);
  // The sink runs here, on the caller's thread. Until it has taken the bytes, the guest may not
  // send more on this stream (consumeLater): a slow reader slows its own download only.
  std::string taken;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(call->m);
      call->cv.wait(lock, [&] { return call->finished || !call->down_buf.empty(); });
      // The bytes that came before a clean end are delivered; after a failure they would only
      // make a truncated file look longer.
      if (call->finished && (!call->end_status.ok() || call->down_buf.empty())) return call->end_status;
      taken.swap(call->down_buf);
    }
    if (auto st = sink(taken); !st.ok()) {
      impl_->abortLater(call, st.error());
      return st;
    }
    impl_->consumeLater(call, taken.size());
    taken.clear();
  }
}

Result<std::string> AgentClient::download(const std::string& path, size_t max_bytes, const CallOptions& options) {
  std::string data;
  auto st = download(
      path,
      [&data, max_bytes](std::string_view chunk) -> Status {
        if (data.size() + chunk.size() > max_bytes) {
          return makeError(ErrorCode::kResourceExhausted,
                           "file is larger than " + std::to_string(max_bytes) + " bytes");
        }
        data.append(chunk);
        return okStatus();
      },
      options);
  if (!st.ok()) return st.error();
  return data;
}

}  // namespace space::agentproto
