#include "common/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

namespace space {

namespace {

// %Q: the message as a JSON string literal (quoted and escaped), for the JSON log pattern.
class JsonMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    std::string quoted = nlohmann::json(std::string(msg.payload.data(), msg.payload.size()))
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    dest.append(quoted.data(), quoted.data() + quoted.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessageFlag>(); }
};

// %V: the message with control characters and every non-ASCII byte written as \xNN. Messages
// quote what guests and clients send (file names, agent errors, console lines); a newline, a
// terminal escape, a UTF-8 C1 control (CSI, OSC) or a bidi override in them must not forge a
// log line, drive the reader's terminal or disguise what it shows.
class EscapedMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      auto byte = static_cast<unsigned char>(c);
      if (byte < 0x20 || byte >= 0x7f) {
        const char escaped[4] = {'\\', 'x', kHex[byte >> 4], kHex[byte & 0xf]};
        dest.append(escaped, escaped + 4);
      } else {
        dest.push_back(c);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<EscapedMessageFlag>(); }
};

}  // namespace

Status initLogging(const std::string& level, bool json) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return makeError(ErrorCode::kInvalidArgument,
                     "unknown log level \"" + level + "\" (trace, debug, info, warn, error, off)");
  }
  auto logger = spdlog::get("space");
  if (!logger) logger = spdlog::stderr_color_mt("space");
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  if (json) {
    formatter->add_flag<JsonMessageFlag>('Q').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","pid":%P,"msg":%Q})");
  } else {
    formatter->add_flag<EscapedMessageFlag>('V').set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ %V");
  }
  logger->set_formatter(std::move(formatter));
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return okStatus();
}

}  // namespace space
