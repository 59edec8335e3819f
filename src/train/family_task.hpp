// What each model family brings to the generic trainer (train/trainer, docs/DESIGN.md
// "Data flow"): how its samples are encoded into int32 records and staged into a micro-batch,
// how its loss is normalised, and which metric columns it reports. The model itself comes from
// models/model_factory, its loss parts from its head (models/loss_parts).
//   GPT:  windows of S+1 tokens; the loss is the mean over the iteration's tokens.
//   BERT: masked-LM samples with a sentence-order label; the loss is the mean over the
//         iteration's micro-batches of each one's MLM mean plus sentence-order mean, reported
//         with both parts (lm_loss, sop_loss).
//   T5:   span-corruption samples for the encoder-decoder; the mean over the micro-batches of
//         each one's mean over its decoder targets (Megatron's T5).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/device_parallel.hpp"
#include "common/stream_mark.hpp"
#include "data/token_shard.hpp"
#include "io/deck.hpp"
#include "models/micro_batch.hpp"
#include "models/model_factory.hpp"

namespace trident {

// Host staging of one micro-batch: B sample records of `width` ints each ->
//   GPT  (width S+1, a window): inputs window[0..S), targets window[1..S]
//   GPT instruction fine-tuning (width 3S; data/sft_dataset.hpp): inputs, targets (-1: no loss)
//        and each position's conversation (-1: padding); packing restarts positions and
//        attention at each conversation (data.reset_position_ids / reset_attention_mask)
//   BERT (width 4S+1): tokens, types, labels, padding (S each), then the sentence-order label
//   T5   (width 2S+2Sd): encoder tokens, encoder padding (S each), decoder input, decoder
//        targets (Sd each; -1 at padding)
struct Batch {
  Batch(std::int64_t B, std::int64_t S, ModelFamily family, std::int64_t Sd = 0, bool sft = false)
      : B(B), S(S), Sd(Sd), bert(family == ModelFamily::Bert), t5(family == ModelFamily::T5),
        sft(sft && family == ModelFamily::Gpt), width(bert  ? 4 * S + 1
                                                      : t5  ? 2 * S + 2 * Sd
                                                      : sft ? 3 * S
                                                            : S + 1),
        window(static_cast<size_t>(B * width)) {
    for (Staging& s : stage_) {
      s.h_tokens = StagingView("batch::h_tokens", B * S);
      s.h_targets = StagingView("batch::h_targets", B * (t5 ? Sd : S));
      s.h_types = StagingView("batch::h_types", B * S);
      s.h_padding = StagingView("batch::h_padding", B * S);
      s.h_order = StagingView("batch::h_order", B);
      s.h_dec = StagingView("batch::h_dec", B * Sd);
      s.h_padding_len = StagingView("batch::h_padding_len", B);
      if constexpr (kDeviceKernels) {
        s.h_token_order = StagingView("batch::h_token_order", B * S);
        s.h_position_order = StagingView("batch::h_position_order", B * S);
      }
    }
  }
  // Checks every token id against the vocabulary and copies the records of `window` into mb's
  // device views (and mb's label counts). The copies are queued behind the device's work (no
  // wait) from one of two staging buffers in turn, pinned host memory in a CUDA build; a buffer
  // is refilled once the device has passed its last upload (waiting only if the host ran two
  // micro-batches ahead).
  void finish(std::int64_t vocab, MicroBatch& mb);
  std::int64_t B, S, Sd;
  bool bert, t5, sft;
  std::int64_t width;
  std::vector<std::int32_t> window;
  // GPT: the leading targets of sample j that carry no loss (target -1; strided evaluation scores
  // only what the previous window did not); empty: every target counts
  std::vector<std::int64_t> unscored;
  // GPT, document-aware packing (deck data.reset_*, data.eod_mask_loss; Megatron's
  // get_ltor_masks_and_position_ids): a document ends with its end-of-document token `eod`;
  // positions restart after it, a token's first attended key is its document's first position,
  // and with eod_mask_loss the prediction made at an end-of-document input carries no loss.
  struct Packing {
    bool reset_position_ids = false, reset_attention_mask = false, eod_mask_loss = false;
    std::int32_t eod = -1;
  } packing;
  // Sets `packing` (GPT) and its host staging; eod: the corpus's end-of-document id (unused by
  // instruction fine-tuning, whose records mark the conversations).
  void set_packing(bool reset_position_ids, bool reset_attention_mask, bool eod_mask_loss, std::int64_t eod);
  // GPT under context parallelism (cp > 1): finish() reads whole samples as before and hands the
  // model only this context-parallel rank's rows (the zig-zag chunks rank and 2 cp - 1 - rank of
  // ops/ring_attention.hpp), with every row's position (its global position, or its position in
  // its document with data.reset_position_ids) and, with data.reset_attention_mask, its
  // document's first global position. The label count stays the whole samples' (every
  // context-parallel rank reads them whole), so a per-micro-batch loss is normalised alike on
  // every rank and the ranks' sums add up to the one-rank loss.
  void set_context_parallel(int cp, int rank);
  int cp = 1, cp_rank = 0;
  // Host memory of the uploads: pinned in a CUDA build, so that a copy to the device is queued.
#if defined(KOKKOS_ENABLE_CUDA)
  using StagingSpace = Kokkos::CudaHostPinnedSpace;
#else
  using StagingSpace = Kokkos::HostSpace;
#endif
  using StagingView = Kokkos::View<std::int32_t*, Kokkos::LayoutRight, StagingSpace>;
  struct Staging {
    StagingView l_tokens, l_targets, l_positions, l_doc_start;  // this rank's rows (cp > 1)
    StagingView h_tokens, h_targets, h_types, h_padding, h_order, h_dec, h_positions, h_doc_start;
    StagingView h_token_order, h_position_order;  // MicroBatch::token_order, position_order (device kernels)
    StagingView h_padding_len;                    // MicroBatch::padding_len
    StreamMark uploaded;                          // after this buffer's last copies
  };

 private:
  Staging stage_[2];
  int next_ = 0;
  // Device kernels: uploads into `order` (when sized n) the rows of keys[0, n) sorted by key, ties by
  // row, staged in `staged`; returns whether it did.
  bool upload_order(const StagingView& keys, std::int64_t n, const StagingView& staged, const IntView& order);
  // Uploads into `len` (when sized B: the models of device kernels size it) each sample's count of
  // valid positions of the padding mask `pad` (B x S), staged in `staged`, where every sample's
  // valid positions are a prefix of at least one; returns whether it did.
  bool upload_padding_lengths(const StagingView& pad, const StagingView& staged, const IntView& len);
  std::vector<std::uint64_t> sort_keys_;
};

// The samples of a run, as int32 records of Batch's width.
struct SampleSource {
  std::function<void(std::int64_t, std::int32_t*)> train, valid;  // sample i; valid may be empty
  std::int64_t vocab = 0;
  std::int64_t eod = -1;  // GPT: the corpus's end-of-document id (-1: none recorded)
  bool sft = false;       // GPT instruction fine-tuning records (width 3S)
  std::string description;
};

// One tokenizer per run: when the deck names a tokenizer (data.tokenizer_type and its files, or
// the vocabulary files data.vocab_file / data.merges_file), every shard of data.train_shards must
// record that tokenizer, its vocabulary size and, from format_version 3, its files' digest; else
// one error naming the shard and both tokenizers, before training. A deck that names none takes
// the shards' own (Corpus checks that they agree).
void check_shard_tokenizers(const Deck& deck);
// The tokenizer of Megatron indexed datasets named in the deck (data.tokenizer_type, vocab_file,
// merges_file, vocab_extra_ids, tokenizer_model); nullopt when data.tokenizer_type is empty.
std::optional<TokenShardMeta> indexed_description(const Deck& deck);

// The samples of a family's dataset over deck.data.train_shards (train_samples for training,
// valid_samples from the validation split); keep owns the dataset the functions read.
SampleSource samples_of(ModelFamily f, const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                        std::shared_ptr<void>& keep);

struct FamilyTask {
  ModelFamily family;
  const char* banner;  // "GPT", "BERT", "T5": the start-up summary's first word
  // the loss of an iteration: the mean over its micro-batches of each one's mean (BERT, T5),
  // else the mean over its tokens (GPT)
  bool loss_per_micro_batch;
  // lm_loss and sop_loss columns and log fields beside the loss (BERT); else the perplexity in
  // the evaluation rows
  bool reports_loss_parts;
  // metrics.csv columns (docs/DESIGN.md "Metrics") and those of metrics.eval.csv
  std::vector<std::string> train_columns() const;
  std::vector<std::string> eval_columns() const;
};

const FamilyTask& task_of(ModelFamily f);

}  // namespace trident
