// Process-wide logging set-up (spdlog): human lines by default, one JSON object per line for
// log collectors. Logs go to stderr so that a program's stdout stays its output.
#pragma once

#include <string>

#include "common/result.h"

namespace space {

Status initLogging(const std::string& level, bool json);

}  // namespace space
