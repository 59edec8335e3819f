// Gpt2Tokenizer against GPT-2's real vocabulary (the sample data: TRIDENT_SAMPLE_DIR/gpt2).
//  - pre-tokenization pieces checked by hand against GPT-2's pattern;
//  - a few id sequences (the values the independent JavaScript encoder gives, and well-known
//    GPT-2 ids such as 50256 for <|endoftext|>);
//  - the BPE merge loop against a plain transcription of GPT-2's algorithm on strings;
//  - decode(encode(x)) == x for random bytes, valid UTF-8 or not;
//  - tokenizing the sentences of split_sentences one by one gives the tokens of the whole text;
//  - clear errors for bad vocabulary / merges files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/error.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/sentence_splitter.hpp"

namespace fs = std::filesystem;
using trident::Error;
using trident::Gpt2Tokenizer;
using V = std::vector<std::string>;
using Ids = std::vector<std::int32_t>;

namespace {

std::string sample_dir() {
  const char* d = std::getenv("TRIDENT_SAMPLE_DIR");
  return d ? d : "";
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string d = sample_dir();
    ASSERT_FALSE(d.empty()) << "set TRIDENT_SAMPLE_DIR to the sample data directory (data/prepare_sample.sh)";
    vocab_ = d + "/gpt2/encoder.json";
    merges_ = d + "/gpt2/vocab.bpe";
    ASSERT_TRUE(fs::exists(vocab_)) << vocab_;
    tok_ = new Gpt2Tokenizer(vocab_, merges_);
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static V pieces(const std::string& s) {
    V out;
    for (auto p : tok_->pretokenize(s)) out.emplace_back(p);
    return out;
  }
  static V token_strings(const std::string& s) {
    V out;
    for (std::int32_t id : tok_->encode(s)) out.push_back(tok_->token_bytes(id));
    return out;
  }

  static inline Gpt2Tokenizer* tok_ = nullptr;
  static inline std::string vocab_, merges_;
};

}  // namespace

TEST_F(Gpt2TokenizerTest, VocabularyBasics) {
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_EQ(tok_->eod_id(), 50256);
  EXPECT_EQ(tok_->num_merges(), 50000u);
  EXPECT_EQ(tok_->token_bytes(0), "!");
  EXPECT_EQ(tok_->token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(tok_->token_bytes(220), " ");
  EXPECT_EQ(tok_->token_bytes(198), "\n");
  EXPECT_EQ(tok_->token_bytes(628), "\n\n");
  EXPECT_THROW(tok_->decode({50257}), Error);
  EXPECT_THROW(tok_->decode({-1}), Error);
}

TEST_F(Gpt2TokenizerTest, PretokenizeContractions) {
  EXPECT_EQ(pieces("I'm don't they're we've you'll he'd it's"),
            (V{"I", "'m", " don", "'t", " they", "'re", " we", "'ve", " you", "'ll", " he", "'d", " it", "'s"}));
  // Upper case contractions are not special in GPT-2: the apostrophe is a symbol of its own.
  EXPECT_EQ(pieces("IT'S DON'T I'M"), (V{"IT", "'", "S", " DON", "'", "T", " I", "'", "M"}));
  EXPECT_EQ(pieces("'s 's''s"), (V{"'s", " '", "s", "''", "s"}));  // greedy symbol runs
  EXPECT_EQ(pieces("x!'s"), (V{"x", "!'", "s"}));  // a symbol run swallows the apostrophe
  EXPECT_EQ(pieces("rock'n'roll"), (V{"rock", "'", "n", "'", "roll"}));
  EXPECT_EQ(pieces("'"), (V{"'"}));
  EXPECT_EQ(pieces("we'l"), (V{"we", "'", "l"}));
  EXPECT_EQ(pieces("it’s"), (V{"it", "’", "s"}));  // typographic apostrophe: not a contraction
}

TEST_F(Gpt2TokenizerTest, PretokenizeWhiteSpace) {
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(pieces("end   "), (V{"end", "   "}));            // trailing run kept whole
  EXPECT_EQ(pieces("x\n\ny"), (V{"x", "\n", "\n", "y"}));      // \s+(?!\S) backs off, then \s+
  EXPECT_EQ(pieces("x\n\n"), (V{"x", "\n\n"}));
  EXPECT_EQ(pieces("a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(pieces("\t\tword"), (V{"\t", "\t", "word"}));
  EXPECT_EQ(pieces("a\r\nb"), (V{"a", "\r", "\n", "b"}));
  EXPECT_EQ(pieces("  "), (V{"  "}));
  EXPECT_EQ(pieces(" "), (V{" "}));
  EXPECT_EQ(pieces(""), V{});
  EXPECT_EQ(pieces(" !?"), (V{" !?"}));
  EXPECT_EQ(pieces("hello!!! world"), (V{"hello", "!!!", " world"}));
  // Unicode white space (White_Space): no-break space, ideographic space, line separator.
  EXPECT_EQ(pieces("a\u00a0b"), (V{"a", "\u00a0", "b"}));
  EXPECT_EQ(pieces("a\u3000\u3000b"), (V{"a", "\u3000", "\u3000", "b"}));
  EXPECT_EQ(pieces("a \u2028"), (V{"a", " \u2028"}));
}

TEST_F(Gpt2TokenizerTest, PretokenizeDigitsAndUnicode) {
  EXPECT_EQ(pieces("1234567890"), (V{"1234567890"}));
  EXPECT_EQ(pieces("abc123def 42"), (V{"abc", "123", "def", " 42"}));
  EXPECT_EQ(pieces("3.14"), (V{"3", ".", "14"}));
  EXPECT_EQ(pieces("٣٤ १२ ½Ⅻ"), (V{"٣٤", " १२", " ½Ⅻ"}));  // Nd, No and Nl are all numbers
  EXPECT_EQ(pieces("naïve café"), (V{"naïve", " café"}));
  EXPECT_EQ(pieces("Привет, мир"), (V{"Привет", ",", " мир"}));
  EXPECT_EQ(pieces("漢字かなカナ한국어"), (V{"漢字かなカナ한국어"}));
  EXPECT_EQ(pieces("a😀b 😀😀"), (V{"a", "😀", "b", " 😀😀"}));
  EXPECT_EQ(pieces("e\u0301"), (V{"e", "\u0301"}));   // combining marks are not letters
  EXPECT_EQ(pieces("𝔸𝕓 𝟘"), (V{"𝔸𝕓", " 𝟘"}));     // astral letters and digits
}

TEST_F(Gpt2TokenizerTest, PretokenizeInvalidUtf8) {
  // Each invalid byte is a lone "symbol" character (as surrogateescape decoding would make it).
  EXPECT_EQ(pieces("ab\xff\xfe" "cd"), (V{"ab", "\xff\xfe", "cd"}));
  EXPECT_EQ(pieces(" \x80x"), (V{" \x80", "x"}));
  EXPECT_EQ(pieces("x\xe2\x82"), (V{"x", "\xe2\x82"}));              // truncated sequence
  EXPECT_EQ(pieces("\xc0\xaf!"), (V{"\xc0\xaf!"}));                   // overlong '/'
  EXPECT_EQ(pieces("a\xed\xa0\x80z"), (V{"a", "\xed\xa0\x80", "z"}));  // encoded surrogate
  EXPECT_EQ(pieces("\xf4\x90\x80\x80"), (V{"\xf4\x90\x80\x80"}));     // above U+10FFFF
  EXPECT_EQ(pieces("\xe2\x82" "A"), (V{"\xe2\x82", "A"}));            // truncated before a letter
}

TEST_F(Gpt2TokenizerTest, KnownIds) {
  // Values of the JavaScript reference encoder (gpt-3-encoder), which are GPT-2's.
  EXPECT_EQ(tok_->encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok_->encode("Hello world!"), (Ids{15496, 995, 0}));
  EXPECT_EQ(tok_->encode("I'm here, don't worry; they're fine and we'll see."),
            (Ids{40, 1101, 994, 11, 836, 470, 5490, 26, 484, 821, 3734, 290, 356, 1183, 766, 13}));
  EXPECT_EQ(tok_->encode("IT'S"), (Ids{2043, 6, 50}));
  EXPECT_EQ(tok_->encode("a\n\nb"), (Ids{64, 198, 198, 65}));
  EXPECT_EQ(tok_->encode("x\n\n"), (Ids{87, 628}));
  EXPECT_EQ(tok_->encode("end   "), (Ids{437, 220, 220, 220}));
  EXPECT_EQ(tok_->encode("a   b"), (Ids{64, 220, 220, 275}));
  EXPECT_EQ(tok_->encode("1234567890"), (Ids{10163, 2231, 30924, 3829}));
  EXPECT_EQ(tok_->encode(" 42"), (Ids{5433}));
  EXPECT_EQ(tok_->encode("naïve café"), (Ids{2616, 38776, 40304}));
  EXPECT_EQ(tok_->encode("漢字"), (Ids{162, 120, 95, 27764, 245}));
  EXPECT_EQ(tok_->encode("😀"), (Ids{47249, 222}));
  EXPECT_EQ(tok_->encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));  // not special
  EXPECT_EQ(tok_->encode("\t\tword"), (Ids{197, 197, 4775}));
  EXPECT_EQ(tok_->encode("a \n b"), (Ids{64, 220, 198, 275}));
  EXPECT_EQ(tok_->encode(""), Ids{});
  EXPECT_EQ(tok_->encode(" "), (Ids{220}));
  EXPECT_EQ(tok_->encode("  "), (Ids{220, 220}));
  EXPECT_EQ(token_strings(" the"), (V{" the"}));
}

TEST_F(Gpt2TokenizerTest, LongWords) {
  for (const std::string w : {std::string(1000, 'a'), std::string(5000, '!'), std::string(3000, '7')}) {
    const Ids ids = tok_->encode(w);
    EXPECT_GT(ids.size(), 1u);
    EXPECT_LT(ids.size(), w.size());
    EXPECT_EQ(tok_->decode(ids), w);
  }
  std::string rep;
  for (int k = 0; k < 50; ++k) rep += "supercalifragilisticexpialidocious";
  EXPECT_EQ(tok_->decode(tok_->encode(rep)), rep);
}

// GPT-2's merge loop written out plainly on the printable-unicode strings of the files, used as
// a reference for the linked-list / heap implementation.
TEST_F(Gpt2TokenizerTest, BpeMatchesPlainReference) {
  // byte -> printable code point (UTF-8 string), as in GPT-2.
  std::vector<std::string> b2u(256);
  {
    std::vector<int> bs;
    for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
    std::vector<bool> printable(256, false);
    for (int b : bs) printable[b] = true;
    int n = 0;
    auto utf8 = [](int cp) {
      std::string s;
      if (cp < 0x80) s += static_cast<char>(cp);
      else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return s;
    };
    for (int b = 0; b < 256; ++b) b2u[b] = utf8(printable[b] ? b : 256 + n++);
  }
  std::map<std::pair<std::string, std::string>, int> ranks;
  {
    std::istringstream in(slurp(merges_));
    std::string line;
    std::getline(in, line);  // #version
    int r = 0;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string a, b;
      if (ls >> a >> b) ranks[{a, b}] = r++;
    }
  }
  const nlohmann::json enc = nlohmann::json::parse(slurp(vocab_));
  auto reference = [&](std::string_view piece) {
    std::vector<std::string> word;
    for (unsigned char c : piece) word.push_back(b2u[c]);
    while (word.size() > 1) {
      int best = -1;
      std::size_t at = 0;
      for (std::size_t k = 0; k + 1 < word.size(); ++k) {
        auto it = ranks.find({word[k], word[k + 1]});
        if (it != ranks.end() && (best < 0 || it->second < best)) {
          best = it->second;
          at = k;
        }
      }
      if (best < 0) break;
      const std::string first = word[at], second = word[at + 1];
      std::vector<std::string> merged;
      for (std::size_t k = 0; k < word.size();) {
        if (k + 1 < word.size() && word[k] == first && word[k + 1] == second) {
          merged.push_back(first + second);
          k += 2;
        } else {
          merged.push_back(word[k++]);
        }
      }
      word.swap(merged);
    }
    Ids ids;
    for (const auto& w : word) ids.push_back(enc.at(w).get<std::int32_t>());
    return ids;
  };
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "b", "e", "r", "t", "s", "n", " ", "!", "0", "1", "é", "th",
                                             "ing", "tion", "aa", "ab", "ba", "ss", "\xff"};
  for (int trial = 0; trial < 400; ++trial) {
    std::string text;
    const int len = 1 + static_cast<int>(rng() % (trial < 350 ? 20 : 400));
    for (int k = 0; k < len; ++k) text += alphabet[rng() % alphabet.size()];
    Ids want;
    for (auto p : tok_->pretokenize(text)) {
      const Ids part = reference(p);
      want.insert(want.end(), part.begin(), part.end());
    }
    ASSERT_EQ(tok_->encode(text), want) << "text: '" << text << "'";
  }
}

TEST_F(Gpt2TokenizerTest, RoundTripArbitraryBytes) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string s(rng() % 64, '\0');
    const int mode = trial % 3;
    for (auto& c : s) {
      if (mode == 0) c = static_cast<char>(rng() % 256);                        // anything
      else if (mode == 1) c = static_cast<char>(0x80 + rng() % 128);            // high bytes only
      else c = static_cast<char>(" \t\n'sS0a\xc3\xa9\xe2\x80"[rng() % 13]);      // fragments
    }
    const Ids ids = tok_->encode(s);
    ASSERT_EQ(tok_->decode(ids), s) << "trial " << trial;
    // Pieces tile the text and encoding piece by piece gives the same ids.
    std::string tiled;
    Ids piecewise;
    for (auto p : tok_->pretokenize(s)) {
      tiled += p;
      tok_->encode_append(p, piecewise);
    }
    ASSERT_EQ(tiled, s);
    ASSERT_EQ(piecewise, ids);
  }
}

TEST_F(Gpt2TokenizerTest, SentencesTokenizeLikeTheWholeText) {
  // The sample corpus (one JSON document per chapter) when present, plus mixed text.
  std::vector<std::string> texts = {
      "Mr. Smith went home.  He slept!\n\nNext paragraph... \"Quoted.\" (Bracketed.) 今日は晴れ。明日は雨。",
      "Trailing. \n\n  \t", "A.\u00a0B. C\xff. D"};
  std::ifstream in(sample_dir() + "/kjv.jsonl");
  std::string line;
  for (int k = 0; k < 200 && std::getline(in, line); ++k) texts.push_back(nlohmann::json::parse(line).at("text"));
  std::size_t sentences = 0;
  for (const std::string& t : texts) {
    Ids piecewise;
    std::size_t begin = 0;
    for (std::size_t end : trident::split_sentences(t)) {
      tok_->encode_append(std::string_view(t).substr(begin, end - begin), piecewise);
      begin = end;
      ++sentences;
    }
    ASSERT_EQ(piecewise, tok_->encode(t)) << t.substr(0, 200);
  }
  EXPECT_GT(sentences, texts.size() * 3);
}

TEST_F(Gpt2TokenizerTest, Throughput) {
  // Reported, not asserted (docs/DESIGN.md: performance is never asserted by timed tests).
  const std::string kjv = slurp(sample_dir() + "/kjv.txt");
  if (kjv.empty()) GTEST_SKIP() << "no kjv.txt";
  Gpt2Tokenizer fresh(vocab_, merges_);
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = fresh.encode(kjv);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("GPT-2 tokenizer: %zu bytes -> %zu tokens in %.3f s: %.2fM tokens/s, %.1f MB/s (cold cache)\n",
              kjv.size(), ids.size(), s, ids.size() / s / 1e6, kjv.size() / s / 1e6);
  RecordProperty("tokens_per_second", std::to_string(static_cast<long long>(ids.size() / s)));
}

TEST(Gpt2TokenizerFiles, ErrorsNameTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("trident_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string d = sample_dir();
  const std::string vocab = d + "/gpt2/encoder.json", merges = d + "/gpt2/vocab.bpe";
  auto expect_error = [](const std::string& v, const std::string& m, const std::string& what) {
    try {
      Gpt2Tokenizer t(v, m);
      ADD_FAILURE() << "no error for " << v << " / " << m;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error((dir / "missing.json").string(), merges, "cannot open GPT-2 vocabulary file");
  expect_error((dir / "missing.json").string(), merges, (dir / "missing.json").string());
  std::ofstream(dir / "bad.json") << "{\"a\": 1,";
  expect_error((dir / "bad.json").string(), merges, "is not valid JSON");
  std::ofstream(dir / "list.json") << "[1, 2]";
  expect_error((dir / "list.json").string(), merges, "must be a non-empty JSON object");
  std::ofstream(dir / "small.json") << "{\"a\": 0, \"b\": 1}";
  expect_error((dir / "small.json").string(), merges, "lacks the token of byte");
  if (fs::exists(vocab)) {
    expect_error(vocab, (dir / "missing.bpe").string(), "cannot open GPT-2 merges file");
    std::ofstream(dir / "bad.bpe") << "#version: 0.2\na b\nc d e\n";
    expect_error(vocab, (dir / "bad.bpe").string(), "line 3: expected two symbols");
    std::ofstream(dir / "empty.bpe") << "#version: 0.2\n";
    expect_error(vocab, (dir / "empty.bpe").string(), "holds no merges");
  }
  fs::remove_all(dir);
}
