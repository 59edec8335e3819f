// Metrics files: one row per iteration (every iteration, whatever log.interval), CSV (header
// line) or JSON lines, chosen by the file extension (.jsonl/.json -> JSON lines, anything else
// CSV). Written by one rank.
// On resume from iteration k, rows of the same file with iteration > k (iterations the interrupted
// run did after its last checkpoint, which the resumed run repeats) move to a sibling file,
// <name>.superseded.<ext>, so that the file reads as one uninterrupted run and no row is lost.
// The file is rewritten through a temporary file and a rename: a crash leaves the old one whole.
// A run from scratch replaces an existing file only when asked to (train/output_checks.hpp).
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace trident {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // columns: names in order; resume_iteration >= 0 keeps existing rows up to it.
  MetricsWriter(const std::string& path, std::vector<std::string> columns, std::int64_t resume_iteration);
  bool active() const { return out_.is_open(); }
  // values in column order; the first column is the iteration.
  void write(const std::vector<double>& values);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> columns_;
  bool json_ = false;
  std::ofstream out_;
};

// "metrics.csv" -> "metrics.eval.csv" (the evaluation rows of the same run)
std::string sibling_metrics_path(const std::string& path, const std::string& tag);

}  // namespace trident
