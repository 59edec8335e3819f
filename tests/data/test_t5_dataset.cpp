// T5Dataset on the sample T5 shards (TRIDENT_SAMPLE_DIR/kjv_t5_*.h5: WordPiece with [BOS], [EOS]
// and 100 sentinels appended): the sentinel layout (the encoder input and the decoder target
// rebuild the source tokens exactly; sentinels in order; decoder input = [BOS] + target shifted),
// span-corruption statistics over more than 10^5 tokens, determinism and clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "data_test_helpers.hpp"
#include "data/t5_dataset.hpp"
#include "data/tokenizer.hpp"

using trident::T5Data;
using trident::T5Masking;
using trident::T5Sample;

namespace {

using trident::test::expect_error_naming;
std::string sample() { return trident::test::sample_dir(); }

constexpr std::int64_t kEnc = 128, kDec = 48;

class T5DatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_FALSE(sample().empty()) << "set TRIDENT_SAMPLE_DIR (data/prepare_sample.sh)";
    data_ = new T5Data(sample() + "/kjv_t5_*.h5", "98,2,0", kEnc, kDec, 4000, 50, 99, sample() + "/bert/vocab.txt", "",
                       T5Masking{});
    tok_ = trident::make_tokenizer("BertWordPieceLowerCase", sample() + "/bert/vocab.txt", "", 100).release();
  }
  static void TearDownTestSuite() {
    delete data_;
    delete tok_;
  }
  static T5Data* data_;
  static trident::Tokenizer* tok_;
};
T5Data* T5DatasetTest::data_ = nullptr;
trident::Tokenizer* T5DatasetTest::tok_ = nullptr;

std::int64_t real_length(const std::vector<std::int32_t>& padding) {
  std::int64_t n = 0;
  while (n < static_cast<std::int64_t>(padding.size()) && padding[n]) ++n;
  for (auto k = static_cast<size_t>(n); k < padding.size(); ++k) EXPECT_EQ(padding[k], 0) << "padding not at the end";
  return n;
}

TEST_F(T5DatasetTest, SentinelLayoutRebuildsTheSource) {
  const auto sp = data_->specials();
  EXPECT_EQ(sp.bos, 30522);
  EXPECT_EQ(sp.eos, 30523);
  EXPECT_EQ(sp.sentinel, 30524);
  EXPECT_EQ(sp.num_sentinels, 100);
  EXPECT_EQ(data_->vocab_size(), 30624);
  T5Sample s;
  std::vector<std::int32_t> src;
  for (std::int64_t i = 0; i < 1000; ++i) {
    data_->train().get(i, s, &src);
    const std::int64_t ne = real_length(s.enc_padding), nd = real_length(s.dec_padding);
    ASSERT_GT(s.num_spans, 0);
    ASSERT_LE(static_cast<std::int64_t>(src.size()), kEnc - 2);
    for (std::int64_t k = ne; k < kEnc; ++k) ASSERT_EQ(s.enc[k], sp.pad);
    for (std::int64_t k = nd; k < kDec; ++k) {
      ASSERT_EQ(s.dec_in[k], sp.pad);
      ASSERT_EQ(s.dec_target[k], -1);
    }
    // decoder input = [BOS] + target without its last token; the target ends with [EOS]
    ASSERT_EQ(s.dec_in[0], sp.bos);
    for (std::int64_t k = 1; k < nd; ++k) ASSERT_EQ(s.dec_in[k], s.dec_target[k - 1]);
    ASSERT_EQ(s.dec_target[nd - 1], sp.eos);
    // the target lists the spans: sentinel k, then its tokens; the encoder holds sentinel k in
    // place of span k; putting the spans back gives the source
    std::vector<std::vector<std::int32_t>> spans;
    for (std::int64_t k = 0; k < nd - 1; ++k) {
      const std::int32_t t = s.dec_target[k];
      if (t >= sp.sentinel && t < sp.sentinel + sp.num_sentinels) {
        ASSERT_EQ(t, sp.sentinel + static_cast<std::int32_t>(spans.size())) << "sample " << i << ": sentinels out of order";
        spans.emplace_back();
      } else {
        ASSERT_FALSE(spans.empty()) << "sample " << i << ": the target does not start with a sentinel";
        spans.back().push_back(t);
      }
    }
    ASSERT_EQ(static_cast<std::int32_t>(spans.size()), s.num_spans);
    std::vector<std::int32_t> rebuilt;
    std::int32_t next = 0;
    for (std::int64_t k = 0; k < ne; ++k) {
      const std::int32_t t = s.enc[k];
      if (t >= sp.sentinel && t < sp.sentinel + sp.num_sentinels) {
        ASSERT_EQ(t, sp.sentinel + next) << "sample " << i << ": encoder sentinels out of order";
        ASSERT_FALSE(spans[static_cast<size_t>(next)].empty()) << "sample " << i << ": empty span";
        rebuilt.insert(rebuilt.end(), spans[static_cast<size_t>(next)].begin(), spans[static_cast<size_t>(next)].end());
        ++next;
      } else {
        rebuilt.push_back(t);
      }
    }
    ASSERT_EQ(next, s.num_spans);
    ASSERT_EQ(rebuilt, src) << "sample " << i << ": encoder input + spans do not rebuild the source";
  }
}

TEST_F(T5DatasetTest, SpanCorruptionStatistics) {
  T5Sample s;
  std::vector<std::int32_t> src;
  std::int64_t tokens = 0, masked = 0, spans = 0, span_words = 0, longest = 0, samples = 0;
  std::vector<std::int64_t> by_words(12, 0);
  std::vector<std::int32_t> drawn;
  for (std::int64_t i = 0; i < data_->train().size() && tokens < 300000; ++i, ++samples) {
    data_->train().get(i, s, &src, &drawn);
    tokens += static_cast<std::int64_t>(src.size());
    const std::int64_t nd = real_length(s.dec_padding);
    std::int64_t words = 0;
    for (std::int64_t k = 0; k < nd - 1; ++k) {
      const std::int32_t t = s.dec_target[k];
      if (t >= 30524) {  // a sentinel: close the previous span
        if (words > 0) ++by_words[static_cast<size_t>(std::min<std::int64_t>(words, 11))];
        span_words += words;
        longest = std::max(longest, words);
        words = 0;
        ++spans;
        continue;
      }
      ++masked;
      if (!tok_->continues_word(t)) ++words;  // a span starts at a word start, so this counts its words
    }
    ++by_words[static_cast<size_t>(std::min<std::int64_t>(words, 11))];
    span_words += words;
    longest = std::max(longest, words);
  }
  ASSERT_GT(tokens, 100000);
  const double f = static_cast<double>(masked) / static_cast<double>(tokens);
  const double mean_words = static_cast<double>(span_words) / static_cast<double>(spans);
  // E[min(G, 10)] for G geometric with p = 0.2: sum_{k=0}^{9} 0.8^k
  const double expected = (1.0 - std::pow(0.8, 10)) / 0.2;
  double drawn_mean = 0;
  for (auto d : drawn) drawn_mean += d;
  drawn_mean /= static_cast<double>(drawn.size());
  std::printf("%lld tokens in %lld samples: masked %.4f, %lld spans; drawn span lengths: mean %.3f words over %zu "
              "draws (capped geometric %.3f); realised spans: mean %.3f words, %.3f tokens; longest %lld words; "
              "spans of 1..10 words:",
              static_cast<long long>(tokens), static_cast<long long>(samples), f, static_cast<long long>(spans),
              drawn_mean, drawn.size(), expected, mean_words, static_cast<double>(masked) / static_cast<double>(spans),
              static_cast<long long>(longest));
  for (int k = 1; k <= 10; ++k) std::printf(" %lld", static_cast<long long>(by_words[static_cast<size_t>(k)]));
  std::printf("\n");
  // masked fraction: 15% of each sample, rounded per sample, within 1% absolute
  EXPECT_NEAR(f, 0.15, 0.01);
  // the drawn lengths follow the capped geometric distribution: their mean within 2% of
  // sum_{k<10} 0.8^k = 4.463 (standard error about 0.6% over ~10^4 draws)
  EXPECT_NEAR(drawn_mean, expected, 0.02 * expected);
  // realised spans never exceed 10 words and are shorter on average than drawn: a span that
  // would pass the sample's budget (15% of its tokens) or the end of the text is shortened
  EXPECT_LE(longest, 10);
  EXPECT_LT(mean_words, drawn_mean);
  EXPECT_GT(mean_words, 0.7 * expected);
  // the geometric shape: one-word spans are the most frequent, and counts fall with length
  EXPECT_GT(by_words[1], by_words[2]);
  EXPECT_GT(by_words[2], by_words[4]);
  EXPECT_GT(by_words[4], by_words[8]);
}

TEST_F(T5DatasetTest, DeterministicAndClearErrors) {
  T5Data again(sample() + "/kjv_t5_*.h5", "98,2,0", kEnc, kDec, 4000, 50, 99, sample() + "/bert/vocab.txt", "",
               T5Masking{});
  T5Sample a, b;
  for (std::int64_t i : {0, 5, 3999, 77777}) {
    data_->train().get(i, a);
    again.train().get(i, b);
    EXPECT_EQ(a.enc, b.enc);
    EXPECT_EQ(a.dec_target, b.dec_target);
  }
  // BERT shards lack [BOS], [EOS] and sentinels; a decoder that cannot hold one span
  expect_error_naming([] { T5Data(sample() + "/kjv_bert_*.h5", "1", kEnc, kDec, 10, 0, 1, sample() + "/bert/vocab.txt", "",
                           T5Masking{}); },
               "--vocab-extra-ids");
  expect_error_naming([] { T5Data(sample() + "/kjv_t5_*.h5", "1", kEnc, 2, 10, 0, 1, sample() + "/bert/vocab.txt", "",
                           T5Masking{}); },
               "decoder sequence length");
}

// The decoder's capacity: with Megatron's T5-base shapes (encoder 512, decoder 128) every sample
// fits and the budget almost never binds (masked fraction still 15%); with a decoder of 24 for an
// encoder of 128 it binds and the masked tokens plus sentinels fill at most 23 positions.
TEST_F(T5DatasetTest, DecoderCapacityBoundsTheSpans) {
  for (const auto& [enc, dec, expect_full] : {std::tuple<std::int64_t, std::int64_t, bool>{512, 128, true},
                                              std::tuple<std::int64_t, std::int64_t, bool>{128, 24, false}}) {
    T5Data d(sample() + "/kjv_t5_*.h5", "1", enc, dec, 400, 0, 7, sample() + "/bert/vocab.txt", "", T5Masking{});
    T5Sample s;
    std::vector<std::int32_t> src;
    std::int64_t tokens = 0, masked = 0, bound = 0, n = 0;
    for (std::int64_t i = 0; i < 400; ++i, ++n) {
      d.train().get(i, s, &src);
      const std::int64_t nd = real_length(s.dec_padding);  // [BOS] + sentinels + span tokens
      ASSERT_LE(nd, dec) << "sample " << i;
      const std::int64_t m = nd - 1 - s.num_spans;
      const auto want = std::max<std::int64_t>(1, std::llround(0.15 * static_cast<double>(src.size())));
      if (m < want) ++bound;
      tokens += static_cast<std::int64_t>(src.size());
      masked += m;
    }
    const double f = static_cast<double>(masked) / static_cast<double>(tokens);
    std::printf("encoder %lld, decoder %lld: masked %.4f over %lld tokens; budget bound in %lld of %lld samples\n",
                static_cast<long long>(enc), static_cast<long long>(dec), f, static_cast<long long>(tokens),
                static_cast<long long>(bound), static_cast<long long>(n));
    if (expect_full) {
      EXPECT_NEAR(f, 0.15, 0.01);
      EXPECT_LE(bound, n / 50);  // at most 2% of the samples
    } else {
      EXPECT_LT(f, 0.15);
      EXPECT_GT(bound, 0);
    }
  }
}

}  // namespace
