// MetricsWriter (docs/DESIGN.md "Metrics"): JSON lines for .jsonl / .json, otherwise CSV with a
// header line; integral values are written as integers, others with 17 significant digits, NaN as
// nan (CSV) or null (JSON); every row is flushed as written. On resume the file is rewritten
// through <path>.tmp and a rename with the rows up to the resume iteration, and the later rows are
// appended to the sibling <stem>.superseded.<ext> (sibling_metrics_path), never dropped.
#include "io/metrics.hpp"

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "common/error.hpp"

namespace trident {

namespace {
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
std::string num(double v) {
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    os << static_cast<long long>(v);
  else  // 17 significant digits: the double round-trips, so equal text means equal bits
    os << std::setprecision(17) << v;
  return os.str();
}
// iteration of a kept line (first CSV field, or "iteration" of a JSON line); -1 if unknown
double line_iteration(const std::string& line, bool json) {
  if (json) {
    auto p = line.find("\"iteration\":");
    if (p == std::string::npos) return -1;
    return std::strtod(line.c_str() + p + 12, nullptr);
  }
  return std::strtod(line.c_str(), nullptr);
}
}  // namespace

std::string sibling_metrics_path(const std::string& path, const std::string& tag) {
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + "." + tag;
  return path.substr(0, dot) + "." + tag + path.substr(dot);
}

MetricsWriter::MetricsWriter(const std::string& path, std::vector<std::string> columns, std::int64_t resume_iteration)
    : path_(path), columns_(std::move(columns)) {
  json_ = ends_with(path, ".jsonl") || ends_with(path, ".json");
  std::string header;
  for (size_t i = 0; i < columns_.size(); ++i) header += (i ? "," : "") + columns_[i];
  std::vector<std::string> kept, superseded;  // existing lines up to / after resume_iteration
  if (resume_iteration >= 0) {
    std::ifstream in(path);
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
      if (!json_ && first) {
        first = false;
        continue;  // header
      }
      first = false;
      if (line.empty()) continue;
      (line_iteration(line, json_) <= static_cast<double>(resume_iteration) ? kept : superseded).push_back(line);
    }
  }
  if (!superseded.empty()) {  // kept beside the file, never dropped
    const std::string side = sibling_metrics_path(path, "superseded");
    std::ifstream probe(side);
    const bool fresh_side = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
    std::ofstream s(side, std::ios::app);
    if (!json_ && fresh_side) s << header << "\n";
    for (const auto& l : superseded) s << l << "\n";
    s.flush();
    TRIDENT_REQUIRE(s.good(), "log.metrics_file: cannot write '" << side << "'");
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream t(tmp, std::ios::trunc);
    if (!json_) t << header << "\n";
    for (const auto& l : kept) t << l << "\n";
    t.flush();
    TRIDENT_REQUIRE(t.good(), "log.metrics_file: cannot write '" << tmp << "'");
  }
  TRIDENT_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0, "log.metrics_file: cannot replace '" << path << "'");
  out_.open(path, std::ios::app);
  TRIDENT_REQUIRE(out_.good(), "log.metrics_file: cannot write '" << path << "'");
}

void MetricsWriter::write(const std::vector<double>& values) {
  if (!out_.is_open()) return;
  if (json_) {
    out_ << "{";
    for (size_t i = 0; i < columns_.size() && i < values.size(); ++i)
      out_ << (i ? ", " : "") << "\"" << columns_[i] << "\": " << (std::isnan(values[i]) ? "null" : num(values[i]));
    out_ << "}\n";
  } else {
    for (size_t i = 0; i < columns_.size() && i < values.size(); ++i) out_ << (i ? "," : "") << num(values[i]);
    out_ << "\n";
  }
  out_.flush();
}

}  // namespace trident
