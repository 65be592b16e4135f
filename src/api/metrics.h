// The few Prometheus metrics spaced exports, in the text exposition format (version 0.0.4).
// Hand-written rather than prometheus-cpp: Debian 12 does not package it, and three metric
// kinds with fixed labels take less code than wiring a library in.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace space::api {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double seconds);
  // Appends `name_bucket{le=...}`, `name_sum`, `name_count` lines (with `labels`, may be "").
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// A Prometheus label value with `\`, `"` and line feeds escaped, as the text format requires.
std::string labelValue(std::string_view value);

class Metrics {
 public:
  Metrics();
  Histogram create_seconds;  // POST /v1/sandboxes, successful
  Histogram exec_seconds;    // POST .../exec, until the command ended
  // Requests answered with an error, by stable error code.
  void countError(const std::string& code);
  void countRequest();

  // `gauges`: name -> (help, type, {labels -> value}) rendered before the histograms: gauges, and
  // counters read from elsewhere (a tap's byte counts).
  struct Gauge {
    std::string help;
    std::map<std::string, double> values;  // label text ("" for none) -> value
    std::string type = "gauge";            // or "counter" (its name ends in _total)
  };
  std::string render(const std::map<std::string, Gauge>& gauges) const;

 private:
  std::atomic<uint64_t> requests_{0};
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> errors_;
};

}  // namespace space::api
