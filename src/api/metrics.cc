#include "api/metrics.h"

#include <cstdio>

namespace space::api {

namespace {

std::string number(double v) {
  char buf[64];
  snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string withLabel(const std::string& labels, const std::string& extra) {
  if (labels.empty()) return "{" + extra + "}";
  return "{" + labels + "," + extra + "}";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double seconds) {
  std::lock_guard lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && seconds > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += seconds;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  std::lock_guard lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket" + withLabel(labels, "le=\"" + le + "\"") + " " + std::to_string(cumulative) + "\n";
  }
  std::string plain = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + plain + " " + number(sum_) + "\n";
  out += name + "_count" + plain + " " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : create_seconds({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      exec_seconds({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}) {}

void Metrics::countError(const std::string& code) {
  std::lock_guard lock(mu_);
  ++errors_[code];
}

void Metrics::countRequest() { ++requests_; }

std::string labelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char ch : value) {
    if (ch == '\\' || ch == '"') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else {
      out += ch;
    }
  }
  return out;
}

std::string Metrics::render(const std::map<std::string, Gauge>& gauges) const {
  std::string out;
  for (const auto& [name, gauge] : gauges) {
    out += "# HELP " + name + " " + gauge.help + "\n# TYPE " + name + " " + gauge.type + "\n";
    for (const auto& [labels, value] : gauge.values) {
      out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(value) + "\n";
    }
  }
  out += "# HELP space_api_requests_total HTTP requests handled.\n# TYPE space_api_requests_total counter\n";
  out += "space_api_requests_total " + std::to_string(requests_.load()) + "\n";
  out += "# HELP space_api_errors_total Requests answered with an error, by error code.\n";
  out += "# TYPE space_api_errors_total counter\n";
  {
    std::lock_guard lock(mu_);
    for (const auto& [code, n] : errors_) {
      out += "space_api_errors_total{code=\"" + code + "\"} " + std::to_string(n) + "\n";
    }
  }
  out += "# HELP space_sandbox_create_seconds Time to create a running sandbox.\n";
  out += "# TYPE space_sandbox_create_seconds histogram\n";
  create_seconds.render(out, "space_sandbox_create_seconds", "");
  out += "# HELP space_exec_seconds Time from an exec request to the command's end.\n";
  out += "# TYPE space_exec_seconds histogram\n";
  exec_seconds.render(out, "space_exec_seconds", "");
  return out;
}

}  // namespace space::api
