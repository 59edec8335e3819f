// JSON-lines input (contract in jsonl.hpp): for_each_line_in_range seeks to the first line that
// starts inside the byte range and reads lines with getline until one starts at or past its
// end; jsonl_text parses one line with nlohmann::json and takes the string under the key.
#include "data/jsonl.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "data/compressed_input.hpp"

namespace trident {

namespace {

// A compressed file: decoded from its start; lines starting before `begin` are skipped, the scan
// stops at the first line starting at or past `end`.
void compressed_lines_in_range(const std::string& path, std::int64_t begin, std::int64_t end,
                               const std::function<void(std::string_view, std::int64_t, std::int64_t)>& f) {
  DecodedReader in(path);
  std::string buf;  // decoded bytes; the current line starts at buf[head]
  std::size_t head = 0;
  std::int64_t pos = 0;  // decoded offset of buf[head]
  std::size_t scan = 0;  // buf[head, scan) holds no line end
  std::vector<char> block(std::size_t(1) << 20);
  bool eof = false;
  while (pos < end) {
    std::size_t nl = buf.find('\n', scan);
    while (nl == std::string::npos && !eof) {
      buf.erase(0, head);  // keep only the unfinished line before reading more
      head = 0;
      scan = buf.size();
      const std::size_t got = in.read(block.data(), block.size());
      if (got == 0) {
        eof = true;
        break;
      }
      buf.append(block.data(), got);
      nl = buf.find('\n', scan);
    }
    if (nl == std::string::npos && head == buf.size()) break;  // the end of the data
    const std::size_t n = (nl == std::string::npos ? buf.size() : nl + 1) - head;
    if (pos >= begin) {
      std::string_view sv(buf.data() + head, n);
      while (!sv.empty() && (sv.back() == '\n' || sv.back() == '\r')) sv.remove_suffix(1);
      f(sv, pos, static_cast<std::int64_t>(n));
    }
    pos += static_cast<std::int64_t>(n);
    head += n;
    scan = head;
  }
}

}  // namespace

void for_each_line_in_range(const std::string& path, std::int64_t begin, std::int64_t end,
                            const std::function<void(std::string_view, std::int64_t, std::int64_t)>& f) {
  if (compression_of(path) != Compression::none) return compressed_lines_in_range(path, begin, end, f);
  std::FILE* fp = std::fopen(path.c_str(), "rb");
  TRIDENT_REQUIRE(fp, "cannot open input file '" << path << "'");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(fp, std::fclose);
  char* line = nullptr;  // getline's buffer, grown by it
  std::size_t cap = 0;
  std::unique_ptr<char*, void (*)(char**)> free_line(&line, [](char** p) { std::free(*p); });
  std::int64_t pos = begin;
  if (begin > 0) {
    // Start at the first line beginning at or after `begin`: the one before it started earlier
    // unless byte begin - 1 ends a line.
    TRIDENT_REQUIRE(fseeko(fp, begin - 1, SEEK_SET) == 0, "cannot seek in '" << path << "'");
    const int c = std::fgetc(fp);
    if (c != '\n' && c != EOF) {
      const ssize_t n = getline(&line, &cap, fp);
      pos += n > 0 ? n : 0;
    }
  }
  while (pos < end) {
    const ssize_t n = getline(&line, &cap, fp);
    if (n <= 0) break;
    const std::int64_t start = pos;
    pos += n;
    std::string_view sv(line, static_cast<std::size_t>(n));
    while (!sv.empty() && (sv.back() == '\n' || sv.back() == '\r')) sv.remove_suffix(1);
    f(sv, start, static_cast<std::int64_t>(n));
  }
  TRIDENT_REQUIRE(!std::ferror(fp), "error reading '" << path << "'");
}

bool jsonl_texts(std::string_view line, const std::vector<std::string>& keys, std::vector<std::string>& texts) {
  if (line.find_first_not_of(" \t") == std::string_view::npos) return false;  // blank line
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error::one(std::string("invalid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw Error::one("the JSON line is not a JSON object");
  texts.resize(keys.size());
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const auto it = j.find(keys[k]);
    if (it == j.end()) throw Error::one("the JSON line has no key '" + keys[k] + "'");
    if (!it->is_string()) throw Error::one("the JSON line has a non-string value under key '" + keys[k] + "'");
    texts[k] = it->get_ref<const std::string&>();
  }
  return true;
}

bool jsonl_text(std::string_view line, const std::string& key, std::string& text) {
  thread_local std::vector<std::string> texts;
  const bool has = jsonl_texts(line, {key}, texts);
  if (has) text = std::move(texts[0]);
  return has;
}

}  // namespace trident
