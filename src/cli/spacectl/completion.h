// spacectl completion bash: a bash completion script made from the command line's own
// definition (CLI11), so it never lists a command or option spacectl does not have.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace space::spacectl {

// Completes subcommands and their options at every level, and sandbox ids (from `spacectl ls`,
// with the same --api/--data-dir the line already has) for a word that starts with "sb_".
std::string bashCompletion(CLI::App& app);

}  // namespace space::spacectl
