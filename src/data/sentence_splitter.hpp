// A rule-based sentence splitter for preprocess_data --split-sentences (BERT / T5 corpora).
//
// A sentence ends after a run of terminators (. ! ? and the ellipsis U+2026), optionally
// followed by closing quotes or brackets, when white space follows and the next word does not
// start with a lower-case letter. A '.' does not end a sentence after a known abbreviation
// ("Mr.", "e.g.", "etc.", ...), a single upper-case letter ("J. Smith") or a word that has a '.' inside
// ("U.S."). Ideographic terminators (U+3002 U+FF01 U+FF1F) end a sentence without white space
// after them. A paragraph break (a white-space run holding two or more line feeds) always ends
// one.
//
// Splits are made only between a non-space character and white space, or after an ideographic
// terminator before a letter or number. These are always boundaries of GPT-2's pre-tokenizer,
// so tokenizing the sentences one by one gives exactly the tokens of the whole text; the white
// space between two sentences belongs to the second one. Nothing is dropped: the sentences
// concatenated are the text.
#pragma once
#include <cstddef>
#include <string_view>
#include <vector>

namespace trident {

// Byte offsets at which the sentences of `text` end, increasing; the last is text.size().
// Empty text gives no sentence. Text that is not valid UTF-8 is fine (bytes >= 0x80 that do
// not form a terminator count as ordinary non-space characters).
std::vector<std::size_t> split_sentences(std::string_view text);

}  // namespace trident
