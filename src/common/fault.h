// Named fault points for crash-safety and failure tests. Compiled into every build and inert
// unless the environment names a point:
//   SPACE_FAULT=resume.recorded        faultPoint("resume.recorded") kills the process with
//                                      SIGKILL, exactly as `kill -9` would, so a test can stop
//                                      spaced between two specific steps and check recovery;
//   SPACE_FAULT_DELAY=suspend.saved@3000
//                                      faultPoint("suspend.saved") sleeps 3000 ms each time it
//                                      is reached, so a test can make one step slow (a guest or
//                                      a disk that takes its time) and see what else waits;
//   SPACE_FAULT_FAIL=create.configured@3
//                                      faultFails("create.configured") is true the 3rd time it
//                                      is reached (@N omitted: the 1st), and the caller fails
//                                      that step as if it had gone wrong (e.g. one child of a
//                                      branch, to see the others rolled back).
//   SPACE_FAULT_THROW=resume.restored@2
//                                      faultPoint("resume.restored") throws std::bad_alloc the
//                                      2nd time it is reached (@N omitted: the 1st), so a test
//                                      can see what an exception leaves behind mid-operation.
// Names are "<operation>.<step just completed>"; docs/testing.md lists them.
#pragma once

#include <string_view>

namespace space {

void faultPoint(std::string_view name);
bool faultFails(std::string_view name);

}  // namespace space
