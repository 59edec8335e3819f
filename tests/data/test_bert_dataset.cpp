// BertDataset on the sample WordPiece shards (TRIDENT_SAMPLE_DIR/kjv_bert_*.h5, bert-base-uncased
// vocabulary): sample layout, the masking statistics (over more than 10^5 tokens the masked
// fraction within 1% of 15% and the 80/10/10 split within 1%), whole-word masking, the
// sentence-order label, determinism, and clear errors for unsuitable shards.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "data_test_helpers.hpp"
#include "data/bert_dataset.hpp"
#include "data/tokenizer.hpp"

using trident::BertData;
using trident::BertMasking;
using trident::BertSample;

namespace {

using trident::test::expect_error_naming;
std::string sample() { return trident::test::sample_dir(); }

constexpr std::int64_t kSeq = 128;

class BertDatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_FALSE(sample().empty()) << "set TRIDENT_SAMPLE_DIR (data/prepare_sample.sh)";
    data_ = new BertData(sample() + "/kjv_bert_*.h5", "98,2,0", kSeq, 4000, 100, 1234, sample() + "/bert/vocab.txt", "",
                         BertMasking{});
    tok_ = trident::make_tokenizer("BertWordPieceLowerCase", sample() + "/bert/vocab.txt", "").release();
  }
  static void TearDownTestSuite() {
    delete data_;
    delete tok_;
  }
  static BertData* data_;
  static trident::Tokenizer* tok_;
};
BertData* BertDatasetTest::data_ = nullptr;
trident::Tokenizer* BertDatasetTest::tok_ = nullptr;

TEST_F(BertDatasetTest, SamplesAreClsASepBSepWithTypesAndPadding) {
  const auto& ds = data_->train();
  ASSERT_GE(ds.size(), 4000);
  const auto sp = data_->specials();
  EXPECT_EQ(sp.cls, 101);
  EXPECT_EQ(sp.sep, 102);
  EXPECT_EQ(sp.mask, 103);
  EXPECT_EQ(sp.pad, 0);
  BertSample s;
  std::int64_t short_samples = 0;
  for (std::int64_t i = 0; i < 2000; ++i) {
    ds.get(i, s);
    ASSERT_EQ(static_cast<std::int64_t>(s.tokens.size()), kSeq);
    std::int64_t len = 0;
    while (len < kSeq && s.padding[len]) ++len;
    for (std::int64_t p = len; p < kSeq; ++p) {
      ASSERT_EQ(s.padding[p], 0) << "sample " << i << ": padding not at the end";
      ASSERT_EQ(s.tokens[p], sp.pad);
      ASSERT_EQ(s.types[p], 0);
      ASSERT_EQ(s.labels[p], -1);
    }
    ASSERT_EQ(s.tokens[0], sp.cls) << "sample " << i;
    ASSERT_EQ(s.tokens[len - 1], sp.sep) << "sample " << i;
    std::vector<std::int64_t> seps;
    for (std::int64_t p = 0; p < len; ++p)
      if (s.tokens[p] == sp.sep && s.labels[p] < 0) seps.push_back(p);
    // a random replacement may also draw [SEP]: only unmasked [SEP]s are the separators
    ASSERT_EQ(seps.size(), 2u) << "sample " << i;
    ASSERT_GE(seps[0], 2) << "sample " << i << ": empty segment A";
    ASSERT_GE(seps[1], seps[0] + 2) << "sample " << i << ": empty segment B";
    for (std::int64_t p = 0; p < len; ++p) ASSERT_EQ(s.types[p], p <= seps[0] ? 0 : 1) << "sample " << i;
    ASSERT_TRUE(s.is_random == 0 || s.is_random == 1);
    if (len - 3 < (kSeq - 3) / 2) ++short_samples;
  }
  // short_seq_prob 0.1 draws the target uniformly: about half of those fall below half the
  // length, and document ends add a few more
  EXPECT_GT(short_samples, 2000 * 0.03);
  EXPECT_LT(short_samples, 2000 * 0.3);
}

TEST_F(BertDatasetTest, MaskingStatisticsAndWholeWords) {
  const auto& ds = data_->train();
  const auto sp = data_->specials();
  BertSample s;
  std::int64_t tokens = 0, masked = 0, as_mask = 0, unchanged = 0, random = 0, is_random = 0, samples = 0;
  for (std::int64_t i = 0; i < ds.size() && tokens < 400000; ++i, ++samples) {
    ds.get(i, s);
    std::int64_t len = 0;
    while (len < kSeq && s.padding[len]) ++len;
    tokens += len;
    is_random += s.is_random;
    for (std::int64_t p = 0; p < len; ++p) {
      const std::int32_t label = s.labels[p];
      if (label < 0) continue;
      ++masked;
      ASSERT_NE(label, sp.cls);
      ASSERT_NE(label, sp.sep);
      if (s.tokens[p] == sp.mask)
        ++as_mask;
      else if (s.tokens[p] == label)
        ++unchanged;
      else
        ++random;
      // whole words: the piece before a masked continuation piece is masked, and so is the
      // continuation piece after a masked one
      auto original = [&](std::int64_t q) { return s.labels[q] >= 0 ? s.labels[q] : s.tokens[q]; };
      if (tok_->continues_word(label) && p > 0 && original(p - 1) != sp.cls && original(p - 1) != sp.sep)
        ASSERT_GE(s.labels[p - 1], 0) << "sample " << i << " position " << p << ": part of a word masked";
      if (p + 1 < len && s.labels[p + 1] < 0 && tok_->continues_word(s.tokens[p + 1]))
        ASSERT_TRUE(false) << "sample " << i << " position " << p + 1 << ": the rest of a masked word is not masked";
    }
  }
  ASSERT_GT(tokens, 100000);
  const double f = static_cast<double>(masked) / static_cast<double>(tokens);
  const double fm = static_cast<double>(as_mask) / masked, fu = static_cast<double>(unchanged) / masked,
               fr = static_cast<double>(random) / masked;
  std::printf("%lld tokens in %lld samples: masked %.4f; of the masked [MASK] %.4f, unchanged %.4f, random %.4f; "
              "sentence order swapped %.4f\n",
              static_cast<long long>(tokens), static_cast<long long>(samples), f, fm, fu, fr,
              static_cast<double>(is_random) / samples);
  EXPECT_NEAR(f, 0.15, 0.01);
  EXPECT_NEAR(fm, 0.8, 0.01);
  EXPECT_NEAR(fu, 0.1, 0.01);
  EXPECT_NEAR(fr, 0.1, 0.01);
  EXPECT_NEAR(static_cast<double>(is_random) / samples, 0.5, 0.03);
}

TEST_F(BertDatasetTest, SamplesAreAPureFunctionOfSeedAndIndex) {
  BertData again(sample() + "/kjv_bert_*.h5", "98,2,0", kSeq, 4000, 100, 1234, sample() + "/bert/vocab.txt", "",
                 BertMasking{});
  BertSample a, b, c;
  for (std::int64_t i : {0, 1, 17, 3999, 123456}) {
    data_->train().get(i, a);
    again.train().get(i, b);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.labels, b.labels);
    EXPECT_EQ(a.types, b.types);
    EXPECT_EQ(a.is_random, b.is_random);
  }
  data_->train().get(0, a);
  data_->train().get(1, c);
  EXPECT_NE(a.tokens, c.tokens);
  ASSERT_NE(data_->valid(), nullptr);
  EXPECT_GE(data_->valid()->size(), 100);
}

TEST_F(BertDatasetTest, UnsuitableShardsFailWithAClearError) {
  // GPT-2 shards: no sentences, no special tokens
  expect_error_naming([] { BertData(sample() + "/kjv_gpt2_*.h5", "1", kSeq, 10, 0, 1, sample() + "/gpt2/encoder.json",
                             sample() + "/gpt2/vocab.bpe", BertMasking{}); },
               "sentence_offsets");
  expect_error_naming([] { BertData(sample() + "/kjv_bert_*.h5", "1", kSeq, 10, 0, 1, "", "", BertMasking{}); },
               "data.vocab_file");
  expect_error_naming([] { BertData(sample() + "/kjv_bert_*.h5", "1", 4, 10, 0, 1, sample() + "/bert/vocab.txt", "",
                             BertMasking{}); },
               "too short");
}

}  // namespace
