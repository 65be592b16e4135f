// Secret commands: `spacectl secret set|ls|rm`. A value is read from stdin or a file, never
// from argv (where `ps` and shell history would show it), and never printed.
#pragma once

#include <string>

#include "apiclient/api_client.h"

namespace space::spacectl {

// Creates or rotates NAME with the value from `from_file` ("" or "-": stdin; on a terminal the
// value is typed without echo). One trailing newline is dropped.
int cmdSecretSet(const apiclient::Client& api, const std::string& name, const std::string& from_file, bool as_json);
int cmdSecretList(const apiclient::Client& api, bool as_json);

}  // namespace space::spacectl
