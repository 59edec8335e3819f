// Rule-based sentence splitting (rules in sentence_splitter.hpp): one pass over the bytes finds
// paragraph breaks and runs of terminators with their closers, then applies the lower-case,
// initial, abbreviation and dotted-word exceptions; ICU classifies the letter or number after an
// ideographic terminator.
#include "data/sentence_splitter.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include <unicode/uchar.h>
#include <unicode/utf8.h>

namespace trident {

namespace {

bool is_ascii_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_ascii_lower(unsigned char c) { return c >= 'a' && c <= 'z'; }
bool is_ascii_upper(unsigned char c) { return c >= 'A' && c <= 'Z'; }

// Abbreviations (compared case-sensitively, without the final '.') after which '.' does not
// end a sentence.
bool is_abbreviation(std::string_view w) {
  static const std::array<const char*, 60> kAbbrev = {
      "Mr", "Mrs", "Ms", "Dr", "Prof", "Sr", "Jr", "St", "Mt", "Ft", "Rev", "Hon", "Gen", "Col", "Lt", "Sgt",
      "Capt", "Cmdr", "Gov", "Pres", "Rep", "Sen", "vs", "etc", "cf", "al", "viz", "approx", "ca", "Inc", "Ltd",
      "Co", "Corp", "Bros", "No", "Nos", "Fig", "Figs", "Vol", "Vols", "pp", "Ch", "Eq", "Sec", "Jan", "Feb",
      "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec", "Ave", "Blvd", "Dept", "Univ"};
  for (const char* a : kAbbrev) {
    if (w == a) return true;
  }
  return false;
}

// Closing characters that may follow a terminator: ASCII ) ] } " ' and the UTF-8 sequences of
// ’ ” » 」 』 ） (their byte lengths returned; 0 when none at s[i]).
std::size_t closer_at(std::string_view s, std::size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ')' || c == ']' || c == '}' || c == '"' || c == '\'') return 1;
  static const char* kCloser[] = {"\xE2\x80\x99", "\xE2\x80\x9D", "\xC2\xBB", "\xE3\x80\x8D", "\xE3\x80\x8F",
                                  "\xEF\xBC\x89"};
  for (const char* k : kCloser) {
    const std::size_t n = std::strlen(k);
    if (s.compare(i, n, k) == 0) return n;
  }
  return 0;
}

// Terminator at s[i]: returns its byte length (0 if none); ideographic = needs no space after.
std::size_t terminator_at(std::string_view s, std::size_t i, bool& ideographic) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  ideographic = false;
  if (c == '.' || c == '!' || c == '?') return 1;
  if (s.compare(i, 3, "\xE2\x80\xA6") == 0) return 3;  // …
  if (s.compare(i, 3, "\xE3\x80\x82") == 0 || s.compare(i, 3, "\xEF\xBC\x81") == 0 ||
      s.compare(i, 3, "\xEF\xBC\x9F") == 0) {  // 。！？
    ideographic = true;
    return 3;
  }
  return 0;
}

// Whether s[i] starts a (valid UTF-8) letter or number (Unicode general categories L*, N*).
bool letter_or_number_at(std::string_view s, std::size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  UChar32 cp = -1;
  U8_NEXT(p, i, n, cp);  // cp < 0 on an invalid sequence
  if (cp < 0) return false;
  return (U_MASK(u_charType(cp)) & (U_GC_L_MASK | U_GC_N_MASK)) != 0;
}

}  // namespace

std::vector<std::size_t> split_sentences(std::string_view s) {
  std::vector<std::size_t> ends;
  const std::size_t n = s.size();
  std::size_t i = 0;
  std::size_t word_start = 0;  // start of the current non-space word
  auto push_end = [&](std::size_t e) {
    // A split needs text on both sides that is not only white space.
    const std::size_t begin = ends.empty() ? 0 : ends.back();
    bool left_has_text = false;
    for (std::size_t k = begin; k < e && !left_has_text; ++k) left_has_text = !is_ascii_space(s[k]);
    bool right_has_text = false;
    for (std::size_t k = e; k < n && !right_has_text; ++k) right_has_text = !is_ascii_space(s[k]);
    if (left_has_text && right_has_text && e > begin) ends.push_back(e);
  };
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (is_ascii_space(c)) {
      // Paragraph break: a white-space run with two or more line feeds.
      std::size_t j = i, lf = 0;
      while (j < n && is_ascii_space(static_cast<unsigned char>(s[j]))) lf += s[j++] == '\n';
      if (lf >= 2 && i > 0) push_end(i);
      i = j;
      word_start = i;
      continue;
    }
    bool ideo = false;
    std::size_t tl = terminator_at(s, i, ideo);
    if (tl == 0) {
      ++i;
      continue;
    }
    // A run of terminators, then closers.
    const std::size_t term_start = i;
    bool only_dots = true, any_ideo = false;
    while (i < n && (tl = terminator_at(s, i, ideo)) > 0) {
      only_dots = only_dots && s[i] == '.';
      any_ideo = any_ideo || ideo;
      i += tl;
    }
    const std::size_t term_end = i;
    std::size_t cl;
    while (i < n && (cl = closer_at(s, i)) > 0) i += cl;
    const std::size_t end = i;
    if (end >= n) break;  // the text's end closes the last sentence anyway
    const unsigned char next = static_cast<unsigned char>(s[end]);
    if (!is_ascii_space(next)) {
      // Only ideographic terminators split without a space, and only before a non-ASCII or
      // alphanumeric character (keeps the pre-tokenizer boundary; see the header).
      const bool alnum = letter_or_number_at(s, end);
      if (any_ideo && alnum && s[end - 1] != '\'') push_end(end);
      continue;  // e.g. "3.14", "U.S.A", "e.g.,"
    }
    // The next word (after the white space).
    std::size_t k = end;
    while (k < n && is_ascii_space(static_cast<unsigned char>(s[k]))) ++k;
    if (k >= n) break;
    if (is_ascii_lower(static_cast<unsigned char>(s[k]))) continue;
    if (only_dots && term_end - term_start == 1) {
      // A single '.': not an end after an upper-case initial, an abbreviation or a dotted word.
      std::string_view word = s.substr(word_start, term_start - word_start);
      while (!word.empty() && (word.front() == '(' || word.front() == '"' || word.front() == '\'' ||
                               word.front() == '[')) {
        word.remove_prefix(1);
      }
      if (word.size() == 1 && is_ascii_upper(static_cast<unsigned char>(word[0]))) continue;  // "J. Smith"
      if (word.find('.') != std::string_view::npos) continue;                                // "U.S. Army"
      if (is_abbreviation(word)) continue;                                                   // "Mr. Smith"
    }
    push_end(end);
  }
  if (n > 0) {
    if (!ends.empty() && ends.back() == n) return ends;
    ends.push_back(n);
  }
  return ends;
}

}  // namespace trident
