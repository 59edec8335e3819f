// JSON-lines input (contract in jsonl.hpp): for_each_line_in_range seeks to the first line that
// starts inside the byte range and reads lines with getline until one starts at or past its
// end; jsonl_text parses one line with nlohmann::json and takes the string under the key.
#include "data/jsonl.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace trident {

void for_each_line_in_range(const std::string& path, std::int64_t begin, std::int64_t end,
                            const std::function<void(std::string_view, std::int64_t, std::int64_t)>& f) {
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

bool jsonl_text(std::string_view line, const std::string& key, std::string& text) {
  if (line.find_first_not_of(" \t") == std::string_view::npos) return false;  // blank line
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error::one(std::string("invalid JSON (") + e.what() + ")");
  }
  const char* problem = nullptr;
  if (!j.is_object())
    problem = "is not a JSON object";
  else if (!j.contains(key))
    problem = "has no key";
  else if (!j[key].is_string())
    problem = "has a non-string value under key";
  if (problem) throw Error::one(std::string("the JSON line ") + problem + (j.is_object() ? " '" + key + "'" : ""));
  text = j[key].get_ref<const std::string&>();
  return true;
}

}  // namespace trident
