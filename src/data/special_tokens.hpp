// Ids of the special tokens BERT and T5 samples are built with (-1: the vocabulary has none).
//   eod: end of document (GPT-2's <|endoftext|>; [SEP] for WordPiece, as in Megatron)
//   cls, sep, mask, pad, unk: BERT's
//   bos, eos: the T5 decoder's start and end ([BOS], [EOS])
//   sentinel .. sentinel + num_sentinels - 1: T5's <extra_id_0> .. <extra_id_{n-1}>
#pragma once
#include <cstdint>

namespace trident {

struct SpecialTokens {
  std::int32_t eod = -1, cls = -1, sep = -1, mask = -1, pad = -1, unk = -1;
  std::int32_t bos = -1, eos = -1, sentinel = -1, num_sentinels = 0;
};

}  // namespace trident
