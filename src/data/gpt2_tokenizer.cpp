// GPT-2 byte-level BPE: loading the vocabulary and merges, the hand-written pre-tokenizer and
// the merge loop. See gpt2_tokenizer.hpp for the rules and the policy on invalid UTF-8.
#include "data/gpt2_tokenizer.hpp"

#include <cctype>

#include <unicode/uchar.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "common/error.hpp"

namespace trident {

namespace {

// GPT-2's byte <-> printable code point table: printable Latin-1 bytes map to themselves,
// the other 68 bytes (controls, space, DEL, NBSP, soft hyphen, ...) to U+0100 upward in
// byte order. Returns code point for each byte.
std::vector<std::uint32_t> byte_to_codepoint() {
  std::vector<std::uint32_t> table(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  std::uint32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = printable[b] ? static_cast<std::uint32_t>(b) : next++;
  return table;
}

// Decodes a valid UTF-8 string (as from a JSON parser) into code points; false on bad input.
bool utf8_to_codepoints(const std::string& s, std::vector<std::uint32_t>& out) {
  out.clear();
  std::size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    std::uint32_t cp;
    int len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F;
      len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F;
      len = 3;
    } else if ((c & 0xF8) == 0xF0) {
      cp = c & 0x07;
      len = 4;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(cp);
    i += len;
  }
  return true;
}

std::string read_file_or_throw(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  TRIDENT_REQUIRE(in.good(), "cannot open GPT-2 " << what << " file '" << path << "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  TRIDENT_REQUIRE(!in.bad(), "cannot read GPT-2 " << what << " file '" << path << "'");
  return ss.str();
}

inline std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

constexpr std::size_t kCacheMaxEntries = 1u << 20;   // words; cleared beyond this
constexpr std::size_t kCacheMaxPieceBytes = 64;      // longer pieces are not cached

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path)
    : vocab_path_(vocab_path) {
  // ---- byte <-> unicode tables ----
  const std::vector<std::uint32_t> b2u = byte_to_codepoint();
  std::vector<int> u2b(512, -1);
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = b;
  // Maps a vocabulary/merges token (GPT-2 printable form) to raw bytes; false when it holds a
  // character outside the table (then it is an added/special token, kept by its UTF-8 text).
  std::vector<std::uint32_t> cps;
  auto to_bytes = [&](const std::string& tok, std::string& bytes) {
    if (!utf8_to_codepoints(tok, cps)) return false;
    bytes.clear();
    for (std::uint32_t cp : cps) {
      if (cp >= u2b.size() || u2b[cp] < 0) return false;
      bytes.push_back(static_cast<char>(u2b[cp]));
    }
    return true;
  };

  // ---- vocabulary ----
  {
    const std::string text = read_file_or_throw(vocab_path, "vocabulary");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      throw Error::all("GPT-2 vocabulary file '" + vocab_path + "' is not valid JSON: " + e.what());
    }
    TRIDENT_REQUIRE(j.is_object() && !j.empty(),
                    "GPT-2 vocabulary file '" << vocab_path << "' must be a non-empty JSON object token -> id");
    std::int64_t max_id = -1;
    for (auto it = j.begin(); it != j.end(); ++it) {
      TRIDENT_REQUIRE(it.value().is_number_integer(), "GPT-2 vocabulary file '" << vocab_path << "': id of token '"
                                                          << it.key() << "' is not an integer");
      std::int64_t id = it.value().get<std::int64_t>();
      TRIDENT_REQUIRE(id >= 0 && id < (1LL << 31) - 1,
                      "GPT-2 vocabulary file '" << vocab_path << "': id " << id << " out of range");
      max_id = std::max(max_id, id);
    }
    id_to_bytes_.assign(static_cast<std::size_t>(max_id + 1), std::string());
    std::vector<bool> seen(static_cast<std::size_t>(max_id + 1), false);
    std::string bytes;
    for (auto it = j.begin(); it != j.end(); ++it) {
      const auto id = static_cast<std::int32_t>(it.value().get<std::int64_t>());
      TRIDENT_REQUIRE(!seen[id], "GPT-2 vocabulary file '" << vocab_path << "': id " << id << " is used twice");
      seen[id] = true;
      if (it.key() == "<|endoftext|>") eod_id_ = id;
      if (to_bytes(it.key(), bytes)) {
        id_to_bytes_[id] = bytes;
        bytes_to_id_.emplace(bytes, id);
      } else {
        id_to_bytes_[id] = it.key();  // special token: decodes to its text, never produced by BPE
      }
    }
  }

  // ---- symbols: every vocabulary byte string ----
  std::unordered_map<std::string, std::int32_t> symbol_of;
  auto symbol = [&](const std::string& bytes) {
    auto it = symbol_of.find(bytes);
    if (it != symbol_of.end()) return it->second;
    const auto s = static_cast<std::int32_t>(symbol_bytes_.size());
    symbol_bytes_.push_back(bytes);
    auto v = bytes_to_id_.find(bytes);
    symbol_to_id_.push_back(v == bytes_to_id_.end() ? -1 : v->second);
    symbol_of.emplace(bytes, s);
    return s;
  };
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    TRIDENT_REQUIRE(bytes_to_id_.count(one), "GPT-2 vocabulary file '" << vocab_path << "' lacks the token of byte "
                                                                        << b << " (a byte-level vocabulary has all 256)");
    byte_symbol_[b] = symbol(one);
  }

  // ---- merges ----
  {
    const std::string text = read_file_or_throw(merges_path, "merges");
    std::size_t pos = 0, line_no = 0;
    std::uint32_t rank = 0;
    std::string a_bytes, b_bytes;
    while (pos < text.size()) {
      std::size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      std::istringstream ls(line);
      std::string a, b, extra;
      ls >> a >> b;
      TRIDENT_REQUIRE(!a.empty() && !b.empty() && !(ls >> extra), "GPT-2 merges file '" << merges_path << "' line "
                                                                      << line_no << ": expected two symbols, got '"
                                                                      << line << "'");
      TRIDENT_REQUIRE(to_bytes(a, a_bytes) && to_bytes(b, b_bytes),
                      "GPT-2 merges file '" << merges_path << "' line " << line_no
                                            << ": symbol outside GPT-2's byte alphabet in '" << line << "'");
      const std::int32_t sa = symbol(a_bytes), sb = symbol(b_bytes);
      const std::int32_t sr = symbol(a_bytes + b_bytes);
      // A repeated pair takes its last rank, as a dict built from the list would.
      merges_[pair_key(sa, sb)] = Merge{rank, sr};
      ++rank;
    }
    num_merges_ = rank;
    TRIDENT_REQUIRE(num_merges_ > 0, "GPT-2 merges file '" << merges_path << "' holds no merges");
    // Every multi-byte token of the vocabulary is the result of a merge (GPT-2: 256 bytes +
    // 50000 merges + <|endoftext|>). A merges file cut short, even at a line boundary, leaves
    // tokens no merge makes, and would silently tokenize differently.
    std::vector<bool> made(symbol_bytes_.size(), false);
    for (const auto& m : merges_) made[static_cast<std::size_t>(m.second.result)] = true;
    std::size_t missing = 0;
    std::string example;
    for (const auto& [bytes, id] : bytes_to_id_) {
      if (bytes.size() < 2) continue;
      // added special tokens spelled in printable ASCII (<|endoftext|>, <pad>, [MASK]) come from
      // no merge
      const bool marker = (bytes.front() == '<' && bytes.back() == '>') || (bytes.front() == '[' && bytes.back() == ']');
      if (marker) continue;
      const auto it = symbol_of.find(bytes);
      if (it != symbol_of.end() && made[static_cast<std::size_t>(it->second)]) continue;
      if (missing++ == 0) example = "id " + std::to_string(id);
    }
    TRIDENT_REQUIRE(missing == 0, "GPT-2 merges file '" << merges_path << "' holds " << num_merges_ << " merges, but "
                                                        << missing << " multi-byte token(s) of the vocabulary '"
                                                        << vocab_path << "' (" << example
                                                        << ", ...) come from none of them: the merges file is "
                                                           "truncated or belongs to another vocabulary");
  }

  // ---- character classes of the Basic Multilingual Plane ----
  bmp_class_.resize(0x10000);
  for (std::uint32_t cp = 0; cp < 0x10000; ++cp) {
    CharClass c = kOther;
    if (u_isUWhiteSpace(static_cast<UChar32>(cp))) {
      c = kSpace;
    } else {
      const std::uint32_t mask = U_MASK(u_charType(static_cast<UChar32>(cp)));
      if (mask & U_GC_L_MASK) c = kLetter;
      else if (mask & U_GC_N_MASK) c = kNumber;
    }
    bmp_class_[cp] = c;
  }
  cache_.reserve(1 << 16);
}

Gpt2Tokenizer::CharClass Gpt2Tokenizer::classify(std::uint32_t cp) const {
  if (cp < 0x10000) return static_cast<CharClass>(bmp_class_[cp]);
  if (u_isUWhiteSpace(static_cast<UChar32>(cp))) return kSpace;
  const std::uint32_t mask = U_MASK(u_charType(static_cast<UChar32>(cp)));
  if (mask & U_GC_L_MASK) return kLetter;
  if (mask & U_GC_N_MASK) return kNumber;
  return kOther;
}

std::size_t Gpt2Tokenizer::next_char(std::string_view s, std::size_t i, CharClass& cls, std::uint32_t& cp) const {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  const unsigned char c = p[i];
  if (c < 0x80) {
    cp = c;
    cls = static_cast<CharClass>(bmp_class_[c]);
    return 1;
  }
  // Strict UTF-8 (RFC 3629): the allowed range of the second byte depends on the first.
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;        // no overlongs
    else if (c == 0xED) hi = 0x9F;   // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;        // no overlongs
    else if (c == 0xF4) hi = 0x8F;   // <= U+10FFFF
  }
  if (len == 0 || i + len > n || p[i + 1] < lo || p[i + 1] > hi) {
    cp = 0xDC00 + c;  // as surrogateescape would: one lone "character" per invalid byte
    cls = kOther;
    return 1;
  }
  for (std::size_t k = 1; k < len; ++k) {
    const unsigned char d = p[i + k];
    if ((d & 0xC0) != 0x80) {
      cp = 0xDC00 + c;
      cls = kOther;
      return 1;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  cls = classify(cp);
  return len;
}

// The pre-tokenizer. At each position the alternatives of GPT-2's pattern are tried in order:
//   's 't 're 've 'm 'll 'd        (lower case only, as in GPT-2)
//   ' '? letters+   ' '? numbers+   ' '? others+      (others: not space, letter or number)
//   \s+(?!\S) : a white-space run up to the end of text, or the run minus its last character
//               when a non-space follows (that character then starts the next piece, e.g.
//               " word" takes the last space of "   word");
//   \s+       : a single white-space character left over by the previous rule.
template <class Emit>
void Gpt2Tokenizer::scan(std::string_view s, Emit&& emit) const {
  const std::size_t n = s.size();
  std::size_t i = 0;
  CharClass cls, cls1;
  std::uint32_t cp, cp1;
  while (i < n) {
    const std::size_t start = i;
    std::size_t len = next_char(s, i, cls, cp);
    if (cp == '\'' && i + 1 < n) {
      const char a = s[i + 1];
      std::size_t clen = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        clen = 2;
      } else if (i + 2 < n) {
        const char b = s[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) clen = 3;
      }
      if (clen) {
        emit(std::string_view(s.data() + start, clen));
        i += clen;
        continue;
      }
    }
    CharClass run = cls;
    if (cp == ' ' && i + 1 < n) {
      next_char(s, i + 1, cls1, cp1);
      if (cls1 != kSpace) {
        run = cls1;
        i += 1;  // the optional leading space
        len = 0;
      }
    }
    if (run != kSpace) {
      i += len;
      while (i < n) {
        const std::size_t l = next_char(s, i, cls1, cp1);
        if (cls1 != run) break;
        i += l;
      }
      emit(std::string_view(s.data() + start, i - start));
      continue;
    }
    // White-space run [start, i) with `last` the start of its final character.
    std::size_t last = i;
    i += len;
    while (i < n) {
      const std::size_t l = next_char(s, i, cls1, cp1);
      if (cls1 != kSpace) break;
      last = i;
      i += l;
    }
    if (i < n && last > start) i = last;  // \s+(?!\S) backs off one character
    emit(std::string_view(s.data() + start, i - start));
  }
}

std::vector<std::string_view> Gpt2Tokenizer::pretokenize(std::string_view s) const {
  std::vector<std::string_view> pieces;
  scan(s, [&](std::string_view p) { pieces.push_back(p); });
  return pieces;
}

void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
  const std::size_t n = piece.size();
  if (n == 1) {
    out.push_back(symbol_to_id_[byte_symbol_[static_cast<unsigned char>(piece[0])]]);
    return;
  }
  const bool cacheable = n <= kCacheMaxPieceBytes;
  std::string key;
  if (cacheable) {
    key.assign(piece.data(), n);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Symbols in a doubly linked list over positions; a merge keeps the left node.
  std::vector<std::int32_t> sym(n), prev(n), next(n);
  for (std::size_t k = 0; k < n; ++k) {
    sym[k] = byte_symbol_[static_cast<unsigned char>(piece[k])];
    prev[k] = static_cast<std::int32_t>(k) - 1;
    next[k] = k + 1 < n ? static_cast<std::int32_t>(k + 1) : -1;
  }
  // Candidate pairs ordered by (rank, position). GPT-2 repeatedly takes the lowest-ranked pair
  // present and merges ALL its occurrences left to right (non-overlapping) before looking at
  // ranks again; we pop every entry of that rank first, then apply them in position order,
  // skipping those that a merge of the same batch invalidated.
  struct Cand {
    std::uint32_t rank;
    std::int32_t pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](std::int32_t p) {
    if (p < 0 || next[p] < 0) return;
    auto it = merges_.find(pair_key(sym[p], sym[next[p]]));
    if (it != merges_.end()) heap.push(Cand{it->second.rank, p, sym[p], sym[next[p]]});
  };
  std::vector<bool> alive(n, true);
  for (std::size_t k = 0; k + 1 < n; ++k) push(static_cast<std::int32_t>(k));
  auto valid = [&](const Cand& c) {
    return alive[c.pos] && sym[c.pos] == c.left && next[c.pos] >= 0 && sym[next[c.pos]] == c.right;
  };
  std::vector<Cand> batch;
  std::size_t count = n;
  while (!heap.empty() && count > 1) {
    const Cand top = heap.top();
    heap.pop();
    if (!valid(top)) continue;
    batch.clear();
    batch.push_back(top);
    while (!heap.empty() && heap.top().rank == top.rank) {
      batch.push_back(heap.top());
      heap.pop();
    }
    const std::int32_t result = merges_.find(pair_key(top.left, top.right))->second.result;
    for (const Cand& c : batch) {  // already in position order
      if (!valid(c)) continue;
      const std::int32_t r = next[c.pos];
      sym[c.pos] = result;
      alive[r] = false;
      next[c.pos] = next[r];
      if (next[r] >= 0) prev[next[r]] = c.pos;
      --count;
    }
    // New neighbour pairs of this batch's results (pushed after the batch so that none of
    // them is applied within it, as in GPT-2's loop).
    for (const Cand& c : batch) {
      if (!alive[c.pos] || sym[c.pos] != result) continue;
      push(prev[c.pos]);
      push(c.pos);
    }
  }
  const std::size_t first = out.size();
  for (std::int32_t p = 0; p >= 0; p = next[p]) {
    const std::int32_t id = symbol_to_id_[sym[p]];
    TRIDENT_REQUIRE(id >= 0, "GPT-2 tokenizer: BPE produced symbol '" << symbol_bytes_[sym[p]]
                                                                       << "' that is not in the vocabulary '"
                                                                       << vocab_path_ << "'");
    out.push_back(id);
  }
  if (cacheable) {
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::move(key), std::vector<std::int32_t>(out.begin() + first, out.end()));
  }
}

void Gpt2Tokenizer::encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const {
  scan(utf8, [&](std::string_view piece) { bpe(piece, out); });
}

std::vector<std::int32_t> Gpt2Tokenizer::encode(std::string_view utf8) const {
  std::vector<std::int32_t> out;
  out.reserve(utf8.size() / 3 + 8);
  encode_append(utf8, out);
  return out;
}

const std::string& Gpt2Tokenizer::token_bytes(std::int32_t id) const {
  TRIDENT_REQUIRE(id >= 0 && id < vocab_size(),
                  "GPT-2 tokenizer: token id " << id << " outside the vocabulary [0, " << vocab_size() << ")");
  return id_to_bytes_[static_cast<std::size_t>(id)];
}

std::string Gpt2Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::int32_t id : ids) out += token_bytes(id);
  return out;
}

bool Gpt2Tokenizer::continues_word(std::int32_t id) const {
  if (id < 0 || id >= vocab_size() || id == eod_id_) return false;
  const std::string& b = id_to_bytes_[static_cast<std::size_t>(id)];
  if (b.empty()) return false;
  const auto c = static_cast<unsigned char>(b[0]);
  return c >= 0x80 || std::isalnum(c);  // a letter, digit or non-ASCII character glued to the one before
}

}  // namespace trident
