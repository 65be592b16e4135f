#include "http/router.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "http/url.h"

namespace space::http {

namespace {

[[noreturn]] void badRoute(const std::string& method, const std::string& pattern, const char* why) {
  std::fprintf(stderr, "http::Router: route %s %s: %s\n", method.c_str(), pattern.c_str(), why);
  std::abort();
}

std::vector<std::string_view> splitPath(std::string_view path) {
  std::vector<std::string_view> segments;
  path.remove_prefix(1);
  while (true) {
    size_t slash = path.find('/');
    segments.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) return segments;
    path.remove_prefix(slash + 1);
  }
}

}  // namespace

void Router::add(std::string method, std::string pattern, Handler handler) {
  if (method.empty()) badRoute(method, pattern, "no method");
  if (pattern.empty() || pattern[0] != '/') badRoute(method, pattern, "the pattern must start with '/'");
  for (const Route& route : routes_) {
    if (route.method == method && route.pattern == pattern) badRoute(method, pattern, "added twice");
  }
  Route route{method, pattern, {}, std::move(handler)};
  std::set<std::string_view> names;
  for (std::string_view segment : splitPath(pattern)) {
    bool is_param = segment.size() >= 2 && segment.front() == '{' && segment.back() == '}';
    std::string_view text = is_param ? segment.substr(1, segment.size() - 2) : segment;
    if (text.find_first_of("{}") != std::string_view::npos) badRoute(method, pattern, "misplaced '{' or '}'");
    if (is_param && text.empty()) badRoute(method, pattern, "a parameter without a name");
    if (is_param && !names.insert(text).second) badRoute(method, pattern, "a parameter name used twice");
    route.segments.push_back(Segment{is_param, std::string(text)});
  }
  routes_.push_back(std::move(route));
}

Router::Match Router::match(std::string_view method, std::string_view raw_path) const {
  Match result;
  if (raw_path.empty() || raw_path[0] != '/') return result;
  std::vector<std::string> segments;
  for (std::string_view raw : splitPath(raw_path)) {
    auto decoded = urlDecode(raw, false);
    if (!decoded.ok()) return result;
    segments.push_back(std::move(decoded.value()));
  }

  auto matches = [&](const Route& route) {
    if (route.segments.size() != segments.size()) return false;
    for (size_t i = 0; i < segments.size(); ++i) {
      const Segment& want = route.segments[i];
      if (want.is_param) {
        if (segments[i].empty() || segments[i].find('/') != std::string::npos) return false;
      } else if (want.text != segments[i]) {
        return false;
      }
    }
    return true;
  };
  // Literal beats parameter at the first segment where two patterns differ.
  auto more_specific = [](const Route& a, const Route& b) {
    for (size_t i = 0; i < a.segments.size(); ++i) {
      if (a.segments[i].is_param != b.segments[i].is_param) return !a.segments[i].is_param;
    }
    return false;
  };

  const Route* best = nullptr;
  std::set<std::string> allowed;
  for (const Route& route : routes_) {
    if (!matches(route)) continue;
    allowed.insert(route.method);
    if (route.method == method && (best == nullptr || more_specific(route, *best))) best = &route;
  }
  if (best != nullptr) {
    result.kind = Match::Kind::kFound;
    result.handler = &best->handler;
    result.pattern = best->pattern;
    for (size_t i = 0; i < segments.size(); ++i) {
      if (best->segments[i].is_param) result.params.emplace(best->segments[i].text, std::move(segments[i]));
    }
  } else if (!allowed.empty()) {
    result.kind = Match::Kind::kMethodNotAllowed;
    result.allowed.assign(allowed.begin(), allowed.end());
  }
  return result;
}

std::vector<std::pair<std::string, std::string>> Router::routes() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Route& route : routes_) out.emplace_back(route.method, route.pattern);
  return out;
}

void Router::dispatch(Request& request, Response& response) const {
  Match found = match(request.method(), request.rawPath());
  switch (found.kind) {
    case Match::Kind::kFound:
      request.setPathParams(std::move(found.params));
      (*found.handler)(request, response);
      return;
    case Match::Kind::kNotFound:
      (void)response.sendError(404, errorCodeName(ErrorCode::kNotFound),
                               "no route for " + request.method() + " " + request.path());
      return;
    case Match::Kind::kMethodNotAllowed: {
      std::string allowed;
      for (const std::string& method : found.allowed) allowed += (allowed.empty() ? "" : ", ") + method;
      response.setHeader("Allow", allowed);
      (void)response.sendError(
          405, errorCodeName(ErrorCode::kUnimplemented),
          "method " + request.method() + " is not allowed on " + request.path() + " (allowed: " + allowed + ")");
      return;
    }
  }
}

Handler Router::handler() const {
  return [this](Request& request, Response& response) { dispatch(request, response); };
}

}  // namespace space::http
