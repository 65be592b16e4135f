// spacectl: the command-line client of spaced's REST API (docs/openapi.json). One request per
// step, human tables by default and the API's own JSON with --json, so scripts get exactly what
// the API documents. This file is the command line (CLI11); the commands live in cli/spacectl/,
// one file per group, and talk to the daemon through apiclient.
//
// Exit codes: 0 on success; exec and run: the remote command's exit code, or 128+N when signal N
// ended it (as a shell reports it); 1 for an API, connection or local I/O failure (the message
// on stderr); 2 for usage errors; 128+N when signal N interrupted spacectl itself (Ctrl-C: 130).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "apiclient/api_client.h"
#include "cli/spacectl/completion.h"
#include "cli/spacectl/files.h"
#include "cli/spacectl/network.h"
#include "cli/spacectl/output.h"
#include "cli/spacectl/processes.h"
#include "cli/spacectl/quota.h"
#include "cli/spacectl/sandboxes.h"
#include "cli/spacectl/secrets.h"
#include "cli/spacectl/shell.h"
#include "cli/spacectl/signals.h"
#include "cli/spacectl/snapshots.h"
#include "cli/spacectl/top.h"

namespace {

using namespace space;
using namespace space::spacectl;
using apiclient::sandboxPath;
using apiclient::secretPath;
using apiclient::snapshotPath;

constexpr const char* kDescription =
    "spacectl: run commands in SPACE sandboxes (microVMs) through the spaced daemon's REST API.\n"
    "\n"
    "Examples:\n"
    "  spacectl run --rm -- uname -a                  one-off sandbox: create, run, delete\n"
    "  id=$(spacectl create --cpus 2 --memory 1024 --metadata owner=me)\n"
    "  spacectl exec $id -- 'cd /tmp && ls -la | head'   one argument: a shell command line\n"
    "  spacectl exec $id -- python3 -c 'print(1)'     several arguments: an argv, no shell\n"
    "  echo hello | spacectl exec --stdin $id -- cat\n"
    "  spacectl shell $id                             an interactive shell (exec -it $id -- top: a program)\n"
    "  spacectl top                                   CPU, memory and disk of every running sandbox\n"
    "  spacectl cp ./data.csv $id:/tmp/data.csv       upload; cp $id:/tmp/out.txt . downloads\n"
    "  spacectl ls --metadata owner=me --all\n"
    "  spacectl ls --json | jq -r '.sandboxes[].id'   --json: the API's JSON, for scripts\n"
    "  spacectl timeout $id 3600                      keep it for another hour\n"
    "  spacectl pause $id; spacectl resume $id        stop its vCPUs for a while, keep everything\n"
    "  snap=$(spacectl snapshot create $id --name warm)   save it as it is now (it keeps running)\n"
    "  spacectl branch $snap -n 4                     four sandboxes that start from that point\n"
    "  spacectl create --idle-suspend 600 --on-timeout suspend\n"
    "  spacectl rm $id\n"
    "\n"
    "The daemon: --api, env SPACE_API, else the url spaced wrote to <data-dir>/spaced.json, else\n"
    "http://127.0.0.1:8080 (https:// with --ca-file or SPACE_CA_FILE for a private CA). The key:\n"
    "--api-key-file, env SPACE_API_KEY, else <data-dir>/api-key.\n"
    "\n"
    "Exit codes: 0 ok; exec/run: the remote command's (128+N if signal N killed it);\n"
    "1 API or connection error; 2 usage error; 130 interrupted (Ctrl-C).\n";

// CLI11 validator: a usage error (exit 2) rather than a request the daemon would refuse.
const CLI::Validator kKeyValue(
    [](std::string& item) {
      auto eq = item.find('=');
      return eq == std::string::npos || eq == 0 ? "expected KEY=VALUE, got \"" + item + "\"" : std::string();
    },
    "KEY=VALUE");

const CLI::Range kSeconds(int64_t(1), int64_t(INT32_MAX));
constexpr int64_t kMaxIdleSuspendS = 30 * 24 * 3600;

// What every new sandbox may be given: create, run and branch.
void addNetworkOptions(CLI::App* sub, NetworkPolicyOptions& o) {
  sub->add_option("--egress", o.egress,
                  "network: allow (the internet, never private or metadata addresses), policy (only --allow) or "
                  "deny (nothing); default: the daemon's, or policy when --allow is given")
      ->check(CLI::IsMember({"allow", "deny", "policy"}));
  sub->add_option("--allow", o.allow,
                  "network: a domain (*.pypi.org), IPv4 address or CIDR, optional :port (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--deny", o.deny, "network: as --allow; beats it for every port and protocol (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--public-ports", o.public_ports,
                "network: serve the sandbox's ports (spacectl net url) to anyone, without a key or access token");
  sub->add_option("--credential", o.credentials,
                  "network: HOST=Header: value, where {{secret:NAME}} in the value is the secret NAME (spacectl "
                  "secret set), added by the gateway so the guest never holds it (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--credential-plain-http", o.credentials_plain_http,
                "network: --credential headers go over plain HTTP too (readable on the path; default TLS only)");
  sub->add_option("--placeholder", o.placeholders,
                  "network: ENV=SECRET: the guest's env var ENV holds a stand-in for secret SECRET, which the "
                  "gateway replaces with the value in headers to --credential hosts only (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
}

void addSettingsOptions(CLI::App* sub, SandboxSettings& o) {
  sub->add_option("--timeout", o.timeout_s,
                  "seconds until its timeout deletes it (or suspends it: --on-timeout; daemon default 300); "
                  "extend with `spacectl timeout`")
      ->check(kSeconds);
  sub->add_option("--idle-suspend", o.idle_suspend_s,
                  "suspend it after this many seconds without API, exec or file activity (0: never; daemon "
                  "default 21600 = 6 h); spacectl resume, exec or a file call resumes it")
      ->check(CLI::Range(int64_t(0), kMaxIdleSuspendS));
  sub->add_option("--on-timeout", o.on_timeout,
                  "what its timeout does: delete (default), or suspend: kept suspended (7 days by default), "
                  "its timeout starting again when resumed")
      ->check(CLI::IsMember({"delete", "suspend"}));
  sub->add_option("--env", o.env, "environment variable for every command in the sandbox (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  sub->add_option("--metadata", o.metadata, "label to find it by, e.g. owner=me (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  addNetworkOptions(sub, o.network);
}

void addCreateOptions(CLI::App* sub, CreateOptions& o) {
  auto* tpl = sub->add_option("--template", o.template_name, "sandbox template (daemon default: base)");
  sub->add_option("--snapshot", o.snapshot,
                  "start from this snapshot (snap_..., see spacectl snapshot) instead of a template: its disk, "
                  "memory and processes as they were, with the snapshot's template, CPUs and memory")
      ->excludes(tpl);
  sub->add_option("--cpus", o.cpus, "vCPUs (daemon default; with --snapshot: the snapshot's, or equal to it)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--memory", o.memory_mb,
                  "memory in MB (daemon default; with --snapshot: the snapshot's, or equal to it)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  addSettingsOptions(sub, o.settings);
}

void addExecOptions(CLI::App* sub, ExecOptions& o) {
  sub->add_option("--user", o.user, "user to run as (default: the sandbox's)");
  sub->add_option("--cwd", o.cwd, "working directory in the sandbox");
  sub->add_flag("-i,--stdin", o.send_stdin, "send this terminal's stdin (read to its end first) to the command");
  sub->add_option("command", o.command, "after --: one argument is a shell command line (bash -l -c), several an argv")
      ->required();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription, "spacectl"};
  app.require_subcommand(1);
  app.fallthrough();  // global options also after the subcommand: spacectl ls --api URL
  apiclient::EndpointFlags global;
  app.add_option("--api", global.api,
                 "daemon URL, e.g. http://127.0.0.1:8080 (env SPACE_API; default: <data-dir>/spaced.json)");
  app.add_option("--api-key-file", global.api_key_file,
                 "file holding the API key (env SPACE_API_KEY; default: <data-dir>/api-key)");
  std::string key_in_argv;
  app.add_option("--api-key", key_in_argv, "refused: use --api-key-file or SPACE_API_KEY")->group("");
  app.add_option("--data-dir", global.data_dir,
                 "spaced's data directory (env SPACE_DATA_DIR; default: /var/lib/space)");
  app.add_option("--ca-file", global.ca_file,
                 "for an https daemon: the CA certificates (PEM) its certificate must chain to (env SPACE_CA_FILE; "
                 "default: the certificate named in <data-dir>/spaced.json, else the system's trust store)");

  bool as_json = false;
  app.add_flag("--json", as_json, "print the API's JSON (one document) instead of text; also after the subcommand");
  std::vector<std::pair<CLI::App*, std::function<int(const apiclient::Client&)>>> commands;
  auto nested = [&](CLI::App* parent, const char* name, const char* help,
                    std::function<int(const apiclient::Client&)> run) {
    auto* sub = parent->add_subcommand(name, help);
    sub->add_flag("--json", as_json, "print the API's JSON (one document) instead of text");
    commands.emplace_back(sub, std::move(run));
    return sub;
  };
  auto command = [&](const char* name, const char* help, std::function<int(const apiclient::Client&)> run) {
    return nested(&app, name, help, std::move(run));
  };
  std::string id, user, from, to, signal = "SIGTERM";
  std::vector<std::string> ids;
  int pid = 0;
  int64_t seconds = 0, tail_bytes = 0;
  bool remove = false;
  CreateOptions create;
  ListOptions list;
  ExecOptions exec;
  SnapshotOptions snapshot;
  SnapshotListOptions snapshot_list;
  BranchOptions branch;

  auto* c_create = command("create", "create a sandbox and print its id",
                           [&](const apiclient::Client& api) { return cmdCreate(api, create, as_json); });
  addCreateOptions(c_create, create);

  auto* c_ls =
      command("ls", "list sandboxes", [&](const apiclient::Client& api) { return cmdList(api, list, as_json); });
  c_ls->add_option(
          "--state", list.states,
          "only these states (comma-separated or repeated): creating, running, paused, suspended, failed, deleted")
      ->delimiter(',')
      ->allow_extra_args(false);
  c_ls->add_option("--metadata", list.metadata, "only sandboxes with this label (repeatable: all must match)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  c_ls->add_option("--limit", list.limit, "sandboxes per page (1..1000)")->check(CLI::Range(1, 1000));
  c_ls->add_flag("--all", list.all, "follow next_cursor through every page");

  auto* c_get =
      command("get", "show one sandbox", [&](const apiclient::Client& api) { return cmdGet(api, id, as_json); });
  c_get->add_option("id", id, "sandbox id")->required();

  auto* c_rm = command("rm", "delete sandboxes (exit 1 if any could not be deleted)",
                       [&](const apiclient::Client& api) { return cmdRemove(api, ids, sandboxPath, as_json); });
  c_rm->add_option("ids", ids, "sandbox ids")->required();

  auto* c_exec =
      command("exec", "run a command in a sandbox, its output streamed as it runs", [&](const apiclient::Client& api) {
        if (!exec.tty) return cmdExec(api, id, exec, as_json);
        if (!exec.env.empty() || exec.timeout_s >= 0) {
          return fail("exec --tty: --env and --timeout apply to exec without a terminal");
        }
        return cmdShell(api, id, ShellOptions{exec.user, exec.cwd, exec.command});
      });
  c_exec->add_option("id", id, "sandbox id")->required();
  c_exec->add_option("--env", exec.env, "environment variable for the command (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  c_exec->add_option("--timeout", exec.timeout_s, "seconds the command may run (daemon default 60; 0: no limit)")
      ->check(CLI::Range(int64_t(0), int64_t(24 * 3600)));
  addExecOptions(c_exec, exec);
  c_exec->add_flag("-t,--tty", exec.tty, "run it on a terminal attached to this one (as spacectl shell does)");
  c_exec->footer(
      "Example: spacectl exec sb_x --cwd /tmp -- ls -la\n         spacectl exec -it sb_x -- htop\n"
      "Ctrl-C passes SIGINT on; a second one detaches (with -t, Ctrl-C goes to the terminal).");

  TopOptions top;
  auto* c_top = command("top",
                        "show what running sandboxes cost the host (CPU, memory, disk, network bytes out/in) and what "
                        "their guests say they use (memory, root filesystem), every 5 s",
                        [&](const apiclient::Client& api) { return cmdTop(api, top, as_json); });
  c_top->add_option("ids", top.ids, "sandbox ids (default: every running sandbox)");
  c_top->add_flag("--once", top.once, "print one refresh and exit");
  c_top->add_option("--interval", top.interval_s, "seconds between refreshes")->check(CLI::Range(1, 3600));
  c_top->footer("Examples: spacectl top\n          spacectl top --once --json sb_x | jq '.sandboxes[0].metrics'");

  command("quota", "show what your tenant may hold on the node (sandboxes, vCPUs, memory, snapshots) and what it holds",
          [&](const apiclient::Client& api) { return cmdQuota(api, as_json); })
      ->footer("Limits are the operator's (spaced tenant quota, or spaced's --tenant-max-* defaults); none: no limit.");

  ShellOptions shell;
  auto* c_shell = command("shell", "attach this terminal to a shell (or a command) on a terminal in a sandbox",
                          [&](const apiclient::Client& api) { return cmdShell(api, id, shell); });
  c_shell->add_option("id", id, "sandbox id")->required();
  c_shell->add_option("--user", shell.user, "user to run as (default: the sandbox's)");
  c_shell->add_option("--cwd", shell.cwd, "working directory in the sandbox");
  c_shell->add_option("command", shell.command,
                      "after --: one argument is a shell command line, several an argv (default: a login shell)");
  c_shell->footer(
      "Examples: spacectl shell sb_x\n          spacectl shell sb_x -- top\n"
      "Keys go to the sandbox as typed (Ctrl-C included); the session ends when the shell exits, with its "
      "exit code.\nThe window size follows this terminal's; TERM is passed on.");

  auto* c_run = command("run", "create a sandbox and run a command in it (--rm: delete it afterwards)",
                        [&](const apiclient::Client& api) { return cmdRun(api, create, exec, remove, as_json); });
  c_run->add_flag("--rm", remove, "delete the sandbox when the command ends, fails or is interrupted");
  addCreateOptions(c_run, create);
  c_run
      ->add_option("--exec-timeout", exec.timeout_s,
                   "seconds the command may run (default: no limit but the sandbox's own --timeout)")
      ->check(CLI::Range(int64_t(0), int64_t(24 * 3600)));
  addExecOptions(c_run, exec);
  c_run->footer("Example: spacectl run --rm --cpus 2 -- 'nproc && free -m'\nWithout --rm the id goes to stderr.");

  auto* c_cp = command("cp", "copy a file into or out of a sandbox (ID:/path on one side; - for stdin/stdout)",
                       [&](const apiclient::Client& api) { return cmdCopy(api, from, to, user, as_json); });
  c_cp->add_option("src", from, "source: a local file, -, or ID:/path")->required();
  c_cp->add_option("dst", to, "destination: a local file or directory, -, or ID:/path (ending in / keeps the name)")
      ->required();
  c_cp->add_option("--user", user, "owner of the file in the sandbox (default: the sandbox's user)");
  c_cp->footer("Examples: spacectl cp app.tar.gz sb_x:/tmp/\n          spacectl cp sb_x:/var/log/app.log - | less");

  auto* c_logs = command("logs", "print a sandbox's console (kernel and boot) log",
                         [&](const apiclient::Client& api) { return cmdLogs(api, id, tail_bytes, as_json); });
  c_logs->add_option("id", id, "sandbox id")->required();
  c_logs->add_option("--tail-bytes", tail_bytes, "only the last N bytes (daemon default 64 KiB)")
      ->check(CLI::Range(int64_t(1), int64_t(INT32_MAX)));

  auto* c_timeout =
      command("timeout", "set a sandbox's timeout to SECONDS from now (it then is deleted, or suspended: --on-timeout)",
              [&](const apiclient::Client& api) { return cmdTimeout(api, id, seconds, as_json); });
  c_timeout->add_option("id", id, "sandbox id")->required();
  c_timeout->add_option("seconds", seconds, "seconds from now")->required()->check(kSeconds);

  auto* c_snapshot = app.add_subcommand(
      "snapshot", "save a sandbox as it is now (disk, memory, processes), list and delete the snapshots");
  c_snapshot->add_flag("--json", as_json, "print the API's JSON (one document) instead of text");
  c_snapshot->require_subcommand(1);
  c_snapshot->footer(
      "A snapshot starts new sandboxes: spacectl branch SNAP_ID (several at once) or spacectl create --snapshot.\n"
      "They share its disk copy-on-write, so each sees its own writes only.");

  auto* c_snap_create =
      nested(c_snapshot, "create", "snapshot a running or paused sandbox (it stays so) and print the snapshot's id",
             [&](const apiclient::Client& api) { return cmdSnapshotCreate(api, id, snapshot, as_json); });
  c_snap_create->add_option("id", id, "sandbox id")->required();
  c_snap_create->add_option("--name", snapshot.name, "a name to recognise it by (at most 128 characters)");
  c_snap_create->add_option("--metadata", snapshot.metadata, "label, e.g. stage=warm (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  c_snap_create->footer("Example: snap=$(spacectl snapshot create sb_x --name deps-installed)");

  auto* c_snap_ls = nested(c_snapshot, "ls", "list snapshots, oldest first",
                           [&](const apiclient::Client& api) { return cmdSnapshotList(api, snapshot_list, as_json); });
  c_snap_ls->add_option("--sandbox", snapshot_list.sandbox_id, "only the snapshots of this sandbox");
  c_snap_ls->add_option("--limit", snapshot_list.limit, "snapshots per page (1..1000, daemon default 100)")
      ->check(CLI::Range(1, 1000));
  c_snap_ls->add_flag("--all", snapshot_list.all, "follow next_cursor through every page");

  auto* c_snap_get = nested(c_snapshot, "get", "show one snapshot",
                            [&](const apiclient::Client& api) { return cmdSnapshotGet(api, id, as_json); });
  c_snap_get->add_option("id", id, "snapshot id (snap_...)")->required();

  auto* c_snap_rm = nested(c_snapshot, "rm",
                           "delete snapshots; sandboxes started from them keep working (exit 1 if any could not be "
                           "deleted)",
                           [&](const apiclient::Client& api) { return cmdRemove(api, ids, snapshotPath, as_json); });
  c_snap_rm->add_option("ids", ids, "snapshot ids")->required();

  std::vector<std::string> names;
  std::string secret_file;
  auto* c_secret = app.add_subcommand(
      "secret", "keep API tokens that sandboxes' gateways add to their requests (the guest never holds them)");
  c_secret->add_flag("--json", as_json, "print the API's JSON (one document) instead of text");
  c_secret->require_subcommand(1);
  c_secret->footer(
      "A value is read from stdin or --from-file, never from the command line, and is never shown again.\n"
      "Examples: printf %s \"$GH_TOKEN\" | spacectl secret set gh\n"
      "          spacectl secret set openai --from-file ~/.config/openai.key");
  auto* c_secret_set = nested(
      c_secret, "set", "create a secret or rotate its value (sandboxes use the new value from their next request)",
      [&](const apiclient::Client& api) { return cmdSecretSet(api, id, secret_file, as_json); });
  c_secret_set->add_option("name", id, "the secret's name: 1-64 of A-Z a-z 0-9 _ . -")->required();
  c_secret_set->add_option("--from-file", secret_file,
                           "read the value from this file (default: stdin; typed without echo on a terminal); one "
                           "trailing newline is dropped");
  nested(c_secret, "ls", "list the secrets' names and versions (never their values)",
         [&](const apiclient::Client& api) { return cmdSecretList(api, as_json); });
  auto* c_secret_rm = nested(c_secret, "rm", "delete secrets (exit 1 if any could not be deleted)",
                             [&](const apiclient::Client& api) { return cmdRemove(api, names, secretPath, as_json); });
  c_secret_rm->add_option("names", names, "secret names")->required();

  auto* c_branch = command("branch", "start sandboxes from a snapshot, all or none, and print their ids (one per line)",
                           [&](const apiclient::Client& api) { return cmdBranch(api, id, branch, as_json); });
  c_branch->add_option("id", id, "snapshot id (snap_...)")->required();
  c_branch->add_option("-n,--count", branch.count, "how many sandboxes (at most 64, or spaced's --max-branch)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  addSettingsOptions(c_branch, branch.settings);
  c_branch->footer(
      "Each sandbox continues from the snapshot with its own copy-on-write disk (a write in one is invisible\n"
      "to the others), hostname, clock and fresh randomness; CPUs and memory are the snapshot's.\n"
      "If one fails to start, the others are deleted and the error is reported.\n"
      "Example: spacectl branch snap_x -n 8 --timeout 600 --metadata run=7");

  auto* c_pause = command("pause", "pause a sandbox: its vCPUs stop, memory stays (resume with spacectl resume)",
                          [&](const apiclient::Client& api) { return cmdRunState(api, id, "pause", as_json); });
  c_pause->add_option("id", id, "sandbox id")->required();
  auto* c_suspend = command("suspend", "suspend a sandbox: its memory and state go to disk, its VM exits",
                            [&](const apiclient::Client& api) { return cmdRunState(api, id, "suspend", as_json); });
  c_suspend->add_option("id", id, "sandbox id")->required();
  auto* c_resume =
      command("resume", "resume a paused or suspended sandbox (one its timeout suspended gets the timeout again)",
              [&](const apiclient::Client& api) { return cmdRunState(api, id, "resume", as_json); });
  c_resume->add_option("id", id, "sandbox id")->required();

  auto* c_ps = command("ps", "list the processes running in a sandbox",
                       [&](const apiclient::Client& api) { return cmdProcesses(api, id, as_json); });
  c_ps->add_option("id", id, "sandbox id")->required();

  auto* c_kill = command("kill", "send a signal to a process in a sandbox",
                         [&](const apiclient::Client& api) { return cmdKill(api, id, pid, signal, as_json); });
  c_kill->add_option("id", id, "sandbox id")->required();
  c_kill->add_option("pid", pid, "process id (see spacectl ps)")->required()->check(CLI::Range(1, 4194304));
  c_kill
      ->add_option("--signal,-s", signal,
                   "SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP, SIGCONT")
      ->capture_default_str();

  auto* c_net =
      app.add_subcommand("net", "a sandbox's network: its egress policy and the log of its gateway's decisions");
  c_net->add_flag("--json", as_json, "print the API's JSON (one document) instead of text");
  c_net->require_subcommand(1);
  c_net->footer(
      "Example: spacectl net set sb_x --allow '*.pypi.org' --allow github.com:443\n         spacectl net log sb_x\n"
      "         curl -H \"X-Space-Access-Token: $TOKEN\" $(spacectl net url sb_x 8080 | head -1)");
  NetworkPolicyOptions net_policy;
  auto* c_net_show = nested(c_net, "show", "print a sandbox's egress policy",
                            [&](const apiclient::Client& api) { return cmdNetworkShow(api, id, as_json); });
  c_net_show->add_option("id", id, "sandbox id")->required();
  auto* c_net_set = nested(c_net, "set", "replace a sandbox's egress policy (applies to its next connection)",
                           [&](const apiclient::Client& api) { return cmdNetworkSet(api, id, net_policy, as_json); });
  c_net_set->add_option("id", id, "sandbox id")->required();
  addNetworkOptions(c_net_set, net_policy);
  NetworkLogOptions net_log;
  auto* c_net_log = nested(c_net, "log", "print the gateway's decisions for a sandbox, oldest first",
                           [&](const apiclient::Client& api) { return cmdNetworkLog(api, id, net_log, as_json); });
  c_net_log->add_option("id", id, "sandbox id")->required();
  c_net_log->add_option("--limit", net_log.limit, "only the newest N entries (1..10000, daemon default 1000)")
      ->check(CLI::Range(1, 10000));
  c_net_log->add_flag("--denied", net_log.denied, "only denials");
  c_net_log->add_option("--kind", net_log.kind, "only dns, tcp or gateway entries")
      ->check(CLI::IsMember({"dns", "tcp", "gateway"}));
  c_net_log->add_flag("-f,--follow", net_log.follow,
                      "keep printing new entries as the gateway writes them (--json: one JSON line each), until "
                      "Ctrl-C");

  std::string completion_shell;
  auto* c_completion =
      app.add_subcommand("completion", "print a shell completion script (commands, options, sandbox ids)");
  c_completion->add_option("shell", completion_shell, "the shell: bash")->required()->check(CLI::IsMember({"bash"}));
  c_completion->footer(
      "Example: source <(spacectl completion bash)\n"
      "         spacectl completion bash > /etc/bash_completion.d/spacectl");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  if (c_completion->parsed()) {  // needs no daemon
    std::cout << bashCompletion(app);
    return 0;
  }
  if (!key_in_argv.empty()) {
    std::cerr << "spacectl: --api-key is refused: every local user reads a process's arguments in /proc/*/cmdline. "
                 "Pass --api-key-file FILE or set SPACE_API_KEY\n";
    return kExitUsage;
  }

  auto endpoint = apiclient::resolveEndpoint(global);
  if (!endpoint.ok()) return fail(endpoint.error());
  auto api = apiclient::Client::create(std::move(endpoint.value()));
  if (!api.ok()) {
    std::cerr << "spacectl: " << api.error().message << "\n";
    return kExitUsage;
  }
  startSignalThread();
  for (const auto& [sub, run] : commands) {
    if (sub->parsed()) return run(*api);
  }
  return kExitUsage;
}