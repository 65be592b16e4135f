// The in-build stand-in for a fuzzer's mutator, shared by the tests that replay a fuzz entry
// point: each seed as it is, then `rounds` inputs made from seeds by a fixed pseudo-random
// sequence of byte edits, inserts, erases, truncations and splices. Deterministic for a given
// `seed`, so a failure reproduces.
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

namespace space::testsupport {

inline void replayMutations(const std::vector<std::string>& corpus, unsigned seed, int rounds,
                            const std::function<void(const std::string&)>& run) {
  for (const auto& s : corpus) run(s);
  if (corpus.empty()) return;
  std::mt19937 rng(seed);
  for (int round = 0; round < rounds; ++round) {
    std::string input = corpus[rng() % corpus.size()];
    int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 5) {
        case 0:
          if (!input.empty()) input[rng() % input.size()] = static_cast<char>(rng());
          break;
        case 1:
          input.insert(input.begin() + static_cast<long>(input.empty() ? 0 : rng() % input.size()),
                       static_cast<char>(rng()));
          break;
        case 2:
          if (!input.empty()) input.erase(rng() % input.size(), 1 + rng() % 4);
          break;
        case 3: input += corpus[rng() % corpus.size()]; break;
        case 4:
          if (!input.empty()) input.resize(rng() % input.size());
          break;
      }
    }
    run(input);
  }
}

}  // namespace space::testsupport
