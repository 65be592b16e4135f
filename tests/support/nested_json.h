// JSON arrays nested `depth` levels deep (the outermost is level 1), for tests of the bounds on
// what a peer may send. Built by moving, level by level: copying would make it quadratic.
#pragma once

#include <nlohmann/json.hpp>

namespace space::testsupport {

inline nlohmann::json nestedArrays(int depth) {
  nlohmann::json value = nlohmann::json::array();
  for (int i = 1; i < depth; ++i) {
    nlohmann::json outer = nlohmann::json::array();
    outer.push_back(std::move(value));
    value = std::move(outer);
  }
  return value;
}

}  // namespace space::testsupport
