// `spacectl quota`: what the caller's tenant may hold on the node, and what it holds now.
#pragma once

#include "apiclient/api_client.h"

namespace space::spacectl {

int cmdQuota(const apiclient::Client& api, bool as_json);

}  // namespace space::spacectl
