#include "cli/spacectl/completion.h"

#include <string>
#include <utility>
#include <vector>

namespace space::spacectl {

namespace {

// Every subcommand path (" snapshot create") with the words that may follow it.
void collect(CLI::App& app, const std::string& path, std::vector<std::pair<std::string, std::string>>& out) {
  std::string words;
  auto add = [&words](const std::string& w) { words += (words.empty() ? "" : " ") + w; };
  for (CLI::App* sub : app.get_subcommands([](CLI::App* a) { return !a->get_name().empty(); })) add(sub->get_name());
  for (const CLI::Option* opt : app.get_options()) {
    if (!opt->nonpositional() || opt->get_group().empty()) continue;  // hidden ones stay hidden
    for (const auto& name : opt->get_lnames()) add("--" + name);
    for (const auto& name : opt->get_snames()) add("-" + name);
  }
  out.emplace_back(path, words);
  for (CLI::App* sub : app.get_subcommands([](CLI::App* a) { return !a->get_name().empty(); })) {
    collect(*sub, path + " " + sub->get_name(), out);
  }
}

}  // namespace

std::string bashCompletion(CLI::App& app) {
  std::vector<std::pair<std::string, std::string>> paths;
  collect(app, "", paths);
  std::string known, cases;
  for (const auto& [path, words] : paths) {
    if (!path.empty()) known += "      \"" + path + "\") path=\"$next\" ;;\n";
    cases += "    \"" + path + "\") words=\"" + words + "\" ;;\n";
  }
  return "# bash completion for spacectl: source <(spacectl completion bash)\n"
         "_spacectl() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]} path='' next w i words='' daemon=()\n"
         "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
         "    w=${COMP_WORDS[i]}\n"
         "    case $w in\n"
         "      --api|--data-dir|--api-key-file) daemon+=(\"$w\" \"${COMP_WORDS[i+1]}\") ;;\n"
         "    esac\n"
         "    [[ $w == -* ]] && continue\n"
         "    next=\"$path $w\"\n"
         "    case $next in\n" +
         known +
         "    esac\n"
         "  done\n"
         "  if [[ $cur == sb_* ]]; then\n"
         "    words=$(\"${COMP_WORDS[0]}\" \"${daemon[@]}\" ls 2>/dev/null | awk 'NR > 1 { print $1 }')\n"
         "  else\n"
         "    case $path in\n" +
         cases +
         "    esac\n"
         "  fi\n"
         "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
         "}\n"
         "complete -F _spacectl spacectl\n";
}

}  // namespace space::spacectl
