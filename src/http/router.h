// Maps (method, path) to handlers. A pattern is a path whose segments are literals or {name}
// parameters ("/v1/sandboxes/{id}/files/list"). A parameter matches one non-empty segment,
// percent-decoded, that does not decode to something containing '/'. When several patterns
// match, the one with a literal where the others have a parameter (first difference from the
// left) wins, so "/v1/sandboxes/search" can sit next to "/v1/sandboxes/{id}".
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http/message.h"

namespace space::http {

class Router {
 public:
  // A malformed pattern or a duplicate (method, pattern) is a programming error and aborts.
  void add(std::string method, std::string pattern, Handler handler);

  struct Match {
    enum class Kind { kFound, kNotFound, kMethodNotAllowed };
    Kind kind = Kind::kNotFound;
    const Handler* handler = nullptr;                        // kFound: owned by the router
    std::string pattern;                                     // kFound
    std::map<std::string, std::string, std::less<>> params;  // kFound
    std::vector<std::string> allowed;                        // kMethodNotAllowed: the methods the path has, sorted
  };
  // `raw_path` is the path as sent, still percent-encoded, without the query
  // (Request::rawPath()): decoding happens per segment.
  Match match(std::string_view method, std::string_view raw_path) const;

  // Every (method, pattern), in the order added.
  std::vector<std::pair<std::string, std::string>> routes() const;

  // Runs the matching handler with the path parameters set, or answers 404, or 405 with an
  // Allow header, as errorBody JSON.
  void dispatch(Request& request, Response& response) const;
  // dispatch() as a Server handler; the router must outlive the server.
  Handler handler() const;

 private:
  struct Segment {
    bool is_param;
    std::string text;  // the literal, or the parameter's name
  };
  struct Route {
    std::string method;
    std::string pattern;
    std::vector<Segment> segments;
    Handler handler;
  };

  std::vector<Route> routes_;
};

}  // namespace space::http
