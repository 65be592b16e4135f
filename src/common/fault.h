// Named crash points for crash-safety tests. Compiled into every build and inert unless the
// environment variable SPACE_FAULT names a point: reaching that point then kills the process
// with SIGKILL, exactly as `kill -9` would, so a test can stop spaced between two specific
// steps of an operation and check what recovery makes of it.
//   SPACE_FAULT=resume.recorded spaced ...   dies right after a resume is recorded
// Names are "<operation>.<step just completed>"; docs/architecture.md lists them.
#pragma once

#include <string_view>

namespace space {

void faultPoint(std::string_view name);

}  // namespace space
