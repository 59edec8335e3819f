// One micro-batch on the device, as the models consume it.
//   GPT:  tokens (B*T) and targets (B*T), the next tokens (-1: no loss); num_targets = the
//         targets counted; packed documents: positions and doc_start (below).
//   BERT: tokens with masking applied, targets = the MLM labels (-1 where nothing is
//         predicted), token types, the padding mask (1 real token, 0 padding) and the
//         sentence-order labels (B; -1: not counted); num_targets = positions with a label
//         and num_sentences = samples with a sentence-order label (host counts: the losses
//         are means over them).
//   T5:   tokens = the encoder input (B*Te) with its padding mask, dec_tokens the decoder input
//         (B*Td), targets the decoder targets (-1 at padding), num_targets = targets counted.
#pragma once
#include "common/types.hpp"

namespace trident {

struct MicroBatch {
  IntView tokens, targets;
  IntView types, padding;  // empty for GPT
  IntView sentence_order;  // (B), BERT
  IntView dec_tokens;      // (B*Td), T5
  // GPT with packed documents (data.reset_position_ids / reset_attention_mask; empty otherwise):
  // each token's position within its document, and its document's first position in the sample
  IntView positions, doc_start;  // (B*T)
  // Device kernels only (kDeviceKernels; empty on the host): the rows of tokens, and of positions
  // where given, sorted by their value, ties by row, computed by the host as it stages the
  // micro-batch, so that the embedding backward gives each table row its own threads
  // (ops/embedding.hpp). Filled by every upload (train/family_task.hpp Batch::finish).
  IntView token_order, position_order;                   // as tokens, positions
  bool token_ordered = false, position_ordered = false;  // whether this upload filled them
  // Device kernels, padding-masked models: the padding as one length per sample (B), where every
  // sample's valid positions are a prefix of at least one (cuDNN's padding mask; ops/sdpa.hpp), and
  // whether this upload filled it.
  IntView padding_len;
  bool padding_lengths = false;
  std::int64_t num_targets = 0, num_sentences = 0;
};

}  // namespace trident
