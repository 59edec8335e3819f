// BERT's WordPiece tokenizer (see the header for the rules): loading vocab.txt (stripped lines,
// duplicates rejected, [UNK] [CLS] [SEP] [MASK] [PAD] required), basic tokenization over ICU
// character classes (cleaning, CJK spacing, lower-casing with NFD accent stripping, punctuation
// splits) and the greedy longest-match-first WordPiece loop with its [UNK] fallback.
#include "data/wordpiece_tokenizer.hpp"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <fstream>

#include "common/error.hpp"

namespace trident {

namespace {

bool is_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || u_charType(static_cast<UChar32>(c)) == U_SPACE_SEPARATOR;
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_UNASSIGNED: case U_PRIVATE_USE_CHAR: case U_SURROGATE:
      return true;
    default:
      return false;
  }
}

bool is_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_DASH_PUNCTUATION: case U_START_PUNCTUATION: case U_END_PUNCTUATION: case U_CONNECTOR_PUNCTUATION:
    case U_OTHER_PUNCTUATION: case U_INITIAL_PUNCTUATION: case U_FINAL_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

// Python's str.split() separators that survive the cleaning (line and paragraph separators).
bool splits_words(char32_t c) { return c == ' ' || u_isUWhiteSpace(static_cast<UChar32>(c)); }

// The CJK Unified Ideographs blocks of BERT's _is_chinese_char (not Hangul, Hiragana, Katakana).
bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::u32string to_u32(const icu::UnicodeString& s) {
  std::u32string out;
  for (int32_t i = 0; i < s.length(); i = s.moveIndex32(i, 1)) out.push_back(static_cast<char32_t>(s.char32At(i)));
  return out;
}

icu::UnicodeString to_icu(const std::u32string& s) {
  icu::UnicodeString out;
  for (char32_t c : s) out.append(static_cast<UChar32>(c));
  return out;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8(const std::u32string& s, std::size_t begin, std::size_t end) {
  std::string out;
  for (std::size_t i = begin; i < end; ++i) append_utf8(s[i], out);
  return out;
}

// Lower case (full mapping, root locale), NFD, without non-spacing marks.
std::u32string lower_strip_accents(const std::u32string& word) {
  icu::UnicodeString s = to_icu(word);
  s.toLower(icu::Locale::getRoot());
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(err);
  TRIDENT_REQUIRE(U_SUCCESS(err), "WordPiece: ICU's NFD normalizer is unavailable (" << u_errorName(err) << ")");
  const icu::UnicodeString d = nfd->normalize(s, err);
  TRIDENT_REQUIRE(U_SUCCESS(err), "WordPiece: NFD normalization failed (" << u_errorName(err) << ")");
  std::u32string out;
  for (char32_t c : to_u32(d))
    if (u_charType(static_cast<UChar32>(c)) != U_NON_SPACING_MARK) out.push_back(c);
  return out;
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(const std::string& vocab_path, bool lower_case) : lower_case_(lower_case) {
  std::ifstream in(vocab_path, std::ios::binary);
  TRIDENT_REQUIRE(in.good(), "WordPiece vocabulary '" << vocab_path << "' cannot be read");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // BERT's load_vocab strips each line; a blank line would be the token ""
    const auto first = line.find_first_not_of(" \t"), last = line.find_last_not_of(" \t");
    line = first == std::string::npos ? std::string() : line.substr(first, last - first + 1);
    const auto id = static_cast<std::int32_t>(tokens_.size());
    TRIDENT_REQUIRE(ids_.emplace(line, id).second,
                    "WordPiece vocabulary '" << vocab_path << "': token '" << line << "' appears twice (line "
                                             << id + 1 << ")");
    tokens_.push_back(line);
  }
  TRIDENT_REQUIRE(!tokens_.empty(), "WordPiece vocabulary '" << vocab_path << "' is empty");
  auto special = [&](const char* name) {
    const auto it = ids_.find(name);
    TRIDENT_REQUIRE(it != ids_.end(), "WordPiece vocabulary '" << vocab_path << "' has no " << name << " token");
    return it->second;
  };
  specials_.unk = special("[UNK]");
  specials_.cls = special("[CLS]");
  specials_.sep = special("[SEP]");
  specials_.mask = special("[MASK]");
  specials_.pad = special("[PAD]");
  specials_.eod = specials_.sep;
}

std::vector<std::string> WordPieceTokenizer::basic_tokenize(std::string_view text) const {
  // clean, map white space to ' ', space out CJK ideographs
  std::u32string clean;
  for (char32_t c : to_u32(icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size()))))) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_whitespace(c)) {
      clean.push_back(' ');
    } else if (is_cjk(c)) {
      clean.push_back(' ');
      clean.push_back(c);
      clean.push_back(' ');
    } else {
      clean.push_back(c);
    }
  }
  std::vector<std::string> words;
  std::size_t i = 0;
  while (i < clean.size()) {
    while (i < clean.size() && splits_words(clean[i])) ++i;
    std::size_t j = i;
    while (j < clean.size() && !splits_words(clean[j])) ++j;
    if (j == i) break;
    std::u32string word = clean.substr(i, j - i);
    i = j;
    if (lower_case_) word = lower_strip_accents(word);
    // punctuation characters become words of their own
    std::size_t start = 0;
    for (std::size_t k = 0; k <= word.size(); ++k) {
      const bool punct = k < word.size() && is_punctuation(word[k]);
      const bool split = k == word.size() || punct || splits_words(word[k]);
      if (!split) continue;
      if (k > start) words.push_back(utf8(word, start, k));
      if (punct) words.push_back(utf8(word, k, k + 1));
      start = k + 1;
    }
  }
  return words;
}

std::int32_t WordPieceTokenizer::find(const std::string& piece) const {
  const auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

void WordPieceTokenizer::wordpiece(const std::u32string& word, std::vector<std::int32_t>& out) const {
  if (word.size() > kMaxCharsPerWord) {
    out.push_back(specials_.unk);
    return;
  }
  const std::size_t mark = out.size();
  for (std::size_t start = 0; start < word.size();) {
    std::int32_t id = -1;
    std::size_t end = word.size();
    for (; end > start; --end) {  // longest piece first
      id = find((start > 0 ? "##" : "") + utf8(word, start, end));
      if (id >= 0) break;
    }
    if (id < 0) {  // the word cannot be covered: [UNK] for all of it
      out.resize(mark);
      out.push_back(specials_.unk);
      return;
    }
    out.push_back(id);
    start = end;
  }
}

void WordPieceTokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  for (const std::string& w : basic_tokenize(text)) {
    const std::int32_t whole = find(w);  // the common case: the word is one piece
    if (whole >= 0 && w.size() <= kMaxCharsPerWord) {
      out.push_back(whole);
      continue;
    }
    wordpiece(to_u32(icu::UnicodeString::fromUTF8(icu::StringPiece(w.data(), static_cast<int32_t>(w.size())))), out);
  }
}

}  // namespace trident
