// libFuzzer harness: the JSON-lines reader of preprocess_data. The input is written to a file
// and split into 1, 2 and 3 consecutive byte ranges (cut points taken from the input): the lines
// of the ranges, in order, must be exactly the lines of the whole file (each line belongs to the
// range holding its first byte: the split of the input over MPI ranks). Every line's record is
// read; a bad one throws trident::Error, nothing else.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "data/jsonl.hpp"

namespace {
std::string file_path() {
  static const std::string p = "/tmp/trident_fuzz_jsonl_" + std::to_string(::getpid());
  return p;
}

std::vector<std::pair<std::string, std::int64_t>> lines(std::int64_t begin, std::int64_t end) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  trident::for_each_line_in_range(file_path(), begin, end, [&](std::string_view l, std::int64_t at, std::int64_t) {
    out.emplace_back(std::string(l), at);
  });
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  {
    std::FILE* f = std::fopen(file_path().c_str(), "wb");
    if (!f) std::abort();
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  const auto n = static_cast<std::int64_t>(size);
  const auto whole = lines(0, n);
  for (int parts = 2; parts <= 3; ++parts) {
    std::vector<std::int64_t> cut{0};
    for (int k = 1; k < parts; ++k) {
      const std::int64_t c = n ? (data[(k * 7) % size] * n / 256 + k) % (n + 1) : 0;
      cut.push_back(std::max(cut.back(), c));
    }
    cut.push_back(n);
    std::vector<std::pair<std::string, std::int64_t>> joined;
    for (int k = 0; k < parts; ++k)
      for (auto& l : lines(cut[k], cut[k + 1])) joined.push_back(std::move(l));
    if (joined != whole) {
      std::fprintf(stderr, "%d ranges give %zu lines, the whole file %zu\n", parts, joined.size(), whole.size());
      std::abort();
    }
  }
  std::string text;
  for (const auto& l : whole) {
    try {
      (void)trident::jsonl_text(l.first, "text", text);
    } catch (const trident::Error&) {
    }
  }
  return 0;
}
