// Hugging Face tokenizer.json (hf_tokenizer.hpp): the components, the added-token split, the BPE
// merge loop and the decoders.
#include "data/hf_tokenizer.hpp"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "common/error.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace trident {

// ---- UTF-8 ---------------------------------------------------------------------------------------

std::string sanitize_utf8(std::string_view s) {
  // WHATWG's UTF-8 decoder: a lead byte sets the expected length and the range of the first
  // continuation byte; a byte that breaks the sequence ends it as one U+FFFD and is looked at
  // again as a new lead byte.
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  static const char kFffd[] = "\xEF\xBF\xBD";
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out.append(kFffd, 3);
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    int seen = 0;
    bool ok = true;
    while (seen < need) {
      if (j >= n) {
        ok = false;
        break;
      }
      const unsigned char d = p[j];
      const unsigned char l = seen == 0 ? lo : 0x80, h = seen == 0 ? hi : 0xBF;
      if (d < l || d > h) {
        ok = false;
        break;
      }
      ++j;
      ++seen;
    }
    if (ok) {
      out.append(s.substr(i, j - i));
    } else {
      out.append(kFffd, 3);  // the bytes consumed so far; the breaking byte is read again
    }
    i = j;
  }
  return out;
}

namespace {

// The code point at s[i] of valid UTF-8, and its length.
inline std::uint32_t next_cp(std::string_view s, std::size_t i, std::size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    len = 1;
    return c;
  }
  if (c < 0xE0) {
    len = 2;
    return ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
  }
  if (c < 0xF0) {
    len = 3;
    return ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
  }
  len = 4;
  return ((c & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
         ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
}

inline void append_cp(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Rust's char::is_whitespace: the White_Space property.
inline bool is_ws(std::uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  std::size_t at = 0;
  for (std::size_t k; (k = s.find(from, at)) != std::string::npos; at = k + from.size()) {
    out.append(s, at, k - at);
    out += to;
  }
  out.append(s, at, std::string::npos);
  return out;
}

// ---- regular expressions (Oniguruma's syntax through ICU) ----------------------------------------

// Oniguruma's \s on UTF-8: U+0009..U+000D, U+0085 and General_Category Z (ICU's \s lacks U+000B
// and U+0085).
constexpr const char* kOnigSpace = "\\t\\n\\x{0B}\\f\\r\\x{85}\\p{Z}";

// An Oniguruma pattern in ICU's syntax: \s and \S spelled out, inside and outside classes.
std::string translate_pattern(const std::string& p) {
  std::string out;
  int depth = 0;  // inside a character class
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        out += depth > 0 ? std::string(kOnigSpace) : "[" + std::string(kOnigSpace) + "]";
      } else if (e == 'S') {
        out += depth > 0 ? "[^" + std::string(kOnigSpace) + "]" : "[^" + std::string(kOnigSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (c == '[') ++depth;
    if (c == ']' && depth > 0) --depth;
    out += c;
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    UErrorCode st = U_ZERO_ERROR;
    UParseError pe;
    const icu::UnicodeString up = icu::UnicodeString::fromUTF8(translate_pattern(pattern));
    pattern_.reset(icu::RegexPattern::compile(up, 0, pe, st));
    TRIDENT_REQUIRE(U_SUCCESS(st) && pattern_, where << ": the regular expression '" << pattern
                                                     << "' does not compile (" << u_errorName(st) << " at offset "
                                                     << pe.offset << ")");
    matcher_.reset(pattern_->matcher(st));
    TRIDENT_REQUIRE(U_SUCCESS(st), where << ": cannot match '" << pattern << "' (" << u_errorName(st) << ")");
  }
  // The byte ranges [begin, end) of the non-empty matches in s, left to right.
  void matches(std::string_view s, std::vector<std::pair<std::size_t, std::size_t>>& out) const {
    out.clear();
    UErrorCode st = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, s.data(), static_cast<int64_t>(s.size()), &st);
    matcher_->reset(ut);
    while (matcher_->find(st) && U_SUCCESS(st)) {
      const auto b = static_cast<std::size_t>(matcher_->start64(st)), e = static_cast<std::size_t>(matcher_->end64(st));
      if (e > b) out.emplace_back(b, e);
    }
    matcher_->reset(icu::UnicodeString());
    utext_close(ut);
    TRIDENT_REQUIRE(U_SUCCESS(st), "regular expression matching failed (" << u_errorName(st) << ")");
  }

 private:
  std::unique_ptr<icu::RegexPattern> pattern_;
  std::unique_ptr<icu::RegexMatcher> matcher_;
};

// A Split/Replace pattern: {"String": s} or {"Regex": r}.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
  Pattern(const json& j, const std::string& where) {
    TRIDENT_REQUIRE(j.is_object(), where << ": a pattern must be {\"String\": ...} or {\"Regex\": ...}");
    if (j.contains("Regex")) {
      regex = std::make_unique<Regex>(j["Regex"].get<std::string>(), where);
    } else {
      TRIDENT_REQUIRE(j.contains("String"), where << ": a pattern must be {\"String\": ...} or {\"Regex\": ...}");
      literal = j["String"].get<std::string>();
    }
  }
  void matches(std::string_view s, std::vector<std::pair<std::size_t, std::size_t>>& out) const {
    if (regex) return regex->matches(s, out);
    out.clear();
    if (literal.empty()) return;
    for (std::size_t k = 0; (k = s.find(literal, k)) != std::string_view::npos; k += literal.size())
      out.emplace_back(k, k + literal.size());
  }
};

// s with every match of `pat` replaced by `content`.
std::string replace_matches(const Pattern& pat, const std::string& s, const std::string& content) {
  std::vector<std::pair<std::size_t, std::size_t>> m;
  pat.matches(s, m);
  if (m.empty()) return s;
  std::string out;
  std::size_t at = 0;
  for (const auto& [b, e] : m) {
    out.append(s, at, b - at);
    out += content;
    at = e;
  }
  out.append(s, at, std::string::npos);
  return out;
}

// ---- normalizers -------------------------------------------------------------------------------------

using StringFn = std::function<std::string(const std::string&)>;

std::string icu_normalize(const icu::Normalizer2* n, const std::string& s) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (n->isNormalized(u, st) && U_SUCCESS(st)) return s;
  st = U_ZERO_ERROR;
  const icu::UnicodeString r = n->normalize(u, st);
  TRIDENT_REQUIRE(U_SUCCESS(st), "Unicode normalization failed (" << u_errorName(st) << ")");
  std::string out;
  r.toUTF8String(out);
  return out;
}

StringFn make_normalizer(const json& j, const std::string& where, std::vector<std::shared_ptr<Pattern>>& keep) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  UErrorCode st = U_ZERO_ERROR;
  if (type == "Sequence") {
    std::vector<StringFn> parts;
    for (const auto& n : j.at("normalizers"))
      if (auto f = make_normalizer(n, where, keep)) parts.push_back(f);
    return [parts](const std::string& s) {
      std::string r = s;
      for (const auto& f : parts) r = f(r);
      return r;
    };
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    const icu::Normalizer2* n = type == "NFC"    ? icu::Normalizer2::getNFCInstance(st)
                                : type == "NFD"  ? icu::Normalizer2::getNFDInstance(st)
                                : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(st)
                                                 : icu::Normalizer2::getNFKDInstance(st);
    TRIDENT_REQUIRE(U_SUCCESS(st), where << ": ICU has no " << type << " normalizer");
    return [n](const std::string& s) { return icu_normalize(n, s); };
  }
  if (type == "Lowercase") {
    return [](const std::string& s) {
      std::string out;
      icu::UnicodeString::fromUTF8(s).toLower().toUTF8String(out);
      return out;
    };
  }
  if (type == "Prepend") {
    const std::string p = j.at("prepend").get<std::string>();
    return [p](const std::string& s) { return s.empty() ? s : p + s; };
  }
  if (type == "Replace") {
    auto pat = std::make_shared<Pattern>(j.at("pattern"), where + " (Replace)");
    keep.push_back(pat);
    const std::string content = j.at("content").get<std::string>();
    return [pat, content](const std::string& s) { return replace_matches(*pat, s, content); };
  }
  if (type == "Strip") {
    const bool left = j.value("strip_left", true), right = j.value("strip_right", true);
    return [left, right](const std::string& s) {
      std::size_t b = 0, e = s.size(), len;
      while (left && b < e && is_ws(next_cp(s, b, len))) b += len;
      while (right && e > b) {
        std::size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        if (!is_ws(next_cp(s, k, len))) break;
        e = k;
      }
      return s.substr(b, e - b);
    };
  }
  throw Error::all(where + ": normalizer '" + type +
                   "' is not implemented (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip and Sequence "
                   "are)");
}

// ---- pre-tokenizers -----------------------------------------------------------------------------------

using Splits = std::vector<std::string>;
using PreFn = std::function<void(Splits&)>;

// GPT-2's byte-to-unicode map: printable Latin-1 bytes map to themselves, the others to U+0100 on.
const std::vector<std::string>& byte_chars() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      append_cp(t[static_cast<std::size_t>(b)],
                printable ? static_cast<std::uint32_t>(b) : static_cast<std::uint32_t>(256 + extra++));
    }
    return t;
  }();
  return table;
}

// Splits s at the matches of `pattern` by `behavior` (the library's SplitDelimiterBehavior).
void split_by(const std::string& s, const std::vector<std::pair<std::size_t, std::size_t>>& m,
              const std::string& behavior, bool invert, Splits& out) {
  // (range, is_match) pieces covering s
  std::vector<std::pair<std::pair<std::size_t, std::size_t>, bool>> pieces;
  std::size_t at = 0;
  for (const auto& r : m) {
    if (r.first > at) pieces.push_back({{at, r.first}, false});
    pieces.push_back({r, true});
    at = r.second;
  }
  if (at < s.size()) pieces.push_back({{at, s.size()}, false});
  if (invert)
    for (auto& p : pieces) p.second = !p.second;
  auto text = [&](const std::pair<std::size_t, std::size_t>& r) { return s.substr(r.first, r.second - r.first); };
  if (behavior == "Removed") {
    for (const auto& p : pieces)
      if (!p.second) out.push_back(text(p.first));
  } else if (behavior == "Isolated") {
    for (const auto& p : pieces) out.push_back(text(p.first));
  } else if (behavior == "MergedWithPrevious") {
    bool prev_match = false;
    for (const auto& p : pieces) {
      if (p.second && !out.empty() && !prev_match)
        out.back() += text(p.first);
      else
        out.push_back(text(p.first));
      prev_match = p.second;
    }
  } else if (behavior == "MergedWithNext") {
    std::string carry;
    for (const auto& p : pieces) {
      if (p.second) {
        if (!carry.empty()) out.push_back(carry);
        carry = text(p.first);
      } else {
        out.push_back(carry + text(p.first));
        carry.clear();
      }
    }
    if (!carry.empty()) out.push_back(carry);
  } else if (behavior == "Contiguous") {
    bool prev_match = false;
    for (const auto& p : pieces) {
      if (p.second && prev_match && !out.empty())
        out.back() += text(p.first);
      else
        out.push_back(text(p.first));
      prev_match = p.second;
    }
  } else {
    throw Error::all("tokenizer.json: split behavior '" + behavior + "' is not known");
  }
}

// Applies f to every split, replacing it by the splits f makes (empty ones dropped).
void each_split(Splits& splits, const std::function<void(const std::string&, Splits&)>& f) {
  Splits next;
  for (const auto& s : splits) {
    Splits part;
    f(s, part);
    for (auto& p : part)
      if (!p.empty()) next.push_back(std::move(p));
  }
  splits.swap(next);
}

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

PreFn make_pre_tokenizer(const json& j, const std::string& where, bool& byte_level) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    std::vector<PreFn> parts;
    for (const auto& p : j.at("pretokenizers"))
      if (auto f = make_pre_tokenizer(p, where, byte_level)) parts.push_back(f);
    return [parts](Splits& s) {
      for (const auto& f : parts) f(s);
    };
  }
  if (type == "Split") {
    auto pat = std::make_shared<Pattern>(j.at("pattern"), where + " (Split)");
    const std::string behavior = j.at("behavior").get<std::string>();
    const bool invert = j.value("invert", false);
    return [pat, behavior, invert](Splits& splits) {
      std::vector<std::pair<std::size_t, std::size_t>> m;
      each_split(splits, [&](const std::string& s, Splits& out) {
        pat->matches(s, m);
        split_by(s, m, behavior, invert, out);
      });
    };
  }
  if (type == "ByteLevel") {
    byte_level = true;
    const bool prefix = j.value("add_prefix_space", true), use_regex = j.value("use_regex", true);
    auto re = use_regex ? std::make_shared<Regex>(kGpt2Pattern, where + " (ByteLevel)") : nullptr;
    return [prefix, re](Splits& splits) {
      std::vector<std::pair<std::size_t, std::size_t>> m;
      each_split(splits, [&](const std::string& s0, Splits& out) {
        const std::string s = prefix && (s0.empty() || s0[0] != ' ') ? " " + s0 : s0;
        Splits parts;
        if (re) {
          re->matches(s, m);
          split_by(s, m, "Isolated", false, parts);
        } else {
          parts.push_back(s);
        }
        const auto& table = byte_chars();
        for (const auto& p : parts) {
          std::string mapped;
          for (unsigned char b : p) mapped += table[b];
          out.push_back(std::move(mapped));
        }
      });
    };
  }
  if (type == "Metaspace") {
    const std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    const bool split = j.value("split", true);
    return [rep, scheme, split](Splits& splits) {
      bool first_split = true;
      each_split(splits, [&](const std::string& s, Splits& out) {
        std::string r = replace_all(s, " ", rep);
        if ((scheme == "always" || (scheme == "first" && first_split)) && r.compare(0, rep.size(), rep) != 0)
          r = rep + r;
        first_split = false;
        if (!split) {
          out.push_back(r);
          return;
        }
        std::vector<std::pair<std::size_t, std::size_t>> m;
        for (std::size_t k = 0; (k = r.find(rep, k)) != std::string::npos; k += rep.size())
          m.emplace_back(k, k + rep.size());
        split_by(r, m, "MergedWithNext", false, out);
      });
    };
  }
  if (type == "Digits") {
    const bool individual = j.value("individual_digits", false);
    return [individual](Splits& splits) {
      each_split(splits, [&](const std::string& s, Splits& out) {
        std::vector<std::pair<std::size_t, std::size_t>> m;
        std::size_t i = 0, len;
        while (i < s.size()) {
          const std::uint32_t cp = next_cp(s, i, len);
          if (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) {  // Rust's char::is_numeric
            if (!individual && !m.empty() && m.back().second == i)
              m.back().second = i + len;
            else
              m.emplace_back(i, i + len);
          }
          i += len;
        }
        split_by(s, m, "Isolated", false, out);
      });
    };
  }
  throw Error::all(where + ": pre_tokenizer '" + type +
                   "' is not implemented (Split, ByteLevel, Metaspace, Digits and Sequence are)");
}

// ---- decoders ------------------------------------------------------------------------------------------

using Tokens = std::vector<std::string>;
using DecodeFn = std::function<void(Tokens&)>;

DecodeFn make_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    std::vector<DecodeFn> parts;
    for (const auto& d : j.at("decoders"))
      if (auto f = make_decoder(d, where)) parts.push_back(f);
    return [parts](Tokens& t) {
      for (const auto& f : parts) f(t);
    };
  }
  if (type == "ByteLevel") {
    return [](Tokens& t) {
      static const std::unordered_map<std::uint32_t, unsigned char> back = [] {
        std::unordered_map<std::uint32_t, unsigned char> m;
        const auto& table = byte_chars();
        for (int b = 0; b < 256; ++b) {
          std::size_t len;
          m[next_cp(table[static_cast<std::size_t>(b)], 0, len)] = static_cast<unsigned char>(b);
        }
        return m;
      }();
      std::string bytes;
      for (const auto& tok : t) {
        std::string mine;
        bool all = true;
        for (std::size_t i = 0, len; i < tok.size(); i += len) {
          const auto it = back.find(next_cp(tok, i, len));
          if (it == back.end()) {
            all = false;
            break;
          }
          mine.push_back(static_cast<char>(it->second));
        }
        bytes += all ? mine : tok;
      }
      t.assign(1, sanitize_utf8(bytes));
    };
  }
  if (type == "ByteFallback") {
    return [](Tokens& t) {
      Tokens out;
      std::string pending;  // bytes of consecutive <0xNN> tokens
      std::size_t count = 0;
      auto flush = [&] {
        if (count == 0) return;
        if (sanitize_utf8(pending) == pending) {
          out.push_back(pending);
        } else {
          for (std::size_t k = 0; k < count; ++k) out.push_back("\xEF\xBF\xBD");
        }
        pending.clear();
        count = 0;
      };
      for (auto& tok : t) {
        if (tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>' &&
            std::isxdigit(static_cast<unsigned char>(tok[3])) && std::isxdigit(static_cast<unsigned char>(tok[4]))) {
          pending.push_back(static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)));
          ++count;
        } else {
          flush();
          out.push_back(std::move(tok));
        }
      }
      flush();
      t.swap(out);
    };
  }
  if (type == "Fuse") {
    return [](Tokens& t) {
      std::string all;
      for (const auto& s : t) all += s;
      t.assign(1, all);
    };
  }
  if (type == "Replace") {
    auto pat = std::make_shared<Pattern>(j.at("pattern"), where + " (Replace decoder)");
    const std::string content = j.at("content").get<std::string>();
    return [pat, content](Tokens& t) {
      for (auto& s : t) s = replace_matches(*pat, s, content);
    };
  }
  if (type == "Strip") {
    const std::string content = j.at("content").get<std::string>();
    const int start = j.value("start", 0), stop = j.value("stop", 0);
    return [content, start, stop](Tokens& t) {
      for (auto& s : t) {
        std::size_t b = 0, e = s.size();
        for (int k = 0; k < start && s.compare(b, content.size(), content) == 0 && b + content.size() <= e; ++k)
          b += content.size();
        for (int k = 0;
             k < stop && e >= b + content.size() && s.compare(e - content.size(), content.size(), content) == 0; ++k)
          e -= content.size();
        s = s.substr(b, e - b);
      }
    };
  }
  if (type == "Metaspace") {
    const std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    return [rep, scheme](Tokens& t) {
      for (std::size_t i = 0; i < t.size(); ++i) {
        std::string s = replace_all(t[i], rep, " ");
        if (i == 0 && scheme != "never" && !s.empty() && s[0] == ' ') s.erase(0, 1);
        t[i] = s;
      }
    };
  }
  throw Error::all(where + ": decoder '" + type +
                   "' is not implemented (ByteLevel, ByteFallback, Metaspace, Replace, Fuse, Strip and Sequence are)");
}

std::string read_text(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  TRIDENT_REQUIRE(in, "cannot read " << what << " '" << path << "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// ---- the tokenizer -------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string path;
  std::vector<std::string> files;
  // the model (BPE)
  std::unordered_map<std::string, std::int32_t> vocab;
  std::vector<std::string> id_to_token;  // model vocabulary and added tokens, by id
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges;  // pair -> (rank, merged id)
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  std::int32_t unk = -1;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix
  // added tokens
  struct Added {
    std::string content;
    std::int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
  };
  std::vector<Added> added;
  // the added tokens by their first byte, longest first, for matching on raw [0] and normalized [1]
  // text
  std::vector<std::size_t> by_first[2][256];
  std::vector<bool> is_special;  // by id
  // components
  std::vector<std::shared_ptr<Pattern>> keep;
  StringFn normalizer;
  PreFn pre_tokenizer;
  bool byte_level = false;
  std::vector<std::int32_t> prefix_ids, suffix_ids;  // the post-processor's single template
  DecodeFn decoder;
  SpecialTokens specials;
  bool clean_up_spaces = false;  // tokenizer_config.json's clean_up_tokenization_spaces
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;

  static std::uint64_t key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  // The BPE model on one pre-tokenized word.
  void bpe(const std::string& w, std::vector<std::int32_t>& out) const {
    if (w.empty()) return;
    if (ignore_merges) {
      const auto it = vocab.find(w);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const bool cacheable = w.size() <= 256;
    if (cacheable) {
      const auto it = cache.find(w);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    // the initial symbols: one per character (byte fallback or the unknown token otherwise)
    std::vector<std::int32_t> sym;
    std::int32_t pending_unk = -1;
    std::size_t len;
    for (std::size_t i = 0; i < w.size(); i += len) {
      next_cp(w, i, len);
      std::string s = w.substr(i, len);
      if (i > 0 && !prefix.empty()) s = prefix + s;
      if (i + len == w.size() && !suffix.empty()) s += suffix;
      const auto it = vocab.find(s);
      if (it != vocab.end()) {
        if (pending_unk >= 0) sym.push_back(pending_unk), pending_unk = -1;
        sym.push_back(it->second);
        continue;
      }
      if (byte_fallback) {
        std::vector<std::int32_t> bytes;
        bool all = true;
        for (unsigned char b : s) {
          char name[8];
          std::snprintf(name, sizeof name, "<0x%02X>", b);
          const auto bt = vocab.find(name);
          if (bt == vocab.end()) {
            all = false;
            break;
          }
          bytes.push_back(bt->second);
        }
        if (all) {
          if (pending_unk >= 0) sym.push_back(pending_unk), pending_unk = -1;
          sym.insert(sym.end(), bytes.begin(), bytes.end());
          continue;
        }
      }
      if (unk >= 0) {
        if (pending_unk >= 0 && !fuse_unk) sym.push_back(pending_unk);
        pending_unk = unk;
      }
    }
    if (pending_unk >= 0) sym.push_back(pending_unk);
    // merges: the pair of lowest rank first, the leftmost among equal ranks
    const int n = static_cast<int>(sym.size());
    std::vector<int> prev(n), next(n);
    for (int k = 0; k < n; ++k) {
      prev[k] = k - 1;
      next[k] = k + 1 < n ? k + 1 : -1;
    }
    struct Cand {
      std::int32_t rank;
      int pos;
      std::int32_t left, right;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int p) {
      if (p < 0 || next[p] < 0) return;
      const auto it = merges.find(key(sym[p], sym[next[p]]));
      if (it != merges.end()) heap.push({it->second.first, p, sym[p], sym[next[p]]});
    };
    for (int k = 0; k + 1 < n; ++k) push(k);
    std::vector<bool> dead(n, false);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      if (dead[c.pos] || next[c.pos] < 0 || sym[c.pos] != c.left || sym[next[c.pos]] != c.right) continue;
      const int r = next[c.pos];
      sym[c.pos] = merges.at(key(c.left, c.right)).second;
      dead[r] = true;
      next[c.pos] = next[r];
      if (next[r] >= 0) prev[next[r]] = c.pos;
      push(prev[c.pos]);
      push(c.pos);
    }
    std::vector<std::int32_t> ids;
    for (int k = 0; k >= 0 && k < n; k = next[k]) ids.push_back(sym[k]);
    if (cacheable) {
      if (cache.size() > 100000) cache.clear();
      cache.emplace(w, ids);
    }
    out.insert(out.end(), ids.begin(), ids.end());
  }

  // Normalizer, pre-tokenizer and model on a piece without added tokens.
  void piece(const std::string& text, std::vector<std::int32_t>& out) const {
    if (text.empty()) return;
    Splits splits{text};
    if (pre_tokenizer) pre_tokenizer(splits);
    for (const auto& s : splits) bpe(s, out);
  }

  // Leftmost-longest matches of the added tokens that match on `normalized` text in s:
  // (begin, end, token index), lstrip/rstrip extending over white space.
  std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> find_added(const std::string& s,
                                                                            bool normalized) const {
    std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> m;
    const auto& buckets = by_first[normalized ? 1 : 0];
    std::size_t i = 0;
    while (i < s.size()) {
      std::size_t best = SIZE_MAX, best_len = 0;
      for (const std::size_t k : buckets[static_cast<unsigned char>(s[i])]) {
        const Added& a = added[k];
        if (a.content.size() <= best_len) continue;
        if (s.compare(i, a.content.size(), a.content) != 0) continue;
        if (a.single_word) {
          std::size_t len;
          auto word = [](std::uint32_t cp) { return u_isalnum(static_cast<UChar32>(cp)) || cp == '_'; };
          if (i > 0) {
            std::size_t k2 = i - 1;
            while (k2 > 0 && (static_cast<unsigned char>(s[k2]) & 0xC0) == 0x80) --k2;
            if (word(next_cp(s, k2, len))) continue;
          }
          const std::size_t e = i + a.content.size();
          if (e < s.size() && word(next_cp(s, e, len))) continue;
        }
        best = k;
        best_len = a.content.size();
      }
      if (best == SIZE_MAX) {
        std::size_t len;
        next_cp(s, i, len);
        i += len;
        continue;
      }
      std::size_t b = i, e = i + best_len, len;
      if (added[best].lstrip)
        while (b > 0) {
          std::size_t k2 = b - 1;
          while (k2 > 0 && (static_cast<unsigned char>(s[k2]) & 0xC0) == 0x80) --k2;
          if (!is_ws(next_cp(s, k2, len))) break;
          if (!m.empty() && k2 < std::get<1>(m.back())) break;
          b = k2;
        }
      if (added[best].rstrip)
        while (e < s.size() && is_ws(next_cp(s, e, len))) e += len;
      m.emplace_back(b, e, best);
      i = e;
    }
    return m;
  }

  void encode(std::string_view utf8, std::vector<std::int32_t>& out, bool add_special) const {
    const std::string text = sanitize_utf8(utf8);
    if (add_special) out.insert(out.end(), prefix_ids.begin(), prefix_ids.end());
    // pieces between the added tokens that match on the raw text
    std::size_t at = 0;
    auto normal = [&](const std::string& raw) {
      const std::string n = normalizer ? normalizer(raw) : raw;
      std::size_t p = 0;
      for (const auto& [b, e, k] : find_added(n, true)) {
        piece(n.substr(p, b - p), out);
        out.push_back(added[k].id);
        p = e;
      }
      piece(n.substr(p), out);
    };
    for (const auto& [b, e, k] : find_added(text, false)) {
      if (b > at) normal(text.substr(at, b - at));
      out.push_back(added[k].id);
      at = e;
    }
    if (at < text.size()) normal(text.substr(at));
    if (add_special) out.insert(out.end(), suffix_ids.begin(), suffix_ids.end());
  }
};

HfTokenizer::HfTokenizer(const std::string& path_in) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  std::error_code ec;
  m.path = fs::is_directory(path_in, ec) ? (fs::path(path_in) / "tokenizer.json").string() : path_in;
  const std::string where = "tokenizer '" + m.path + "'";
  json t;
  try {
    t = json::parse(read_text(m.path, "tokenizer file"));
  } catch (const json::exception& e) {
    throw Error::all(where + ": not JSON (" + e.what() + ")");
  }
  TRIDENT_REQUIRE(t.is_object() && t.contains("model"), where << ": not a Hugging Face tokenizer.json (no model)");
  try {
    const json& model = t["model"];
    const std::string type = model.value("type", "BPE");
    TRIDENT_REQUIRE(type == "BPE", where << ": model type '" << type << "' is not implemented (BPE is)");
    std::int32_t max_id = -1;
    for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) {
      const auto id = it.value().get<std::int32_t>();
      m.vocab[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    for (const auto& a : t.value("added_tokens", json::array()))
      max_id = std::max(max_id, a.at("id").get<std::int32_t>());
    m.id_to_token.assign(static_cast<std::size_t>(max_id + 1), std::string());
    m.is_special.assign(static_cast<std::size_t>(max_id + 1), false);
    for (const auto& [tok, id] : m.vocab) m.id_to_token[static_cast<std::size_t>(id)] = tok;
    m.byte_fallback = model.value("byte_fallback", false);
    m.fuse_unk = model.value("fuse_unk", false);
    m.ignore_merges = model.value("ignore_merges", false);
    if (model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string())
      m.prefix = model["continuing_subword_prefix"].get<std::string>();
    if (model.contains("end_of_word_suffix") && model["end_of_word_suffix"].is_string())
      m.suffix = model["end_of_word_suffix"].get<std::string>();
    TRIDENT_REQUIRE(!model.contains("dropout") || model["dropout"].is_null() || model["dropout"].get<double>() == 0.0,
                    where << ": BPE dropout is random; a tokenizer for training corpora must not drop merges");
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      const auto it = m.vocab.find(model["unk_token"].get<std::string>());
      if (it != m.vocab.end()) m.unk = it->second;
    }
    std::int32_t rank = 0;
    for (const auto& mg : model.at("merges")) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const auto sp = s.find(' ');
        TRIDENT_REQUIRE(sp != std::string::npos, where << ": merge '" << s << "' is not two tokens");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        a = mg.at(0).get<std::string>();
        b = mg.at(1).get<std::string>();
      }
      std::string ab = a + b;
      if (!m.prefix.empty() && b.compare(0, m.prefix.size(), m.prefix) == 0) ab = a + b.substr(m.prefix.size());
      const auto ia = m.vocab.find(a), ib = m.vocab.find(b), iab = m.vocab.find(ab);
      TRIDENT_REQUIRE(ia != m.vocab.end() && ib != m.vocab.end() && iab != m.vocab.end(),
                      where << ": merge " << rank << " ('" << a << "' '" << b
                            << "') names a token not in the vocabulary");
      m.merges.emplace(Impl::key(ia->second, ib->second), std::make_pair(rank, iab->second));
      ++rank;
    }
    for (const auto& a : t.value("added_tokens", json::array())) {
      Impl::Added x{a.at("content").get<std::string>(), a.at("id").get<std::int32_t>(), a.value("special", false),
                    a.value("normalized", false),       a.value("lstrip", false),       a.value("rstrip", false),
                    a.value("single_word", false)};
      m.id_to_token[static_cast<std::size_t>(x.id)] = x.content;
      m.is_special[static_cast<std::size_t>(x.id)] = x.special;
      m.added.push_back(std::move(x));
    }
    for (std::size_t k = 0; k < m.added.size(); ++k)
      if (!m.added[k].content.empty())
        m.by_first[m.added[k].normalized ? 1 : 0][static_cast<unsigned char>(m.added[k].content[0])].push_back(k);
    m.normalizer = make_normalizer(t.value("normalizer", json()), where, m.keep);
    m.pre_tokenizer = make_pre_tokenizer(t.value("pre_tokenizer", json()), where, m.byte_level);
    m.decoder = make_decoder(t.value("decoder", json()), where);
    // the post-processor's template for one sequence
    std::function<void(const json&)> post = [&](const json& p) {
      if (p.is_null()) return;
      const std::string type = p.value("type", "");
      if (type == "Sequence") {
        for (const auto& q : p.at("processors")) post(q);
      } else if (type == "TemplateProcessing") {
        bool after = false;
        for (const auto& piece : p.at("single")) {
          if (piece.contains("Sequence")) {
            after = true;
            continue;
          }
          const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
          for (const auto& id : p.at("special_tokens").at(name).at("ids"))
            (after ? m.suffix_ids : m.prefix_ids).push_back(id.get<std::int32_t>());
        }
      } else if (type == "BertProcessing" || type == "RobertaProcessing") {
        m.prefix_ids.push_back(p.at("cls").at(1).get<std::int32_t>());
        m.suffix_ids.push_back(p.at("sep").at(1).get<std::int32_t>());
      } else if (type != "ByteLevel") {
        throw Error::all(where + ": post_processor '" + type +
                         "' is not implemented (TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing and "
                         "Sequence are)");
      }
    };
    post(t.value("post_processor", json()));
  } catch (const json::exception& e) {
    throw Error::all(where + ": unexpected structure (" + e.what() + ")");
  }
  // the end-of-document and bos tokens: tokenizer_config.json's eos_token / bos_token
  const fs::path cfg = fs::path(m.path).parent_path() / "tokenizer_config.json";
  auto named = [&](const json& c, const char* key) -> std::int32_t {
    if (!c.contains(key) || c[key].is_null()) return -1;
    const std::string name = c[key].is_string() ? c[key].get<std::string>() : c[key].value("content", std::string());
    return token_id(name);
  };
  m.files.push_back(m.path);
  if (fs::exists(cfg, ec)) {
    m.files.push_back(cfg.string());
    json c;
    try {
      c = json::parse(read_text(cfg.string(), "tokenizer config"));
    } catch (const json::exception& e) {
      throw Error::all("tokenizer config '" + cfg.string() + "': not JSON (" + e.what() + ")");
    }
    m.clean_up_spaces = c.value("clean_up_tokenization_spaces", false);
    m.specials.eod = named(c, "eos_token");
    m.specials.bos = named(c, "bos_token");
    m.specials.pad = named(c, "pad_token");
    m.specials.unk = named(c, "unk_token");
  }
  if (m.specials.eod < 0)  // no config: the usual names of the end of a document
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"})
      if ((m.specials.eod = token_id(name)) >= 0) break;
}

HfTokenizer::~HfTokenizer() = default;

void HfTokenizer::encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const {
  impl_->encode(utf8, out, true);
}

void HfTokenizer::encode_append(std::string_view utf8, std::vector<std::int32_t>& out, bool add_special) const {
  impl_->encode(utf8, out, add_special);
}

std::string HfTokenizer::decode(const std::vector<std::int32_t>& ids) const { return decode(ids, false); }

std::string HfTokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special) const {
  Tokens toks;
  for (const auto id : ids) {
    TRIDENT_REQUIRE(id >= 0 && id < vocab_size(),
                    "tokenizer '" << impl_->path << "': id " << id << " is outside [0, " << vocab_size() << ")");
    if (skip_special && impl_->is_special[static_cast<std::size_t>(id)]) continue;
    toks.push_back(impl_->id_to_token[static_cast<std::size_t>(id)]);
  }
  if (!impl_->decoder) {
    std::string out;
    for (std::size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  impl_->decoder(toks);
  std::string out;
  for (const auto& s : toks) out += s;
  if (impl_->clean_up_spaces)  // the transformers library's clean-up of spaces before punctuation
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{" .", "."},
                                                                                   {" ?", "?"},
                                                                                   {" !", "!"},
                                                                                   {" ,", ","},
                                                                                   {" ' ", "'"},
                                                                                   {" n't", "n't"},
                                                                                   {" 'm", "'m"},
                                                                                   {" 's", "'s"},
                                                                                   {" 've", "'ve"},
                                                                                   {" 're", "'re"}})
      out = replace_all(out, from, to);
  return out;
}

std::int64_t HfTokenizer::vocab_size() const { return static_cast<std::int64_t>(impl_->id_to_token.size()); }

SpecialTokens HfTokenizer::specials() const { return impl_->specials; }

bool HfTokenizer::continues_word(std::int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->is_special[static_cast<std::size_t>(id)]) return false;
  const std::string& t = impl_->id_to_token[static_cast<std::size_t>(id)];
  if (t.empty()) return false;
  // a word starts at a space marker (byte-level: U+0120 "Ġ", U+010A "Ċ"; metaspace: U+2581)
  return !(t.compare(0, 2, "\xC4\xA0") == 0 || t.compare(0, 2, "\xC4\x8A") == 0 ||
           t.compare(0, 3, "\xE2\x96\x81") == 0 || t[0] == ' ');
}

const std::string& HfTokenizer::token(std::int32_t id) const {
  TRIDENT_REQUIRE(id >= 0 && id < vocab_size(), "tokenizer '" << impl_->path << "': no token " << id);
  return impl_->id_to_token[static_cast<std::size_t>(id)];
}

const std::vector<std::string>& HfTokenizer::files() const { return impl_->files; }

std::int32_t HfTokenizer::token_id(const std::string& tok) const {
  for (const auto& a : impl_->added)
    if (a.content == tok) return a.id;
  const auto it = impl_->vocab.find(tok);
  return it == impl_->vocab.end() ? -1 : it->second;
}

}  // namespace trident
