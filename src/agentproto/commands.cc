#include "agentproto/commands.h"

#include <condition_variable>
#include <mutex>

#include "agentproto/base64.h"

namespace space::agentproto {

Json startRequest(const CommandSpec& spec) {
  Json process = Json::object();
  if (spec.argv.empty()) {
    process["cmd"] = "/bin/bash";
    process["args"] = Json::array({"-l", "-c", spec.command});
  } else {
    process["cmd"] = spec.argv[0];
    process["args"] = Json(std::vector<std::string>(spec.argv.begin() + 1, spec.argv.end()));
  }
  if (!spec.env.empty()) process["envs"] = spec.env;
  if (!spec.cwd.empty()) process["cwd"] = spec.cwd;
  Json req{{"process", process}, {"stdin", spec.stdin_data.has_value()}};
  if (!spec.tag.empty()) req["tag"] = spec.tag;
  if (spec.pty) req["pty"] = Json{{"size", {{"cols", spec.pty->first}, {"rows", spec.pty->second}}}};
  return req;
}

Result<ProcessEvent> decodeProcessEvent(const Json& message) {
  auto bad = [] { return makeError(ErrorCode::kUnavailable, "malformed process event from the agent"); };
  if (!message.is_object() || !message.contains("event") || !message["event"].is_object()) return bad();
  const Json& ev = message["event"];
  ProcessEvent out;
  if (ev.contains("start")) {
    const Json& s = ev["start"];
    if (!s.is_object() || !s.contains("pid") || !s["pid"].is_number_integer()) return bad();
    out.kind = ProcessEvent::Kind::kStart;
    out.pid = s["pid"].get<int>();
  } else if (ev.contains("data")) {
    const Json& d = ev["data"];
    if (!d.is_object()) return bad();
    for (auto [key, kind] :
         {std::pair{"stdout", ProcessEvent::Kind::kStdout}, std::pair{"stderr", ProcessEvent::Kind::kStderr},
          std::pair{"pty", ProcessEvent::Kind::kPty}}) {
      if (d.contains(key)) {
        if (!d[key].is_string()) return bad();
        auto bytes = base64Decode(d[key].get<std::string>());
        if (!bytes) return bad();
        out.kind = kind;
        out.data = std::move(*bytes);
        return out;
      }
    }
    return bad();
  } else if (ev.contains("end")) {
    const Json& e = ev["end"];
    if (!e.is_object()) return bad();
    out.kind = ProcessEvent::Kind::kEnd;
    if (e.contains("exitCode")) {
      if (!e["exitCode"].is_number_integer()) return bad();
      out.end.exit_code = e["exitCode"].get<int>();
    }
    out.end.exited = e.contains("exited") && e["exited"].is_boolean() && e["exited"].get<bool>();
    if (e.contains("status") && e["status"].is_string()) out.end.status = e["status"].get<std::string>();
  } else if (ev.contains("keepalive")) {
    out.kind = ProcessEvent::Kind::kKeepalive;
  }
  return out;
}

namespace {

// What the stream's callbacks fill in. They run on the client's I/O thread and may outlive
// runCommand's frame (it returns at its deadline or when abandoned, without waiting for the
// I/O thread to carry out the cancel), so they own this jointly with it.
struct CommandState {
  std::mutex m;
  std::condition_variable cv;
  CommandResult result;
  bool got_start = false;
  bool got_end = false;
  bool stream_over = false;
  std::optional<Error> failure;
};

void onProcessMessage(CommandState& state, size_t max_output, const Json& msg) {
  auto ev = decodeProcessEvent(msg);
  std::lock_guard<std::mutex> lock(state.m);
  if (!ev.ok()) {
    state.failure = ev.error();
    return;
  }
  CommandResult& result = state.result;
  switch (ev->kind) {
    case ProcessEvent::Kind::kStart:
      result.pid = ev->pid;
      state.got_start = true;
      state.cv.notify_all();
      break;
    case ProcessEvent::Kind::kStdout:
    case ProcessEvent::Kind::kPty:
    case ProcessEvent::Kind::kStderr: {
      std::string& sink = ev->kind == ProcessEvent::Kind::kStderr ? result.stderr_data : result.stdout_data;
      if (result.stdout_data.size() + result.stderr_data.size() + ev->data.size() > max_output) {
        state.failure =
            makeError(ErrorCode::kResourceExhausted, "command output exceeds " + std::to_string(max_output) + " bytes",
                      "output_too_large");
      } else {
        sink += ev->data;
      }
      break;
    }
    case ProcessEvent::Kind::kEnd:
      result.exit_code = ev->end.exit_code;
      result.exited = ev->end.exited;
      result.status = ev->end.status;
      state.got_end = true;
      break;
    default: break;
  }
}

}  // namespace

Result<CommandResult> runCommand(AgentClient& agent, const CommandSpec& spec, size_t max_output,
                                 const std::function<bool()>& abandon) {
  auto started = Clock::now();
  auto state = std::make_shared<CommandState>();
  CallOptions options;
  options.user = spec.user;
  options.timeout = spec.timeout;
  options.local_grace = std::chrono::seconds(5);
  auto stream = agent.stream(
      "/process.Process/Start", startRequest(spec), options,
      [state, max_output](const Json& msg) { onProcessMessage(*state, max_output, msg); },
      [state](const Status&) {
        std::lock_guard<std::mutex> lock(state->m);
        state->stream_over = true;
        state->cv.notify_all();
      });
  // Leaving early (deadline, abandoned, stdin failed) stops the stream; nothing here waits for
  // that, since the callbacks touch only `state`.
  struct CancelOnExit {
    std::shared_ptr<AgentStream> stream;
    ~CancelOnExit() {
      if (!stream->done()) stream->cancel();
    }
  } guard{stream};
  // A zero timeout means "no deadline", as for the stream itself.
  const auto wait_limit =
      spec.timeout.count() > 0 ? spec.timeout + std::chrono::seconds(5) : std::chrono::hours(24 * 100);
  if (spec.stdin_data) {
    int pid = 0;
    {
      std::unique_lock<std::mutex> lock(state->m);
      state->cv.wait_for(lock, wait_limit, [&] { return state->got_start || state->stream_over; });
      if (state->got_start) pid = state->result.pid;
    }
    if (pid != 0) {
      Json pid_sel{{"pid", pid}};
      if (!spec.stdin_data->empty()) {
        auto sent = agent.call("/process.Process/SendInput",
                               Json{{"process", pid_sel}, {"input", {{"stdin", base64Encode(*spec.stdin_data)}}}});
        if (!sent.ok()) return sent.error();
      }
      auto closed = agent.call("/process.Process/CloseStdin", Json{{"process", pid_sel}});
      if (!closed.ok()) return closed.error();
    }
  }
  const auto wait_until = Clock::now() + wait_limit;
  auto end = stream->wait(abandon ? std::chrono::milliseconds(1000) : wait_limit);
  while (abandon && !stream->done() && Clock::now() < wait_until) {
    if (abandon()) return makeError(ErrorCode::kCanceled, "abandoned while the command ran");
    end = stream->wait(std::chrono::milliseconds(1000));
  }
  // The stream may have ended between the last wait timing out and the done() check above.
  if (stream->done()) end = stream->wait(std::chrono::milliseconds(0));
  if (!end.ok()) return end.error();
  std::lock_guard<std::mutex> lock(state->m);
  if (state->failure) return *state->failure;
  if (!state->got_end) return makeError(ErrorCode::kUnavailable, "process stream ended without an end event");
  CommandResult result = std::move(state->result);
  result.duration = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  return result;
}

}  // namespace space::agentproto
