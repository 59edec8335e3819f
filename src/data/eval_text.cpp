#include "data/eval_text.hpp"

#include <hdf5.h>

#include <filesystem>
#include <string_view>

#include "common/error.hpp"
#include "data/compressed_input.hpp"
#include "data/indexed_dataset.hpp"
#include "data/jsonl.hpp"
#include "io/hdf5_handle.hpp"

namespace trident {

bool is_text_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  if (!indexed_dataset_prefix(path).empty()) return false;
  H5QuietErrors quiet;
  return H5Fis_hdf5(path.c_str()) <= 0;
}

TokenizedText tokenize_text_file(const std::string& path, const Tokenizer& tok, const std::string& json_key) {
  std::string text;
  try {
    DecodedReader in(path);
    char buf[1 << 16];
    for (std::size_t n; (n = in.read(buf, sizeof buf)) > 0;) text.append(buf, n);
  } catch (const Error& e) {
    throw Error::all(e.what());
  }
  const std::string ext = std::filesystem::path(without_compression_extension(path)).extension().string();
  TokenizedText out;
  const std::int32_t eod = tok.eod_id();
  TRIDENT_REQUIRE(eod >= 0, "eval.shard '" << path << "': the tokenizer has no end-of-document token");
  auto add = [&](std::string_view doc) {
    const std::size_t before = out.tokens.size();
    tok.encode_append(doc, out.tokens);
    if (out.tokens.size() == before) return;
    out.tokens.push_back(eod);
    ++out.documents;
    out.bytes += static_cast<std::int64_t>(doc.size());
  };
  if (ext != ".json" && ext != ".jsonl") {
    add(text);
    return out;
  }
  std::string doc;
  std::int64_t line_no = 0;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++line_no;
    at = end + 1;
    try {
      if (!jsonl_text(line, json_key, doc)) continue;
    } catch (const Error& e) {
      throw Error::all("eval.shard '" + path + "', line " + std::to_string(line_no) + ": " + e.what());
    }
    add(doc);
  }
  return out;
}

}  // namespace trident
