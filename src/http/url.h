// Percent-encoding for request targets: the client encodes query values with urlEncode, the
// server decodes paths, path parameters and query strings with urlDecode.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "common/result.h"

namespace space::http {

// Encodes every byte but the unreserved ones (A-Z a-z 0-9 - . _ ~), so the result is safe as a
// query value or a path segment.
std::string urlEncode(std::string_view text);

// Decodes %XX escapes; '+' becomes a space only in query strings (plus_is_space), because in a
// path it is an ordinary character. A '%' not followed by two hex digits is an error rather
// than passed through, so two spellings never reach a handler as the same name.
Result<std::string> urlDecode(std::string_view text, bool plus_is_space);

// Splits "a=1&b=x%20y&flag" into decoded pairs ("flag" has an empty value); empty pieces are
// skipped. Repeated names keep their order.
Result<std::multimap<std::string, std::string>> parseQuery(std::string_view query);

}  // namespace space::http
