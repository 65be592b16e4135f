#include "agent/h2_server.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "agentproto/base64.h"
#include "agentproto/wire.h"
#include "common/bounded_json.h"

namespace space::agent {

bool traceEnabled() {
  static const bool on = [] {
    const char* v = getenv("space_agent_trace");
    return v != nullptr && strcmp(v, "1") == 0;
  }();
  return on;
}

namespace {

constexpr size_t kMaxHeaderBytes = 64 << 10;
constexpr int32_t kWindow = 8 << 20;

std::string percentDecode(std::string_view s, bool* ok) {
  std::string out;
  *ok = true;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size() || !isxdigit(static_cast<unsigned char>(s[i + 1])) ||
          !isxdigit(static_cast<unsigned char>(s[i + 2]))) {
        *ok = false;
        return {};
      }
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else if (s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

// Value of `key` in a query string; nullopt if absent or malformed.
std::optional<std::string> queryParam(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    size_t eq = pair.find('=');
    if (pair.substr(0, eq) == key) {
      bool ok = false;
      std::string v = percentDecode(eq == std::string_view::npos ? "" : pair.substr(eq + 1), &ok);
      if (!ok) return std::nullopt;
      return v;
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// One response body: a byte queue fed by services (Connect envelopes, JSON, raw bytes) or a
// DownloadSource pulled on demand; nghttp2 pulls from it through readCallback.
class H2StreamResponse : public ServerStream, public std::enable_shared_from_this<H2StreamResponse> {
 public:
  H2StreamResponse(EventLoop& loop, H2ServerSession* session, int32_t id) : loop_(loop), session_(session), id_(id) {}

  void send(const Json& message) override {
    if (!open()) return;
    queue_ += agentproto::encodeEnvelope(0, message.dump(-1, ' ', false, Json::error_handler_t::replace));
    queued();
  }
  void finish(std::optional<RpcError> error) override {
    if (!open()) return;
    Json end = Json::object();
    if (error) end["error"] = {{"code", agentproto::rpcCodeName(error->code)}, {"message", error->message}};
    queue_ += agentproto::encodeEnvelope(agentproto::kEnvelopeEndStream,
                                         end.dump(-1, ' ', false, Json::error_handler_t::replace));
    endRaw();
  }
  bool open() const override { return session_ != nullptr && !eof_; }
  void setOnClose(std::function<void()> cb) override { on_close_ = std::move(cb); }
  size_t queuedBytes() const override { return queue_.size() - off_; }
  void setOnDrain(std::function<void()> cb) override { on_drain_ = std::move(cb); }

  void appendRaw(std::string_view bytes) {
    queue_.append(bytes);
    queued();
  }
  void endRaw() {
    eof_ = true;
    if (session_ != nullptr) session_->resume(id_);
  }
  void setSource(std::unique_ptr<DownloadSource> source) { source_ = std::move(source); }

  // The host side went away (stream closed or session gone) before the service finished.
  void detach() {
    bool was_open = open();
    session_ = nullptr;
    source_.reset();
    if (was_open && on_close_) {
      auto cb = std::move(on_close_);
      cb();
    }
    on_drain_ = nullptr;
  }

  ssize_t read(uint8_t* buf, size_t len, uint32_t* flags) {
    if (source_ && off_ == queue_.size()) {
      auto got = source_->read(reinterpret_cast<char*>(buf), len);
      if (auto* err = std::get_if<RpcError>(&got)) {
        (void)err;  // headers are sent; all we can do is reset the stream
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
      }
      size_t n = std::get<size_t>(got);
      if (n == 0) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        source_.reset();
      }
      return static_cast<ssize_t>(n);
    }
    size_t avail = queue_.size() - off_;
    if (avail == 0) {
      if (eof_) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        return 0;
      }
      return NGHTTP2_ERR_DEFERRED;
    }
    size_t n = std::min(avail, len);
    memcpy(buf, queue_.data() + off_, n);
    off_ += n;
    if (off_ == queue_.size()) {
      queue_.clear();
      off_ = 0;
    } else if (off_ > (1 << 20)) {
      queue_.erase(0, off_);
      off_ = 0;
    }
    if (above_high_ && queuedBytes() < kLowWater) {
      above_high_ = false;
      if (on_drain_)
        loop_.post([self = shared_from_this()] {
          if (self->on_drain_) self->on_drain_();
        });
    }
    if (eof_ && queuedBytes() == 0) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }

 private:
  void queued() {
    if (queuedBytes() > kHighWater) above_high_ = true;
    if (session_ != nullptr) session_->resume(id_);
  }

  EventLoop& loop_;
  H2ServerSession* session_;
  int32_t id_;
  std::string queue_;
  size_t off_ = 0;
  bool eof_ = false;
  bool above_high_ = false;
  std::function<void()> on_close_;
  std::function<void()> on_drain_;
  std::unique_ptr<DownloadSource> source_;
};

// ---------------------------------------------------------------------------------------------
struct H2ServerSession::Request {
  std::string method;
  std::string path;  // without the query
  std::string query;
  std::string content_type;
  CallContext ctx;
  size_t header_bytes = 0;
  std::string body;
  bool answered = false;  // a response (possibly an error) was already submitted
  std::unique_ptr<UploadSink> upload;
};

struct H2Callbacks {
  static H2ServerSession* self(void* user_data) { return static_cast<H2ServerSession*>(user_data); }

  static int onBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* ud) {
    auto* s = self(ud);
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    s->requests_[frame->hd.stream_id] = std::make_unique<H2ServerSession::Request>();
    return 0;
  }

  static int onHeader(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                      const uint8_t* value, size_t valuelen, uint8_t, void* ud) {
    auto* s = self(ud);
    auto it = s->requests_.find(frame->hd.stream_id);
    if (it == s->requests_.end()) return 0;
    auto& req = *it->second;
    req.header_bytes += namelen + valuelen;
    if (req.header_bytes > kMaxHeaderBytes) {
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_REFUSED_STREAM);
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    std::string_view n(reinterpret_cast<const char*>(name), namelen);
    std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":method") {
      req.method = v;
    } else if (n == ":path") {
      size_t q = v.find('?');
      req.path = v.substr(0, q);
      if (q != std::string_view::npos) req.query = v.substr(q + 1);
    } else if (n == "content-type") {
      req.content_type = v.substr(0, v.find(';'));
    } else if (n == "connect-timeout-ms") {
      if (!v.empty() && v.size() <= 10 && v.find_first_not_of("0123456789") == std::string_view::npos) {
        req.ctx.timeout = std::chrono::milliseconds(std::stoll(std::string(v)));
      }
    } else if (n == "authorization") {
      if (v.rfind("Basic ", 0) == 0) {
        auto decoded = agentproto::base64Decode(v.substr(6));
        if (decoded) req.ctx.user = decoded->substr(0, decoded->find(':'));
      }
    } else if (n == "x-space-user") {
      req.ctx.user = v;
    } else if (n.size() > 11 && n.substr(0, 11) == "x-metadata-") {
      // HTTP/2 names are lower case already; the header block's own bound (64 KiB) bounds these.
      req.ctx.metadata.emplace(std::string(n.substr(11)), std::string(v));
    }
    return 0;
  }

  static int onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* ud) {
    auto* s = self(ud);
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    auto it = s->requests_.find(frame->hd.stream_id);
    if (it == s->requests_.end()) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      s->onHeadersDone(frame->hd.stream_id, *it->second);
    }
    if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 && !it->second->answered) {
      s->dispatch(frame->hd.stream_id, *it->second);
    }
    return 0;
  }

  static int onDataChunk(nghttp2_session*, uint8_t, int32_t stream_id, const uint8_t* data, size_t len, void* ud) {
    auto* s = self(ud);
    auto it = s->requests_.find(stream_id);
    if (it == s->requests_.end() || it->second->answered) return 0;
    auto& req = *it->second;
    std::string_view chunk(reinterpret_cast<const char*>(data), len);
    if (req.upload) {
      if (auto err = req.upload->write(chunk)) {
        req.upload->abort();
        req.upload.reset();
        s->respondError(stream_id, *err);
      }
      return 0;
    }
    if (req.body.size() + len > H2ServerSession::kMaxRequestBody) {
      s->respondError(stream_id,
                      rpcError(RpcCode::kResourceExhausted,
                               "request body exceeds " + std::to_string(H2ServerSession::kMaxRequestBody) + " bytes"));
      return 0;
    }
    req.body.append(chunk);
    return 0;
  }

  static int onStreamClose(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* ud) {
    if (traceEnabled()) fprintf(stderr, "space-agent: h2: stream %d closed (error %u)\n", stream_id, error_code);
    self(ud)->closeStream(stream_id);
    return 0;
  }

  static ssize_t readBody(nghttp2_session*, int32_t, uint8_t* buf, size_t len, uint32_t* flags,
                          nghttp2_data_source* source, void*) {
    return static_cast<H2StreamResponse*>(source->ptr)->read(buf, len, flags);
  }
};

H2ServerSession::H2ServerSession(EventLoop& loop, const Router& router, std::function<void()> on_output)
    : loop_(loop), router_(router), on_output_(std::move(on_output)) {
  nghttp2_session_callbacks* cbs = nullptr;
  nghttp2_session_callbacks_new(&cbs);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, H2Callbacks::onBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(cbs, H2Callbacks::onHeader);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, H2Callbacks::onFrameRecv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, H2Callbacks::onDataChunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, H2Callbacks::onStreamClose);
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
  nghttp2_session_server_new2(&session_, cbs, this, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, static_cast<uint32_t>(kMaxConcurrentStreams)},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(kWindow)},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(kMaxHeaderBytes)},
  };
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, sizeof settings / sizeof settings[0]);
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, kWindow * 4);
}

H2ServerSession::~H2ServerSession() {
  auto responses = std::move(responses_);
  responses_.clear();
  for (auto& [id, r] : responses) r->detach();
  for (auto& [id, req] : requests_) {
    if (req->upload) req->upload->abort();
  }
  nghttp2_session_del(session_);
}

Status H2ServerSession::receive(std::string_view bytes) {
  ssize_t n = nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (n < 0) return makeError(ErrorCode::kUnavailable, std::string("HTTP/2: ") + nghttp2_strerror(static_cast<int>(n)));
  return okStatus();
}

std::string H2ServerSession::takeOutput(size_t max) {
  std::string out = std::move(pending_out_);
  pending_out_.clear();
  while (out.size() < max) {
    const uint8_t* data = nullptr;
    ssize_t n = nghttp2_session_mem_send(session_, &data);
    if (n <= 0) break;
    out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
  }
  return out;
}

bool H2ServerSession::wantsToWrite() const {
  return !pending_out_.empty() || nghttp2_session_want_write(session_) != 0;
}

bool H2ServerSession::terminated() {
  // nghttp2 reports want_read == 0 only once its GOAWAY went out, so serialize pending frames
  // (GOAWAY goes first) into our own buffer before asking.
  if (pending_out_.size() < (64 << 10)) {
    const uint8_t* data = nullptr;
    ssize_t n;
    while (pending_out_.size() < (64 << 10) && (n = nghttp2_session_mem_send(session_, &data)) > 0) {
      pending_out_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
  }
  return nghttp2_session_want_read(session_) == 0;
}

void H2ServerSession::resume(int32_t stream_id) {
  nghttp2_session_resume_data(session_, stream_id);
  on_output_();
}

void H2ServerSession::closeStream(int32_t stream_id) {
  if (auto it = requests_.find(stream_id); it != requests_.end()) {
    if (it->second->upload) it->second->upload->abort();
    requests_.erase(it);
  }
  if (auto it = responses_.find(stream_id); it != responses_.end()) {
    auto r = std::move(it->second);
    responses_.erase(it);
    r->detach();
  }
}

void H2ServerSession::startStreamResponse(int32_t stream_id, std::shared_ptr<H2StreamResponse> body) {
  responses_[stream_id] = body;
  nghttp2_data_provider provider{};
  provider.source.ptr = body.get();
  provider.read_callback = H2Callbacks::readBody;
  const char* ct = "application/connect+json";
  nghttp2_nv hdrs[] = {
      {(uint8_t*)":status", (uint8_t*)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
      {(uint8_t*)"content-type", (uint8_t*)ct, 12, strlen(ct), NGHTTP2_NV_FLAG_NONE},
  };
  nghttp2_submit_response(session_, stream_id, hdrs, 2, &provider);
  on_output_();
}

void H2ServerSession::respondJson(int32_t stream_id, int status, const std::string& body) {
  auto it = requests_.find(stream_id);
  if (it != requests_.end()) it->second->answered = true;
  auto r = std::make_shared<H2StreamResponse>(loop_, this, stream_id);
  r->appendRaw(body);
  r->endRaw();
  responses_[stream_id] = r;
  std::string status_str = std::to_string(status);
  nghttp2_data_provider provider{};
  provider.source.ptr = r.get();
  provider.read_callback = H2Callbacks::readBody;
  nghttp2_nv hdrs[] = {
      {(uint8_t*)":status", (uint8_t*)status_str.data(), 7, status_str.size(), NGHTTP2_NV_FLAG_NONE},
      {(uint8_t*)"content-type", (uint8_t*)"application/json", 12, 16, NGHTTP2_NV_FLAG_NONE},
  };
  nghttp2_submit_response(session_, stream_id, hdrs, 2, &provider);
  on_output_();
}

void H2ServerSession::respondError(int32_t stream_id, const RpcError& err) {
  Json body{{"code", agentproto::rpcCodeName(err.code)}, {"message", err.message}};
  respondJson(stream_id, agentproto::httpStatusFor(err.code),
              body.dump(-1, ' ', false, Json::error_handler_t::replace));
}

void H2ServerSession::onHeadersDone(int32_t stream_id, Request& req) {
  // Uploads stream their body straight into the sink; everything else is buffered (bounded).
  if (req.method != "POST" || req.path != "/files") return;
  auto path = queryParam(req.query, "path");
  if (!path) {
    respondError(stream_id, rpcError(RpcCode::kInvalidArgument, "upload needs a path query parameter"));
    return;
  }
  if (!router_.uploadHandler()) {
    respondError(stream_id, rpcError(RpcCode::kUnimplemented, "uploads are not served"));
    return;
  }
  if (auto user = queryParam(req.query, "username")) req.ctx.user = *user;
  std::variant<std::unique_ptr<UploadSink>, RpcError> sink = rpcError(RpcCode::kInternal, "upload handler failed");
  try {
    sink = router_.uploadHandler()(*path, req.ctx);
  } catch (const std::exception& e) {
    sink = rpcError(RpcCode::kInternal, std::string("upload handler failed: ") + e.what());
  }
  if (auto* err = std::get_if<RpcError>(&sink)) {
    respondError(stream_id, *err);
    return;
  }
  req.upload = std::move(std::get<std::unique_ptr<UploadSink>>(sink));
}

void H2ServerSession::dispatch(int32_t stream_id, Request& req) {
  if (traceEnabled()) {
    fprintf(stderr, "space-agent: h2: stream %d %s %.100s (%zu body bytes)\n", stream_id, req.method.c_str(),
            req.path.c_str(), req.body.size());
  }
  // Last line of defence: the agent is PID 1, and an exception escaping a handler would panic
  // the guest kernel. Handlers are written not to throw; if one does, only its call fails.
  try {
    dispatchChecked(stream_id, req);
  } catch (const std::exception& e) {
    RpcError err = rpcError(RpcCode::kInternal, std::string("agent handler failed: ") + e.what());
    if (auto it = responses_.find(stream_id); it != responses_.end()) {
      it->second->finish(err);
    } else if (!req.answered) {
      respondError(stream_id, err);
    }
  }
}

void H2ServerSession::dispatchChecked(int32_t stream_id, Request& req) {
  if (req.path == "/files") {
    if (req.method == "POST") {
      if (!req.upload) return;  // already answered with an error
      auto result = req.upload->finish();
      req.upload.reset();
      if (auto* err = std::get_if<RpcError>(&result)) return respondError(stream_id, *err);
      return respondJson(stream_id, 200, std::get<Json>(result).dump(-1, ' ', false, Json::error_handler_t::replace));
    }
    if (req.method == "GET") {
      auto path = queryParam(req.query, "path");
      if (!path)
        return respondError(stream_id, rpcError(RpcCode::kInvalidArgument, "download needs a path query parameter"));
      if (auto user = queryParam(req.query, "username")) req.ctx.user = *user;
      // Decimal, at most 2^53 (no file is larger): anything else is refused, never guessed at.
      auto number = [](const std::optional<std::string>& v) -> std::optional<uint64_t> {
        if (!v || v->empty() || v->size() > 16 || v->find_first_not_of("0123456789") != std::string::npos) {
          return std::nullopt;
        }
        return std::stoull(*v);
      };
      for (const char* name : {"offset", "length"}) {
        auto raw = queryParam(req.query, name);
        if (!raw) continue;
        auto value = number(raw);
        if (!value) {
          return respondError(stream_id,
                              rpcError(RpcCode::kInvalidArgument, std::string(name) + ": must be a byte count"));
        }
        if (name[0] == 'o') {
          req.ctx.offset = *value;
        } else {
          req.ctx.length = *value;
        }
      }
      if (!router_.downloadHandler())
        return respondError(stream_id, rpcError(RpcCode::kUnimplemented, "downloads are not served"));
      auto src = router_.downloadHandler()(*path, req.ctx);
      if (auto* err = std::get_if<RpcError>(&src)) return respondError(stream_id, *err);
      auto source = std::move(std::get<std::unique_ptr<DownloadSource>>(src));
      std::string length = std::to_string(source->size());
      req.answered = true;
      auto r = std::make_shared<H2StreamResponse>(loop_, this, stream_id);
      r->setSource(std::move(source));
      responses_[stream_id] = r;
      nghttp2_data_provider provider{};
      provider.source.ptr = r.get();
      provider.read_callback = H2Callbacks::readBody;
      nghttp2_nv hdrs[] = {
          {(uint8_t*)":status", (uint8_t*)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
          {(uint8_t*)"content-type", (uint8_t*)"application/octet-stream", 12, 24, NGHTTP2_NV_FLAG_NONE},
          {(uint8_t*)"content-length", (uint8_t*)length.data(), 14, length.size(), NGHTTP2_NV_FLAG_NONE},
      };
      nghttp2_submit_response(session_, stream_id, hdrs, 3, &provider);
      on_output_();
      return;
    }
    return respondError(stream_id, rpcError(RpcCode::kInvalidArgument, "/files takes GET or POST"));
  }
  if (req.method != "POST") {
    return respondError(stream_id, rpcError(RpcCode::kInvalidArgument, "RPCs are POST requests"));
  }
  if (req.content_type == "application/json") {
    const auto* handler = router_.findUnary(req.path);
    if (handler == nullptr) return respondError(stream_id, rpcError(RpcCode::kUnimplemented, "no method " + req.path));
    // Parsing builds a DOM; deep or huge documents cost far more memory than their size.
    auto parsed = req.body.empty() ? Result<Json>(Json::object()) : parseJsonBounded(req.body);
    if (!parsed.ok()) {
      return respondError(stream_id, rpcError(RpcCode::kInvalidArgument, "request " + parsed.error().message));
    }
    Json body = std::move(parsed.value());
    if (!body.is_object()) {
      return respondError(stream_id, rpcError(RpcCode::kInvalidArgument, "request body is not a JSON object"));
    }
    auto result = (*handler)(body, req.ctx);
    if (auto* err = std::get_if<RpcError>(&result)) return respondError(stream_id, *err);
    return respondJson(stream_id, 200, std::get<Json>(result).dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  if (req.content_type == "application/connect+json") {
    req.answered = true;
    auto r = std::make_shared<H2StreamResponse>(loop_, this, stream_id);
    startStreamResponse(stream_id, r);
    const auto* handler = router_.findStream(req.path);
    if (handler == nullptr) return r->finish(rpcError(RpcCode::kUnimplemented, "no method " + req.path));
    agentproto::EnvelopeDecoder decoder(kMaxRequestBody);
    auto fed = decoder.feed(req.body);
    auto env = fed.ok() ? decoder.next() : Result<std::optional<agentproto::Envelope>>(fed.error());
    if (!env.ok() || !env.value() || decoder.midMessage()) {
      return r->finish(rpcError(RpcCode::kInvalidArgument, "stream request must be exactly one envelope"));
    }
    auto parsed = parseJsonBounded(env.value()->payload);
    if (!parsed.ok()) return r->finish(rpcError(RpcCode::kInvalidArgument, "request " + parsed.error().message));
    Json body = std::move(parsed.value());
    if (!body.is_object()) {
      return r->finish(rpcError(RpcCode::kInvalidArgument, "request message is not a JSON object"));
    }
    (*handler)(body, req.ctx, r);
    return;
  }
  respondError(stream_id, rpcError(RpcCode::kInvalidArgument, "unsupported content type \"" + req.content_type + "\""));
}

}  // namespace space::agent
