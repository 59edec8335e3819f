// WordPieceTokenizer against hand-checked cases of BERT's tokenizer (Google's tokenization.py
// rules, worked out by hand for each input), on a small vocabulary written here and on
// bert-base-uncased's vocab.txt from the sample data (TRIDENT_SAMPLE_DIR/bert/vocab.txt, sha256
// checked by data/prepare_sample.sh); the tokenizer factory and its errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "data/tokenizer.hpp"
#include "data/wordpiece_tokenizer.hpp"

namespace fs = std::filesystem;
using trident::Error;
using trident::WordPieceTokenizer;
using V = std::vector<std::string>;
using Ids = std::vector<std::int32_t>;

namespace {

std::string write_vocab(const std::string& name, const V& tokens) {
  const std::string p = (fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".txt")).string();
  std::ofstream out(p);
  for (const auto& t : tokens) out << t << "\n";
  return p;
}

// The vocabulary of tokenization_test.py's WordPiece example, plus what the cases below need.
const V kSmall = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "want", "##want", "##ed", "wa", "un", "runn",
                  "##ing", ",", "low", "lowest", "hello", "!", "how", "are", "you", "?", "οδος", "中", "文"};

V pieces(const WordPieceTokenizer& t, const std::string& text) {
  V out;
  for (auto id : t.encode(text)) out.push_back(t.token(id));
  return out;
}

TEST(WordPiece, BasicTokenizationLowerCase) {
  WordPieceTokenizer t(write_vocab("wp_small", kSmall), true);
  // white space of every kind separates words; case folded; punctuation split off
  EXPECT_EQ(t.basic_tokenize(" \tHeLLo!how  \n Are yoU?  "), (V{"hello", "!", "how", "are", "you", "?"}));
  // accents stripped after NFD (é = e + U+0301)
  EXPECT_EQ(t.basic_tokenize("H\u00E9llo"), (V{"hello"}));
  // final sigma lower-cases to ς (Python's str.lower), and Greek keeps its letters
  EXPECT_EQ(t.basic_tokenize("\u039F\u0394\u039F\u03A3"), (V{"\u03BF\u03B4\u03BF\u03C2"}));
  // NUL, U+FFFD and format characters (U+00AD soft hyphen, category Cf) are dropped
  EXPECT_EQ(t.basic_tokenize(std::string("a\0b\u00ADc\uFFFDd", 10)), (V{"abcd"}));
  // CJK ideographs become words of their own
  EXPECT_EQ(t.basic_tokenize("ah\u535A\u63A8zz"), (V{"ah", "\u535A", "\u63A8", "zz"}));
  // Unicode punctuation (categories P*) and ASCII symbols ($, ^, `) split; U+00A0 (Zs) separates
  EXPECT_EQ(t.basic_tokenize("a\u2014b$c^d`e\u00A0f"), (V{"a", "\u2014", "b", "$", "c", "^", "d", "`", "e", "f"}));
  // the line separator U+2028 separates words (Python's str.split)
  EXPECT_EQ(t.basic_tokenize("x\u2028y"), (V{"x", "y"}));
}

TEST(WordPiece, BasicTokenizationCasedKeepsCaseAndAccents) {
  WordPieceTokenizer t(write_vocab("wp_small_c", kSmall), false);
  EXPECT_EQ(t.basic_tokenize(" \tHeLLo!how  \n Are yoU?  "), (V{"HeLLo", "!", "how", "Are", "yoU", "?"}));
  EXPECT_EQ(t.basic_tokenize("H\u00E9llo"), (V{"H\u00E9llo"}));
}

TEST(WordPiece, GreedyLongestMatchFirst) {
  WordPieceTokenizer t(write_vocab("wp_small2", kSmall), true);
  EXPECT_EQ(pieces(t, "unwanted running"), (V{"un", "##want", "##ed", "runn", "##ing"}));
  // a word that cannot be covered is [UNK] as a whole
  EXPECT_EQ(pieces(t, "unwantedX running"), (V{"[UNK]", "runn", "##ing"}));
  // the longest piece wins ("lowest", not "low" + ...)
  EXPECT_EQ(pieces(t, "lowest low"), (V{"lowest", "low"}));
  EXPECT_EQ(pieces(t, "\u4E2D\u6587"), (V{"\u4E2D", "\u6587"}));
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_TRUE(t.encode(" \t\n").empty());
  // a word over 100 characters is [UNK] even when it could be covered
  std::string longword;
  for (int i = 0; i < 101; ++i) longword += "a";
  EXPECT_EQ(pieces(t, longword), (V{"[UNK]"}));
  const auto sp = t.specials();
  EXPECT_EQ(sp.pad, 0);
  EXPECT_EQ(sp.unk, 1);
  EXPECT_EQ(sp.cls, 2);
  EXPECT_EQ(sp.sep, 3);
  EXPECT_EQ(sp.mask, 4);
  EXPECT_EQ(sp.eod, sp.sep);
  // special tokens are never produced from text
  EXPECT_EQ(pieces(t, "[MASK]"), (V{"[UNK]", "[UNK]", "[UNK]"}));
}

TEST(WordPiece, BadVocabulariesFailWithTheirName) {
  try {
    WordPieceTokenizer t("/nonexistent/vocab.txt", true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/vocab.txt"), std::string::npos) << e.what();
  }
  try {
    WordPieceTokenizer t(write_vocab("wp_nomask", {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"}), true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[MASK]"), std::string::npos) << e.what();
  }
  try {
    WordPieceTokenizer t(write_vocab("wp_dup", {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "a"}), true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(trident::make_tokenizer("BertWordPieceUpperCase", "v.txt", ""), Error);
  EXPECT_THROW(trident::make_tokenizer("GPT2BPEWithBertSpecials", "encoder.json", ""), Error);
}

// bert-base-uncased's vocabulary: ids checked by hand against the lines of vocab.txt (line
// number - 1), and "unaffable", the documented example of greedy longest-match-first.
TEST(WordPiece, BertBaseUncasedVocabulary) {
  const char* d = std::getenv("TRIDENT_SAMPLE_DIR");
  ASSERT_NE(d, nullptr) << "set TRIDENT_SAMPLE_DIR to the sample data directory (data/prepare_sample.sh)";
  auto tok = trident::make_tokenizer("BertWordPieceLowerCase", std::string(d) + "/bert/vocab.txt", "");
  EXPECT_EQ(tok->vocab_size(), 30522);
  const auto sp = tok->specials();
  EXPECT_EQ(sp.pad, 0);
  EXPECT_EQ(sp.unk, 100);
  EXPECT_EQ(sp.cls, 101);
  EXPECT_EQ(sp.sep, 102);
  EXPECT_EQ(sp.mask, 103);
  // hello , my son is cutting . ("cutting" is one vocabulary entry)
  EXPECT_EQ(tok->encode("Hello, my son is cutting."), (Ids{7592, 1010, 2026, 2365, 2003, 6276, 1012}));
  // token ##ization; beg ##at; je ##hosh ##ap ##hat (longest entries first, by hand)
  EXPECT_EQ(tok->encode("Tokenization begat Jehoshaphat"), (Ids{19204, 3989, 11693, 4017, 15333, 26643, 9331, 12707}));
  // "the" 1996, "lord" 2935; punctuation ":" 1024
  EXPECT_EQ(tok->encode("THE LORD:"), (Ids{1996, 2935, 1024}));
  auto* wp = dynamic_cast<const WordPieceTokenizer*>(tok.get());
  ASSERT_NE(wp, nullptr);
  V got;
  for (auto id : tok->encode("unaffable")) got.push_back(wp->token(id));
  EXPECT_EQ(got, (V{"una", "##ffa", "##ble"}));
}

}  // namespace
