// The evaluation mode (eval.only, docs/DESIGN.md "Evaluation mode"): a checkpoint scored on
// eval.shard without dropout, under any parallel layout.
#include "train/evaluation.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>

#include "comm/agreement.hpp"
#include "common/error.hpp"
#include "data/eval_text.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/token_shard.hpp"
#include "data/tokenizer.hpp"
#include "checkpoint/checkpoint.hpp"
#include "io/hdf5_handle.hpp"
#include "train/debug_dumps.hpp"
#include "train/family_task.hpp"
#include "train/model_setup.hpp"
#include "train/pipeline.hpp"

namespace trident {

namespace {

// The model of the evaluation mode, loaded from checkpoint.load, and its pipeline runner.
// Samples are dealt round-robin in blocks of micro_batch_size over the data-parallel ranks
// (the ranks of a tensor-parallel group score the same block together): block i of this rank
// starts at sample (dp_rank + i * dp) * B.
struct EvalModel {
  EvalModel(const Deck& run_deck, const Topology& topo, std::int64_t vocab, ModelFamily family)
      : file(resolve_checkpoint(run_deck.checkpoint.load)),
        // a checkpoint of LoRA adapters brings its lora.* keys (its base model loads beneath them)
        deck(with_checkpoint_lora(run_deck, file, family_name(family), topo)),
        cfg(make_config(deck, vocab, topo.tp_size(), family)), B(deck.train.micro_batch_size), dp(&topo.dp_group()) {
    // evaluation mode scores a text (or shard) as one stream of windows: the training deck's
    // document packing (data.reset_*, data.eod_mask_loss) does not apply (docs/DESIGN.md
    // "Evaluation mode")
    cfg.reset_position_ids = cfg.reset_attention_mask = cfg.per_target_loss = false;
    store.set_dtype(cfg.dt);
    chunks = build_chunks(family, cfg, head_options(deck), store, B, tensor_parallel(deck, topo),
                          chunks_of(deck, topo, cfg));
    store.allocate();
    // the same model as the deck describes (head counts and layers with the same tensor shapes
    // would otherwise load silently), as training and fine-tuning require
    state = load_model_weights(file, family_name(family), family, cfg, head_options(deck), vocab, store, topo);
    if (store.has_adapters() && topo.world().rank() == 0)
      std::cout << "LoRA adapters (rank " << deck.lora.rank << ", " << deck.lora.targets << ") of " << file
                << " over the base model " << state.lora_base << std::endl;
    runner = std::make_unique<PipelineRunner>(raw(chunks), topo);
    runner->grouped_p2p = deck.debug.grouped_p2p;
  }
  // blocks of B samples this rank scores out of n
  std::int64_t blocks(std::int64_t n) const {
    const std::int64_t nblocks = (n + B - 1) / B;
    return nblocks > dp->rank() ? (nblocks - 1 - dp->rank()) / dp->size() + 1 : 0;
  }
  std::string file;
  Deck deck;
  TransformerConfig cfg;
  std::int64_t B;
  const Communicator* dp;
  ParamStore store;
  std::vector<std::unique_ptr<LanguageModel>> chunks;
  CheckpointState state;
  std::unique_ptr<PipelineRunner> runner;
};

// BERT's and T5's evaluation mode: the first eval.windows samples of the dataset built from
// every document of eval.shard (train.seed, the deck's [bert] or [t5] masking), without
// dropout; the loss is the LM cross-entropy averaged over all labelled positions (T5: decoder
// targets) plus, for BERT, the sentence-order cross-entropy averaged over the samples
// (independent of the micro-batch size and layout).
int run_masked_eval_only(const Deck& deck, const Topology& topo, ModelFamily family) {
  const Communicator& world = topo.world();
  const std::int64_t S = deck.model.seq_length, N = deck.eval.windows, B = deck.train.micro_batch_size;
  TRIDENT_REQUIRE(N > 0, "eval.windows must be > 0 in evaluation mode (samples to score)");
  TRIDENT_REQUIRE(deck.eval.stride == 0, "eval.stride applies to GPT's evaluation (BERT and T5 score samples)");
  SampleSource data;
  std::shared_ptr<void> owner;
  collectively(world.get(), [&] {
    Deck d = deck;
    d.data.train_shards = deck.eval.shard;
    d.data.split = "1";
    d.sft = Deck::Sft{};  // eval.shard is scored as text or tokens, whatever the deck fine-tuned on
    data = samples_of(family, d, N, 0, owner);
  });
  EvalModel m(deck, topo, data.vocab, family);
  const bool t5 = family == ModelFamily::T5;
  const std::int64_t Sd = deck.model.decoder_seq_length;
  Batch batch(B, S, family, Sd);
  if (!deck.debug.dump_batches.empty()) {
    // the N scored samples, as training dumps its batches (/iter_0000000, one row per sample),
    // for references that score the same samples (validation/hf_models.py)
    std::vector<std::int32_t> rows;
    if (world.rank() == 0) {
      rows.resize(static_cast<size_t>(N * batch.width));
      for (std::int64_t k = 0; k < N; ++k) data.train(k, rows.data() + k * batch.width);
    }
    collectively(world.get(), [&] {
      if (world.rank() == 0) BatchDumper(deck.debug.dump_batches, false).write(0, rows, N, batch.width);
    });
  }
  const Communicator& dpg = topo.dp_group();
  m.runner->evaluate(
      m.blocks(N),
      [&](std::int64_t i, MicroBatch& mb) {
        const std::int64_t first = (dpg.rank() + i * dpg.size()) * B;
        for (std::int64_t j = 0; j < B; ++j) {
          std::int32_t* w = batch.window.data() + j * batch.width;
          data.train(std::min(first + j, N - 1), w);
          if (first + j >= N && t5) {  // padding of a short last block: nothing of it counts
            std::fill(w + 2 * S + Sd, w + 2 * S + 2 * Sd, -1);
          } else if (first + j >= N) {
            std::fill(w + 2 * S, w + 3 * S, -1);
            w[4 * S] = -1;
          }
        }
        batch.finish(data.vocab, mb);
      },
      [&](std::int64_t) { return B; });
  const LossParts l = reduce_loss_parts(m.chunks, topo);
  const double mlm = l.lm_sum / std::max(l.lm_count, 1.0), sop = l.sop_sum / std::max(l.sop_count, 1.0);
  if (world.rank() == 0) {
    std::cout << "evaluated checkpoint " << m.file << " (iteration " << m.state.iteration << ") on " << deck.eval.shard
              << ": " << N << " samples of " << S << " tokens, " << static_cast<std::int64_t>(l.lm_count)
              << " labelled positions\n";
    const bool with_sop = family == ModelFamily::Bert && deck.bert.binary_head;
    std::cout << std::setprecision(8) << "eval loss: " << mlm + (with_sop ? sop : 0.0) << "\n";
    std::cout << "eval lm loss: " << mlm << std::endl;
    if (with_sop) std::cout << "eval sop loss: " << sop << std::endl;
  }
  return 0;
}

int run_eval_only(const Deck& deck, const Topology& topo) {
  const Communicator& world = topo.world();
  const std::int64_t S = deck.model.seq_length, N = deck.eval.windows, B = deck.train.micro_batch_size;
  const std::int64_t stride = deck.eval.stride > 0 ? deck.eval.stride : S;
  // what is scored: a token corpus, or text tokenized here; the GPT-2 tokenizer (when the deck
  // names its files) also gives the bytes behind the tokens, for bits per byte
  std::unique_ptr<TokenShardReader> shard;
  std::unique_ptr<Tokenizer> tok;
  TokenizedText text;
  bool from_text = false;
  collectively(world.get(), [&] {
    from_text = is_text_file(deck.eval.shard);
    const std::string type = deck.data.tokenizer_type.empty() ? "GPT2BPETokenizer" : deck.data.tokenizer_type;
    if (!deck.data.tokenizer_model.empty() ||
        (!deck.data.vocab_file.empty() && (type != "GPT2BPETokenizer" || !deck.data.merges_file.empty())))
      tok = make_tokenizer(type, deck.data.vocab_file, deck.data.merges_file,
                           static_cast<int>(deck.data.vocab_extra_ids), deck.data.tokenizer_model);
    if (from_text) {
      TRIDENT_REQUIRE(tok, "eval.shard '" << deck.eval.shard
                                          << "' is text: tokenizing it needs data.vocab_file and data.merges_file "
                                             "(GPT-2 BPE; or data.tokenizer_type and its files)");
      text = tokenize_text_file(deck.eval.shard, *tok, deck.eval.json_key);
    } else {
      const auto indexed = indexed_description(deck);
      shard = std::make_unique<TokenShardReader>(deck.eval.shard, indexed ? &*indexed : nullptr);
    }
  });
  const std::int64_t num_tokens = from_text ? static_cast<std::int64_t>(text.tokens.size()) : shard->meta().num_tokens;
  const std::int64_t vocab = deck.model.vocab_size > 0 ? deck.model.vocab_size
                             : from_text               ? tok->vocab_size()
                                                       : shard->meta().vocab_size;
  const std::int64_t last = (N - 1) * stride + S;  // the last target; targets 1..last are scored once each
  TRIDENT_REQUIRE(last + 1 <= num_tokens,
                  "eval.windows = " << N << " windows of " << S + 1 << " tokens" << (stride < S ? " every " : "")
                                    << (stride < S ? std::to_string(stride) + " tokens" : std::string()) << " need "
                                    << last + 1 << " tokens, but '" << deck.eval.shard << "' has " << num_tokens);
  auto read = [&](std::int64_t offset, std::int64_t n, std::int32_t* out) {
    if (from_text)
      std::copy(text.tokens.begin() + offset, text.tokens.begin() + offset + n, out);
    else
      shard->read(offset, n, out);
  };
  EvalModel m(deck, topo, vocab, ModelFamily::Gpt);
  Batch batch(B, S, ModelFamily::Gpt);
  batch.unscored.assign(static_cast<size_t>(B), 0);
  double loss_sum = 0;
  const Communicator& dpg = topo.dp_group();
  auto block_count = [&](std::int64_t i) {
    const std::int64_t first = (dpg.rank() + i * dpg.size()) * B;
    return std::min(B, N - first);
  };
  loss_sum = m.runner->evaluate(
      m.blocks(N),
      [&](std::int64_t i, MicroBatch& mb) {
        const std::int64_t first = (dpg.rank() + i * dpg.size()) * B, count = block_count(i);
        for (std::int64_t j = 0; j < B; ++j) {
          const std::int64_t k = first + std::min(j, count - 1);  // pad a short last block with its last window
          read(k * stride, S + 1, batch.window.data() + j * (S + 1));
          batch.unscored[static_cast<size_t>(j)] = k == 0 ? 0 : S - stride;
        }
        batch.finish(vocab, mb);
      },
      block_count);
  loss_sum = dpg.allreduce_sum(topo.pp_group().allreduce_sum(loss_sum));
  const double loss = loss_sum / static_cast<double>(last);
  // bits per byte: the loss in bits over the UTF-8 bytes of the scored tokens (GPT-2 BPE: each
  // token's bytes; the end-of-document token has none)
  std::int64_t bytes = -1;
  const auto* bpe = dynamic_cast<const Gpt2Tokenizer*>(tok.get());
  if (world.rank() == 0 && bpe && bpe->vocab_size() == vocab) {
    bytes = 0;
    std::vector<std::int32_t> ids(static_cast<size_t>(std::min<std::int64_t>(last, 1 << 20)));
    for (std::int64_t at = 1; at <= last; at += static_cast<std::int64_t>(ids.size())) {
      const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), last + 1 - at);
      read(at, n, ids.data());
      for (std::int64_t i = 0; i < n; ++i)
        if (ids[static_cast<size_t>(i)] != bpe->eod_id())
          bytes += static_cast<std::int64_t>(bpe->token_bytes(ids[static_cast<size_t>(i)]).size());
    }
  }
  if (world.rank() == 0) {
    std::cout << "evaluated checkpoint " << m.file << " (iteration " << m.state.iteration << ") on " << deck.eval.shard;
    if (from_text) std::cout << " (" << text.documents << " documents tokenized, " << num_tokens << " tokens)";
    std::cout << ": " << N << " windows of " << S << " tokens";
    if (stride < S) std::cout << ", stride " << stride << " (each window scores its last " << stride << " targets)";
    std::cout << "\n";
    std::cout << "eval tokens: " << last << "\n";
    std::cout << std::setprecision(8) << "eval loss: " << loss << "\n";
    std::cout << "eval perplexity: " << std::exp(loss) << "\n";
    if (bytes > 0)
      std::cout << "eval bits per byte: " << loss_sum / std::log(2.0) / static_cast<double>(bytes) << " (" << bytes
                << " bytes)\n";
    else
      std::cout
          << "eval bits per byte: - (data.vocab_file and data.merges_file, the GPT-2 BPE files, give the bytes)\n";
    std::cout << std::flush;
  }
  return 0;
}

}  // namespace

int run_evaluation(const Deck& deck, const Topology& topo, ModelFamily family) {
  return family == ModelFamily::Gpt ? run_eval_only(deck, topo) : run_masked_eval_only(deck, topo, family);
}

}  // namespace trident
