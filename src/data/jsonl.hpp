// JSON-lines input (preprocess_data): the lines of a byte range of a file and the text of one
// record. A line belongs to the range that holds its first byte, so the ranges of any split of a
// file into consecutive pieces yield every line exactly once (the MPI ranks' split of the input).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace trident {

// Calls f(line, offset of its first byte, its bytes in the file) for every line of `path` whose
// first byte lies in [begin, end); `line` is without its line ending ("\n", "\r\n"; the last
// line may lack one), the byte count with it. Throws Error::all when the file cannot be opened or
// read. A compressed file (compressed_input.hpp) is decoded from its start and the offsets are
// those of the decoded bytes, so that a split of the decoded size gives the lines of the same
// split of the uncompressed file.
void for_each_line_in_range(const std::string& path, std::int64_t begin, std::int64_t end,
                            const std::function<void(std::string_view, std::int64_t, std::int64_t)>& f);

// The record of one JSON line: its text under `key` (in `text`); false for a blank line. A line
// that is not a JSON object holding a string under `key` throws Error::one with the reason ("invalid
// JSON (...)", "the JSON line has no key 'text'", ...), which the caller prefixes with the file and
// line number.
bool jsonl_text(std::string_view line, const std::string& key, std::string& text);
// The same for several keys, the line parsed once: texts[k] is the text under keys[k].
bool jsonl_texts(std::string_view line, const std::vector<std::string>& keys, std::vector<std::string>& texts);

}  // namespace trident
