#include "guest/guest_ops.h"

#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include "agentproto/base64.h"

namespace space::guest {

using agentproto::CallOptions;
using agentproto::Json;
using std::chrono::milliseconds;

namespace {

// What one queued event costs besides its data and status text (its share of the consumer's
// line, e.g. {"type":"stdout","data":""}), so that empty events still count.
constexpr size_t kEventOverhead = 64;
constexpr size_t kMaxStatusText = 4096;
// Entries a listing may have. Each costs the daemon a few hundred bytes decoded and again as
// output JSON whatever the guest sent (an empty `{}` is 3 bytes of answer): without a cap a 3 MB
// answer of a million entries cost ~1 GB (found by review). A guest has at most pid_max (32768
// by default) processes; a listing of more than 50,000 entries is to be narrowed (path, depth).
constexpr size_t kMaxListEntries = 50000;
constexpr size_t kMaxProcesses = 32768;
// Stdin is fed by unary calls while the stream's consumer waits: a guest that does not answer
// must not hold it for the default 30 s per call.
constexpr milliseconds kStdinCallTimeout{15000};
// How long stop() waits for the agent to see a cancel.
constexpr milliseconds kStopWait{5000};

Error malformed(const std::string& what) {
  return makeError(ErrorCode::kUnavailable, "malformed " + what + " from the agent");
}

// One process stream message: {"event": {"start"|"data"|"end"|"keepalive": ...}}. nullopt for
// events a consumer does not see (keepalives, kinds this host does not know).
Result<std::optional<ProcessEvent>> decodeEvent(const Json& message) {
  auto bad = [] { return malformed("process event"); };
  if (!message.is_object()) return bad();
  auto ev_it = message.find("event");
  if (ev_it == message.end() || !ev_it->is_object()) return bad();
  const Json& ev = *ev_it;
  ProcessEvent out;
  if (auto it = ev.find("start"); it != ev.end()) {
    auto pid = it->is_object() ? it->find("pid") : it->end();
    if (!it->is_object() || pid == it->end() || !pid->is_number_integer()) return bad();
    auto n = pid->get<int64_t>();
    if (n < 1 || n > INT_MAX) return bad();
    out.kind = ProcessEvent::Kind::kStart;
    out.pid = static_cast<int>(n);
    return std::optional<ProcessEvent>(std::move(out));
  }
  if (auto it = ev.find("data"); it != ev.end()) {
    if (!it->is_object()) return bad();
    for (auto [key, kind] :
         {std::pair{"stdout", ProcessEvent::Kind::kStdout}, std::pair{"stderr", ProcessEvent::Kind::kStderr},
          std::pair{"pty", ProcessEvent::Kind::kStdout}}) {
      auto data = it->find(key);
      if (data == it->end()) continue;
      if (!data->is_string()) return bad();
      // Passed on as sent, so it must be what a decoder accepts, and bounded.
      const auto& text = data->get_ref<const std::string&>();
      auto size = agentproto::base64DecodedSize(text);
      if (!size) return malformed("process output (not canonical base64)");
      if (*size > kMaxEventData)
        return malformed("process output (a chunk over " + std::to_string(kMaxEventData) + " bytes)");
      out.kind = kind;
      out.data_base64 = text;
      return std::optional<ProcessEvent>(std::move(out));
    }
    return bad();
  }
  if (auto it = ev.find("end"); it != ev.end()) {
    if (!it->is_object()) return bad();
    out.kind = ProcessEvent::Kind::kEnd;
    if (auto code = it->find("exitCode"); code != it->end()) {
      if (!code->is_number_integer()) return bad();
      // 2^64-1 is an integer too, and would wrap to -1 as int64.
      if (code->is_number_unsigned() && code->get<uint64_t>() > static_cast<uint64_t>(INT_MAX)) return bad();
      auto n = code->get<int64_t>();
      if (n < INT_MIN || n > INT_MAX) return bad();
      out.end.exit_code = static_cast<int>(n);
    }
    auto exited = it->find("exited");
    out.end.exited = exited != it->end() && exited->is_boolean() && exited->get<bool>();
    if (auto status = it->find("status"); status != it->end() && status->is_string()) {
      if (status->get_ref<const std::string&>().size() > kMaxStatusText) return bad();
      out.end.status = status->get<std::string>();
    }
    return std::optional<ProcessEvent>(std::move(out));
  }
  return std::optional<ProcessEvent>();  // keepalive, or a kind this host does not know
}

// An optional string field: absent is nullopt, another type is malformed.
bool optionalString(const Json& object, const char* key, std::optional<std::string>& out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return true;
  if (!it->is_string()) return false;
  out = it->get<std::string>();
  return true;
}

// An envd EntryInfo.
Result<FileEntry> decodeEntry(const Json& e) {
  auto bad = [] { return malformed("file entry"); };
  if (!e.is_object()) return bad();
  FileEntry out;
  std::optional<std::string> type;
  for (auto [key, field] :
       {std::pair{"name", &out.name}, std::pair{"path", &out.path}, std::pair{"type", &type},
        std::pair{"permissions", &out.permissions}, std::pair{"owner", &out.owner}, std::pair{"group", &out.group},
        std::pair{"modifiedTime", &out.modified_at}, std::pair{"symlinkTarget", &out.symlink_target}}) {
    if (!optionalString(e, key, *field)) return bad();
  }
  if (out.symlink_target) {
    out.type = FileType::kSymlink;
  } else if (type == "FILE_TYPE_FILE") {
    out.type = FileType::kFile;
  } else if (type == "FILE_TYPE_DIRECTORY") {
    out.type = FileType::kDirectory;
  }
  // Protobuf's JSON mapping sends 64-bit integers as strings.
  if (auto size = e.find("size"); size != e.end() && !size->is_null()) {
    if (size->is_number_unsigned()) {
      out.size = size->get<uint64_t>();
    } else if (size->is_string()) {
      const auto& text = size->get_ref<const std::string&>();
      if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos) return bad();
      errno = 0;
      out.size = std::strtoull(text.c_str(), nullptr, 10);
      if (errno != 0) return bad();
    } else {
      return bad();
    }
  }
  if (auto mode = e.find("mode"); mode != e.end() && !mode->is_null()) {
    if (!mode->is_number_unsigned() || mode->get<uint64_t>() > 07777) return bad();
    out.mode = static_cast<uint32_t>(mode->get<uint64_t>());
  }
  return out;
}

// {"entry": EntryInfo}, as MakeDir and Move answer; no entry is an entry with nothing known.
Result<FileEntry> entryOf(const Json& response) {
  if (!response.is_object()) return malformed("file answer");
  auto it = response.find("entry");
  if (it == response.end()) return FileEntry{};
  return decodeEntry(*it);
}

Result<std::vector<ProcessInfo>> decodeProcessList(const Json& response) {
  auto bad = [] { return malformed("process list"); };
  std::vector<ProcessInfo> out;
  if (!response.is_object()) return bad();
  auto list = response.find("processes");
  if (list == response.end()) return out;
  if (!list->is_array()) return bad();
  if (list->size() > kMaxProcesses)
    return malformed("process list (over " + std::to_string(kMaxProcesses) + " processes)");
  out.reserve(list->size());
  for (const auto& p : *list) {
    if (!p.is_object()) return bad();
    ProcessInfo info;
    auto pid = p.find("pid");
    if (pid == p.end() || !pid->is_number_integer() || pid->get<int64_t>() < 1 || pid->get<int64_t>() > INT_MAX) {
      return bad();
    }
    info.pid = pid->get<int>();
    if (!optionalString(p, "tag", info.tag)) return bad();
    if (auto cfg = p.find("config"); cfg != p.end()) {
      if (!cfg->is_object()) return bad();
      std::optional<std::string> cmd, cwd;
      if (!optionalString(*cfg, "cmd", cmd) || !optionalString(*cfg, "cwd", cwd)) return bad();
      info.cmd = cmd.value_or("");
      info.cwd = cwd.value_or("");
      if (auto args = cfg->find("args"); args != cfg->end()) {
        if (!args->is_array()) return bad();
        for (const auto& a : *args) {
          if (!a.is_string()) return bad();
          info.args.push_back(a.get<std::string>());
        }
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

Json selectPid(int pid) { return Json{{"process", {{"pid", pid}}}}; }

const char* signalName(Signal s) {
  switch (s) {
    case Signal::kKill: return "SIGNAL_SIGKILL";
    case Signal::kTerm: return "SIGNAL_SIGTERM";
    case Signal::kInt: return "SIGNAL_SIGINT";
    case Signal::kHup: return "SIGNAL_SIGHUP";
    case Signal::kQuit: return "SIGNAL_SIGQUIT";
    case Signal::kUsr1: return "SIGNAL_SIGUSR1";
    case Signal::kUsr2: return "SIGNAL_SIGUSR2";
    case Signal::kStop: return "SIGNAL_SIGSTOP";
    case Signal::kCont: return "SIGNAL_SIGCONT";
  }
  return "SIGNAL_SIGKILL";
}

// The agent's request for a spec; the stdin bytes stay out of it (they follow as SendInput).
agentproto::CommandSpec commandSpec(const ProcessSpec& spec) {
  agentproto::CommandSpec out;
  out.command = spec.command;
  out.argv = spec.argv;
  out.env = spec.env;
  out.cwd = spec.cwd;
  out.user = spec.user;
  out.timeout = spec.timeout;
  if (spec.pty) out.pty = std::pair{spec.pty->cols, spec.pty->rows};
  out.tag = spec.tag;
  return out;
}

}  // namespace

Status checkProcessSpec(const ProcessSpec& spec) {
  if (spec.command.empty() == spec.argv.empty()) {
    return makeError(ErrorCode::kInvalidArgument, "exactly one of command, argv is required");
  }
  if (spec.argv.empty() && spec.command.find('\0') != std::string::npos) {
    return makeError(ErrorCode::kInvalidArgument, "command: contains a NUL byte");
  }
  if (!spec.argv.empty() && spec.argv.front().empty()) {
    return makeError(ErrorCode::kInvalidArgument, "argv: must name a program");
  }
  if (spec.pty) {
    if (spec.pty->cols < 1 || spec.pty->cols > 65535 || spec.pty->rows < 1 || spec.pty->rows > 65535) {
      return makeError(ErrorCode::kInvalidArgument, "pty: cols and rows must be in 1..65535");
    }
    if (spec.stdin_data) return makeError(ErrorCode::kInvalidArgument, "pty: input goes to the terminal, not stdin");
  }
  return okStatus();
}

std::optional<Signal> parseSignal(std::string_view name) {
  if (name.rfind("SIG", 0) == 0) name.remove_prefix(3);
  static constexpr std::pair<std::string_view, Signal> kSignals[] = {
      {"KILL", Signal::kKill}, {"TERM", Signal::kTerm}, {"INT", Signal::kInt},
      {"HUP", Signal::kHup},   {"QUIT", Signal::kQuit}, {"USR1", Signal::kUsr1},
      {"USR2", Signal::kUsr2}, {"STOP", Signal::kStop}, {"CONT", Signal::kCont}};
  for (const auto& [n, s] : kSignals) {
    if (n == name) return s;
  }
  return std::nullopt;
}

// ---- ProcessStream

struct ProcessStream::Shared {
  explicit Shared(size_t limit) : max_backlog(limit) {}
  const size_t max_backlog;
  std::mutex m;
  std::condition_variable cv;
  std::vector<ProcessEvent> events;
  size_t backlog = 0;
  int pid = 0;
  bool over = false;      // the agent stream ended
  bool overflow = false;  // an event did not fit the backlog; nothing more is taken
  bool broken = false;    // a malformed event came; nothing more is taken
  std::optional<Error> error;
  std::shared_ptr<const std::function<void()>> ready;  // ProcessStream::onReady

  // On the agent client's I/O thread: short, never blocking.
  void onMessage(const Json& message) {
    std::shared_ptr<const std::function<void()>> notify;
    {
      std::lock_guard lock(m);
      if (broken || overflow) return;
      auto ev = decodeEvent(message);
      if (!ev.ok()) {
        broken = true;
        if (!error) error = ev.error();
      } else if (ev.value()) {
        ProcessEvent& event = *ev.value();
        if (event.kind == ProcessEvent::Kind::kStart) pid = event.pid;
        size_t cost = kEventOverhead + event.data_base64.size() + event.end.status.size();
        if (backlog + cost > max_backlog) {
          overflow = true;
        } else {
          backlog += cost;
          events.push_back(std::move(event));
        }
      } else {
        return;
      }
      cv.notify_all();
      notify = ready;
    }
    if (notify) (*notify)();  // outside the lock: the consumer takes it in next()
  }
  void onEnd(const Status& end) {
    std::shared_ptr<const std::function<void()>> notify;
    {
      std::lock_guard lock(m);
      if (!end.ok() && !error) error = end.error();
      over = true;
      cv.notify_all();
      notify = ready;
    }
    if (notify) (*notify)();
  }
};

ProcessStream::ProcessStream(std::shared_ptr<agentproto::AgentClient> agent, std::shared_ptr<Shared> shared,
                             std::shared_ptr<agentproto::AgentStream> stream, std::optional<std::string> stdin_data,
                             bool close_stdin)
    : agent_(std::move(agent)),
      shared_(std::move(shared)),
      stream_(std::move(stream)),
      stdin_data_(std::move(stdin_data)),
      close_stdin_(close_stdin) {
  stdin_done_ = !stdin_data_ || (stdin_data_->empty() && !close_stdin_);
}

ProcessStream::~ProcessStream() { stop(); }

void ProcessStream::stop() {
  if (canceled_ || stream_->done()) return;
  stream_->cancel();
  (void)stream_->wait(kStopWait);
}

void ProcessStream::cancel() {
  canceled_ = true;
  stream_->cancel();
}

void ProcessStream::onReady(std::function<void()> ready) {
  auto shared_ready = std::make_shared<const std::function<void()>>(std::move(ready));
  std::lock_guard lock(shared_->m);
  shared_->ready = std::move(shared_ready);
}

void ProcessStream::deliverStdin(int pid) {
  stdin_done_ = true;
  std::string data = std::move(*stdin_data_);
  stdin_data_.reset();  // a stream may run for a day: its stdin need not stay
  Result<Json> fed = Json::object();
  if (!data.empty()) {
    fed = agent_->call("/process.Process/SendInput",
                       Json{{"process", {{"pid", pid}}}, {"input", {{"stdin", agentproto::base64Encode(data)}}}},
                       agentproto::CallOptions{kStdinCallTimeout});
  }
  if (fed.ok() && close_stdin_) {
    fed = agent_->call("/process.Process/CloseStdin", selectPid(pid), agentproto::CallOptions{kStdinCallTimeout});
  }
  if (fed.ok()) return;
  // The process must not run on as if its input had arrived: stop it and say why.
  (void)agent_->call("/process.Process/SendSignal", Json{{"process", {{"pid", pid}}}, {"signal", "SIGNAL_SIGKILL"}},
                     agentproto::CallOptions{kStdinCallTimeout});
  std::lock_guard lock(shared_->m);
  if (!shared_->error) shared_->error = makeError(fed.error().code, "stdin: " + fed.error().message);
}

ProcessStream::Batch ProcessStream::next(milliseconds wait) { return take(wait, true); }

ProcessStream::Batch ProcessStream::poll() { return take(milliseconds(0), false); }

ProcessStream::Batch ProcessStream::take(milliseconds wait, bool may_block) {
  Batch batch;
  if (final_) {
    batch.state = *final_;
    return batch;
  }
  if (may_block && !stdin_done_ && !canceled_) {  // a canceled stream's consumer must not wait on the guest
    int pid = 0;
    {
      std::lock_guard lock(shared_->m);
      pid = shared_->pid;
    }
    if (pid != 0) deliverStdin(pid);
  }
  bool over = false, overflow = false, broken = false;
  {
    std::unique_lock lock(shared_->m);
    shared_->cv.wait_for(lock, wait, [&] {
      return !shared_->events.empty() || shared_->over || shared_->overflow || shared_->broken ||
             (!stdin_done_ && shared_->pid != 0);
    });
    batch.events.swap(shared_->events);
    shared_->backlog = 0;
    over = shared_->over;
    overflow = shared_->overflow;
    broken = shared_->broken;
    if (broken || over) batch.error = shared_->error;
  }
  if (broken) {
    may_block ? stop() : cancel();
    batch.state = State::kEnded;
  } else if (overflow) {
    may_block ? stop() : cancel();
    batch.state = State::kOverflow;
  } else if (over) {
    batch.state = State::kEnded;
  }
  if (batch.state != State::kOpen) final_ = batch.state;
  return batch;
}

// ---- GuestOps

GuestOps::GuestOps(std::shared_ptr<agentproto::AgentClient> agent) : agent_(std::move(agent)) {}

Result<ProcessOutput> GuestOps::run(ProcessSpec spec, size_t max_output, const std::function<bool()>& abandon) {
  SPACE_TRY(checkProcessSpec(spec));
  if (spec.pty) return makeError(ErrorCode::kInvalidArgument, "a process run to its end has no terminal");
  if (!spec.close_stdin) {
    return makeError(ErrorCode::kInvalidArgument, "a process run to its end needs its stdin closed");
  }
  agentproto::CommandSpec command = commandSpec(spec);
  command.stdin_data = std::move(spec.stdin_data);
  return agentproto::runCommand(*agent_, command, max_output, abandon);
}

Result<std::unique_ptr<ProcessStream>> GuestOps::start(ProcessSpec spec, const StreamLimits& limits) {
  SPACE_TRY(checkProcessSpec(spec));
  agentproto::CommandSpec command = commandSpec(spec);
  // Only whether the process gets a stdin pipe goes into Start; its bytes follow.
  const bool has_stdin = !spec.pty && (spec.stdin_data.has_value() || !spec.close_stdin);
  if (has_stdin) command.stdin_data = std::string();
  CallOptions options;
  options.user = spec.user;
  options.timeout = spec.timeout;
  options.local_grace = std::chrono::seconds(5);
  std::optional<std::string> stdin_data;
  if (has_stdin) stdin_data = spec.stdin_data ? std::move(*spec.stdin_data) : std::string();
  return openStream("/process.Process/Start", agentproto::startRequest(command), options, limits, std::move(stdin_data),
                    spec.close_stdin);
}

std::unique_ptr<ProcessStream> GuestOps::connect(int pid, const StreamLimits& limits) {
  CallOptions options;
  options.timeout = milliseconds(0);  // as long as the process runs
  options.local_grace = std::chrono::seconds(5);
  return openStream("/process.Process/Connect", selectPid(pid), options, limits, std::nullopt, false);
}

std::unique_ptr<ProcessStream> GuestOps::openStream(const std::string& method, const Json& request,
                                                    const CallOptions& options, const StreamLimits& limits,
                                                    std::optional<std::string> stdin_data, bool close_stdin) {
  // The callbacks may run after the ProcessStream is gone (until on_end): they own `shared`.
  auto shared = std::make_shared<ProcessStream::Shared>(limits.max_backlog);
  auto stream = agent_->stream(
      method, request, options, [shared](const Json& message) { shared->onMessage(message); },
      [shared](const Status& end) { shared->onEnd(end); });
  return std::unique_ptr<ProcessStream>(
      new ProcessStream(agent_, std::move(shared), std::move(stream), std::move(stdin_data), close_stdin));
}

Result<std::vector<ProcessInfo>> GuestOps::listProcesses() {
  auto result = agent_->call("/process.Process/List", Json::object());
  if (!result.ok()) return result.error();
  return decodeProcessList(result.value());
}

CallOptions GuestOps::controlOptions() const {
  CallOptions options;
  if (control_timeout_) options.timeout = *control_timeout_;
  return options;
}

Status GuestOps::sendSignal(int pid, Signal signal) {
  auto result = agent_->call("/process.Process/SendSignal",
                             Json{{"process", {{"pid", pid}}}, {"signal", signalName(signal)}}, controlOptions());
  if (!result.ok()) return result.error();
  return okStatus();
}

Status GuestOps::sendSignalTagged(const std::string& tag, Signal signal) {
  if (tag.empty()) return makeError(ErrorCode::kInvalidArgument, "a process tag must not be empty");
  auto result = agent_->call("/process.Process/SendSignal",
                             Json{{"process", {{"tag", tag}}}, {"signal", signalName(signal)}}, controlOptions());
  if (!result.ok()) return result.error();
  return okStatus();
}

Status GuestOps::sendInput(int pid, std::string_view data) {
  if (data.empty()) return okStatus();
  auto result = agent_->call("/process.Process/SendInput",
                             Json{{"process", {{"pid", pid}}}, {"input", {{"stdin", agentproto::base64Encode(data)}}}},
                             controlOptions());
  if (!result.ok()) return result.error();
  return okStatus();
}

Status GuestOps::sendPtyInput(int pid, std::string_view data) {
  if (data.empty()) return okStatus();
  auto result = agent_->call("/process.Process/SendInput",
                             Json{{"process", {{"pid", pid}}}, {"input", {{"pty", agentproto::base64Encode(data)}}}},
                             controlOptions());
  if (!result.ok()) return result.error();
  return okStatus();
}

Status GuestOps::resizePty(int pid, PtySize size) {
  auto result =
      agent_->call("/process.Process/Update",
                   Json{{"process", {{"pid", pid}}}, {"pty", {{"size", {{"cols", size.cols}, {"rows", size.rows}}}}}},
                   controlOptions());
  if (!result.ok()) return result.error();
  return okStatus();
}

void GuestOps::controlAsync(const std::string& method, Json request, Done done) {
  agent_->callAsync(method, request, controlOptions(), [done = std::move(done)](Result<Json> answer) {
    done(answer.ok() ? okStatus() : Status(answer.error()));
  });
}

void GuestOps::sendPtyInputAsync(int pid, std::string_view data, Done done) {
  if (data.empty()) return done(okStatus());
  controlAsync("/process.Process/SendInput",
               Json{{"process", {{"pid", pid}}}, {"input", {{"pty", agentproto::base64Encode(data)}}}},
               std::move(done));
}

void GuestOps::resizePtyAsync(int pid, PtySize size, Done done) {
  controlAsync("/process.Process/Update",
               Json{{"process", {{"pid", pid}}}, {"pty", {{"size", {{"cols", size.cols}, {"rows", size.rows}}}}}},
               std::move(done));
}

void GuestOps::sendSignalAsync(int pid, Signal signal, Done done) {
  controlAsync("/process.Process/SendSignal", Json{{"process", {{"pid", pid}}}, {"signal", signalName(signal)}},
               std::move(done));
}

Status GuestOps::closeStdin(int pid) {
  auto result = agent_->call("/process.Process/CloseStdin", selectPid(pid));
  if (!result.ok()) return result.error();
  return okStatus();
}

namespace {

CallOptions asUser(const std::string& user) {
  CallOptions options;
  options.user = user;
  return options;
}

}  // namespace

Status GuestOps::remove(const std::string& path, const std::string& user) {
  auto result = agent_->call("/filesystem.Filesystem/Remove", Json{{"path", path}}, asUser(user));
  if (!result.ok()) return result.error();
  return okStatus();
}

Result<std::vector<FileEntry>> GuestOps::listDir(const std::string& path, int depth, const std::string& user) {
  auto result = agent_->call("/filesystem.Filesystem/ListDir", Json{{"path", path}, {"depth", depth}}, asUser(user));
  if (!result.ok()) return result.error();
  std::vector<FileEntry> out;
  if (!result->is_object()) return malformed("directory listing");
  auto entries = result->find("entries");
  if (entries == result->end()) return out;
  if (!entries->is_array()) return malformed("directory listing");
  if (entries->size() > kMaxListEntries) {
    return makeError(
        ErrorCode::kInvalidArgument,
        "the listing has over " + std::to_string(kMaxListEntries) + " entries; list a narrower path or a smaller depth",
        "listing_too_large");
  }
  out.reserve(entries->size());
  for (const auto& e : *entries) {
    auto entry = decodeEntry(e);
    if (!entry.ok()) return entry.error();
    out.push_back(std::move(entry.value()));
  }
  return out;
}

Result<FileEntry> GuestOps::stat(const std::string& path, const std::string& user) {
  auto result = agent_->call("/filesystem.Filesystem/Stat", Json{{"path", path}}, asUser(user));
  if (!result.ok()) return result.error();
  return entryOf(result.value());
}

Result<FileEntry> GuestOps::makeDir(const std::string& path, const std::string& user) {
  auto result = agent_->call("/filesystem.Filesystem/MakeDir", Json{{"path", path}}, asUser(user));
  if (!result.ok()) return result.error();
  return entryOf(result.value());
}

Result<FileEntry> GuestOps::move(const std::string& source, const std::string& destination, const std::string& user) {
  auto result =
      agent_->call("/filesystem.Filesystem/Move", Json{{"source", source}, {"destination", destination}}, asUser(user));
  if (!result.ok()) return result.error();
  return entryOf(result.value());
}

Result<FileEntry> GuestOps::upload(const std::string& path, agentproto::AgentClient::UploadSource source,
                                   const std::string& user, const std::map<std::string, std::string>& metadata) {
  CallOptions options = asUser(user);
  options.metadata = metadata;
  options.timeout = kTransferTimeout;
  auto result = agent_->upload(path, std::move(source), options);
  if (!result.ok()) return result.error();
  // envd answers a list of the entries written; this agent writes one.
  if (result->is_array()) {
    if (result->empty()) return malformed("upload answer");
    return decodeEntry((*result)[0]);
  }
  return decodeEntry(result.value());
}

Status GuestOps::download(const std::string& path, agentproto::AgentClient::DownloadSink sink, const std::string& user,
                          std::optional<std::pair<uint64_t, uint64_t>> range) {
  CallOptions options = asUser(user);
  options.timeout = kTransferTimeout;
  if (range) {
    options.offset = range->first;
    options.length = range->second;
  }
  return agent_->download(path, std::move(sink), options);
}

}  // namespace space::guest
