// The model families' tasks (train/family_task.hpp): sample encoding and staging, loss
// normalisation, metric columns.
#include "train/family_task.hpp"

#include <algorithm>
#include <map>
#include <memory>

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "data/bert_dataset.hpp"
#include "data/gpt_dataset.hpp"
#include "data/sft_dataset.hpp"
#include "data/t5_dataset.hpp"
#include "data/tokenizer.hpp"

namespace trident {

bool Batch::upload_order(const StagingView& keys, std::int64_t n, const StagingView& staged, const IntView& order) {
  if (static_cast<std::int64_t>(order.extent(0)) != n || n == 0) return false;
  sort_keys_.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)  // keys are checked ids and positions: >= 0
    sort_keys_[static_cast<std::size_t>(i)] = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(keys(i))) << 32) |
                                              static_cast<std::uint64_t>(i);
  std::sort(sort_keys_.begin(), sort_keys_.end());
  for (std::int64_t i = 0; i < n; ++i)
    staged(i) = static_cast<std::int32_t>(sort_keys_[static_cast<std::size_t>(i)] & 0xffffffffu);
  device_copy(order, Kokkos::subview(staged, std::make_pair(std::int64_t{0}, n)));
  return true;
}

bool Batch::upload_padding_lengths(const StagingView& pad, const StagingView& staged, const IntView& len) {
  if (static_cast<std::int64_t>(len.extent(0)) != B) return false;
  for (std::int64_t j = 0; j < B; ++j) {
    std::int64_t n = 0;
    while (n < S && pad(j * S + n) != 0) ++n;
    if (n == 0) return false;
    for (std::int64_t t = n; t < S; ++t)
      if (pad(j * S + t) != 0) return false;  // a hole: not a prefix
    staged(j) = static_cast<std::int32_t>(n);
  }
  device_copy(len, Kokkos::subview(staged, std::make_pair(std::int64_t{0}, B)));
  return true;
}

void Batch::finish(std::int64_t vocab, MicroBatch& mb) {
  Staging& st = stage_[next_];
  next_ ^= 1;
  if (st.uploaded.recorded() && !st.uploaded.passed()) st.uploaded.wait();
  mb.token_ordered = mb.position_ordered = mb.padding_lengths = false;
  auto check = [&](std::int32_t id) {
    if (id < 0 || id >= vocab)
      throw Error::one("data: token id " + std::to_string(id) + " is outside the vocabulary of " +
                       std::to_string(vocab));
  };
  std::int64_t labelled = 0, ordered = 0;
  for (std::int64_t j = 0; j < B && t5; ++j) {
    const std::int32_t* w = window.data() + j * width;
    for (std::int64_t t = 0; t < S; ++t) {
      check(w[t]);
      st.h_tokens(j * S + t) = w[t];
      st.h_padding(j * S + t) = w[S + t];
    }
    for (std::int64_t t = 0; t < Sd; ++t) {
      const std::int32_t in = w[2 * S + t], target = w[2 * S + Sd + t];
      check(in);
      if (target >= 0) {
        check(target);
        ++labelled;
      }
      st.h_dec(j * Sd + t) = in;
      st.h_targets(j * Sd + t) = target;
    }
  }
  if (t5) {
    device_copy(mb.tokens, st.h_tokens);
    mb.token_ordered = upload_order(st.h_tokens, B * S, st.h_token_order, mb.token_order);
    device_copy(mb.padding, st.h_padding);
    mb.padding_lengths = upload_padding_lengths(st.h_padding, st.h_padding_len, mb.padding_len);
    device_copy(mb.dec_tokens, st.h_dec);
    device_copy(mb.targets, st.h_targets);
    mb.num_targets = labelled;
    st.uploaded = StreamMark::record();
    return;
  }
  const Packing& pk = packing;
  for (std::int64_t j = 0; j < B && sft; ++j) {
    const std::int32_t *w = window.data() + j * width, *target = w + S, *segment = w + 2 * S;
    std::int64_t doc = 0;
    for (std::int64_t t = 0; t < S; ++t) {
      check(w[t]);
      st.h_tokens(j * S + t) = w[t];
      if (target[t] >= 0) {
        check(target[t]);
        ++labelled;
      }
      st.h_targets(j * S + t) = target[t];
      if (t > 0 && segment[t] != segment[t - 1]) doc = t;  // a conversation (or the padding) starts
      if (pk.reset_position_ids) st.h_positions(j * S + t) = static_cast<std::int32_t>(t - doc);
      if (pk.reset_attention_mask) st.h_doc_start(j * S + t) = static_cast<std::int32_t>(doc);
    }
  }
  for (std::int64_t j = 0; j < B && !sft; ++j) {
    const std::int32_t* w = window.data() + j * width;
    std::int64_t doc = 0;  // the first position of the current document
    for (std::int64_t t = 0; t < S; ++t) {
      if (!bert) {
        check(w[t]);
        check(w[t + 1]);
        st.h_tokens(j * S + t) = w[t];
        const bool scored = unscored.empty() || t >= unscored[static_cast<size_t>(j)];
        const bool at_eod = w[t] == pk.eod;
        st.h_targets(j * S + t) = scored && !(pk.eod_mask_loss && at_eod) ? w[t + 1] : -1;
        if (st.h_targets(j * S + t) >= 0) ++labelled;
        if (pk.reset_position_ids) st.h_positions(j * S + t) = static_cast<std::int32_t>(t - doc);
        if (pk.reset_attention_mask) st.h_doc_start(j * S + t) = static_cast<std::int32_t>(doc);
        if (at_eod) doc = t + 1;  // the end-of-document token closes its document
        continue;
      }
      check(w[t]);
      if (w[2 * S + t] >= 0) {
        check(w[2 * S + t]);
        ++labelled;
      }
      st.h_tokens(j * S + t) = w[t];
      st.h_types(j * S + t) = w[S + t];
      st.h_targets(j * S + t) = w[2 * S + t];
      st.h_padding(j * S + t) = w[3 * S + t];
    }
    if (bert) {
      st.h_order(j) = w[4 * S];
      if (w[4 * S] >= 0) ++ordered;
    }
  }
  if (!bert && cp > 1) {
    const std::int64_t Sl = S / cp, c = Sl / 2;
    for (std::int64_t j = 0; j < B; ++j)
      for (std::int64_t t = 0; t < Sl; ++t) {
        const std::int64_t g = t < c ? cp_rank * c + t : (2 * cp - 1 - cp_rank) * c + (t - c);
        st.l_tokens(j * Sl + t) = st.h_tokens(j * S + g);
        st.l_targets(j * Sl + t) = st.h_targets(j * S + g);
        st.l_positions(j * Sl + t) = pk.reset_position_ids ? st.h_positions(j * S + g) : static_cast<std::int32_t>(g);
        if (pk.reset_attention_mask) st.l_doc_start(j * Sl + t) = st.h_doc_start(j * S + g);
      }
    device_copy(mb.tokens, st.l_tokens);
    device_copy(mb.targets, st.l_targets);
    device_copy(mb.positions, st.l_positions);
    mb.token_ordered = upload_order(st.l_tokens, B * Sl, st.h_token_order, mb.token_order);
    mb.position_ordered = upload_order(st.l_positions, B * Sl, st.h_position_order, mb.position_order);
    if (pk.reset_attention_mask) device_copy(mb.doc_start, st.l_doc_start);
    mb.num_targets = labelled;  // the whole samples' (see set_context_parallel)
    st.uploaded = StreamMark::record();
    return;
  }
  device_copy(mb.tokens, st.h_tokens);
  device_copy(mb.targets, st.h_targets);
  mb.token_ordered = upload_order(st.h_tokens, B * S, st.h_token_order, mb.token_order);
  if (!bert) {
    if (pk.reset_position_ids) {
      device_copy(mb.positions, st.h_positions);
      mb.position_ordered = upload_order(st.h_positions, B * S, st.h_position_order, mb.position_order);
    }
    if (pk.reset_attention_mask) device_copy(mb.doc_start, st.h_doc_start);
    mb.num_targets = labelled;
    st.uploaded = StreamMark::record();
    return;
  }
  device_copy(mb.types, st.h_types);
  device_copy(mb.padding, st.h_padding);
  mb.padding_lengths = upload_padding_lengths(st.h_padding, st.h_padding_len, mb.padding_len);
  device_copy(mb.sentence_order, st.h_order);
  mb.num_targets = labelled;
  mb.num_sentences = ordered;
  st.uploaded = StreamMark::record();
}

void Batch::set_packing(bool reset_position_ids, bool reset_attention_mask, bool eod_mask_loss, std::int64_t eod) {
  TRIDENT_REQUIRE(!bert && !t5, "internal: document-aware packing is GPT's");
  TRIDENT_REQUIRE(sft || !(reset_position_ids || reset_attention_mask || eod_mask_loss) || eod >= 0,
                  "data: data.reset_position_ids, data.reset_attention_mask and data.eod_mask_loss need the corpus's "
                  "end-of-document token, and the shards record none (eod_id)");
  packing = Packing{reset_position_ids, reset_attention_mask, eod_mask_loss, static_cast<std::int32_t>(eod)};
  for (Staging& st : stage_) {
    if (reset_position_ids) st.h_positions = StagingView("batch::h_positions", B * S);
    if (reset_attention_mask) st.h_doc_start = StagingView("batch::h_doc_start", B * S);
  }
}

void Batch::set_context_parallel(int cp_size, int rank) {
  TRIDENT_REQUIRE(!bert && !t5, "internal: context parallelism serves GPT");
  TRIDENT_REQUIRE(S % (2 * cp_size) == 0, "internal: seq_length " << S << " over 2 x cp = " << 2 * cp_size);
  cp = cp_size;
  cp_rank = rank;
  const std::int64_t rows = B * S / cp;
  for (Staging& st : stage_) {
    st.l_tokens = StagingView("batch::l_tokens", rows);
    st.l_targets = StagingView("batch::l_targets", rows);
    st.l_positions = StagingView("batch::l_positions", rows);
    if (packing.reset_attention_mask) st.l_doc_start = StagingView("batch::l_doc_start", rows);
  }
}

namespace {

SampleSource gpt_samples(const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                         std::shared_ptr<void>& keep) {
  const auto indexed = indexed_description(deck);
  auto data = std::make_shared<GptData>(deck.data.train_shards, deck.data.split, deck.model.seq_length, train_samples,
                                        valid_samples, static_cast<std::uint64_t>(deck.train.seed),
                                        indexed ? &*indexed : nullptr, deck.data.index_cache);
  keep = data;
  SampleSource src;
  src.train = [d = data.get()](std::int64_t i, std::int32_t* out) { d->train().get(i, out); };
  if (data->valid()) src.valid = [d = data.get()](std::int64_t i, std::int32_t* out) { d->valid()->get(i, out); };
  src.vocab = data->vocab_size();
  src.eod = data->eod_id();
  src.description = data->describe();
  return src;
}

// Instruction fine-tuning: the packed conversations of sft.train_data / sft.valid_data.
SampleSource sft_samples(const Deck& deck, std::int64_t valid_samples, std::shared_ptr<void>& keep) {
  SftOptions o;
  o.seq_length = deck.model.seq_length;
  o.truncate = deck.sft.overlong == "truncate";
  o.seed = static_cast<std::uint64_t>(deck.train.seed);
  auto data = std::make_shared<SftData>(deck.sft.train_data, valid_samples > 0 ? deck.sft.valid_data : std::string(),
                                        deck.data.tokenizer_model, o);
  keep = data;
  SampleSource src;
  src.train = [d = data.get()](std::int64_t i, std::int32_t* out) { d->train().get(i, out); };
  if (data->valid()) src.valid = [d = data.get()](std::int64_t i, std::int32_t* out) { d->valid()->get(i, out); };
  src.vocab = data->vocab_size();
  src.sft = true;
  src.description = data->describe();
  return src;
}

// A sample record: each field copied to `out` + its offset.
void write_fields(std::int32_t* out,
                  std::initializer_list<std::pair<const std::vector<std::int32_t>*, std::int64_t>> fields) {
  for (const auto& [field, at] : fields) std::copy(field->begin(), field->end(), out + at);
}

// The samples of a BERT or T5 dataset pair (train, optional valid), each record written by
// encode(dataset, i, out).
template <class Data, class Encode>
SampleSource masked_source(const std::shared_ptr<Data>& data, Encode encode) {
  SampleSource src;
  src.train = [d = data.get(), encode](std::int64_t i, std::int32_t* out) { encode(d->train(), i, out); };
  if (data->valid())
    src.valid = [d = data.get(), encode](std::int64_t i, std::int32_t* out) { encode(*d->valid(), i, out); };
  src.vocab = data->vocab_size();
  src.description = data->describe() + "\n";
  return src;
}

SampleSource bert_samples(const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                          std::shared_ptr<void>& keep) {
  BertMasking m;
  m.masked_lm_prob = deck.bert.mask_prob;
  m.short_seq_prob = deck.bert.short_seq_prob;
  m.max_ngrams = static_cast<int>(deck.bert.max_ngrams);
  m.binary_head = deck.bert.binary_head;
  const auto indexed = indexed_description(deck);
  auto data = std::make_shared<BertData>(deck.data.train_shards, deck.data.split, deck.model.seq_length, train_samples,
                                         valid_samples, static_cast<std::uint64_t>(deck.train.seed),
                                         deck.data.vocab_file, deck.data.merges_file, m, indexed ? &*indexed : nullptr);
  keep = data;
  const std::int64_t S = deck.model.seq_length;
  auto encode = [S](const BertDataset& ds, std::int64_t i, std::int32_t* out) {
    thread_local BertSample smp;  // the prefetcher's thread and the main thread each have one
    ds.get(i, smp);
    write_fields(out, {{&smp.tokens, 0}, {&smp.types, S}, {&smp.labels, 2 * S}, {&smp.padding, 3 * S}});
    out[4 * S] = smp.is_random;
  };
  return masked_source(data, encode);
}

SampleSource t5_samples(const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                        std::shared_ptr<void>& keep) {
  TRIDENT_REQUIRE(deck.model.decoder_seq_length > 0, "deck: model.decoder_seq_length must be > 0 for T5");
  T5Masking m;
  m.masked_prob = deck.t5.mask_prob;
  m.short_seq_prob = deck.t5.short_seq_prob;
  m.max_ngrams = static_cast<int>(deck.t5.max_ngrams);
  m.geometric_p = deck.t5.geometric_p;
  const auto indexed = indexed_description(deck);
  auto data = std::make_shared<T5Data>(deck.data.train_shards, deck.data.split, deck.model.seq_length,
                                       deck.model.decoder_seq_length, train_samples, valid_samples,
                                       static_cast<std::uint64_t>(deck.train.seed), deck.data.vocab_file,
                                       deck.data.merges_file, m, indexed ? &*indexed : nullptr);
  keep = data;
  const std::int64_t S = deck.model.seq_length, Sd = deck.model.decoder_seq_length;
  auto encode = [S, Sd](const T5Dataset& ds, std::int64_t i, std::int32_t* out) {
    thread_local T5Sample smp;  // the prefetcher's thread and the main thread each have one
    ds.get(i, smp);
    write_fields(out, {{&smp.enc, 0}, {&smp.enc_padding, S}, {&smp.dec_in, 2 * S}, {&smp.dec_target, 2 * S + Sd}});
  };
  return masked_source(data, encode);
}

}  // namespace

std::optional<TokenShardMeta> indexed_description(const Deck& deck) {
  return indexed_dataset_description(deck.data.tokenizer_type, deck.data.vocab_file, deck.data.merges_file,
                                     static_cast<int>(deck.data.vocab_extra_ids), deck.data.tokenizer_model);
}

void check_shard_tokenizers(const Deck& deck) {
  const auto& d = deck.data;
  if (d.tokenizer_type.empty() && d.tokenizer_model.empty() && d.vocab_file.empty()) return;  // the deck names none
  const auto indexed = indexed_description(deck);
  // the deck's tokenizer for each (type, extra ids) the shards need, built once
  std::map<std::pair<std::string, int>, std::unique_ptr<Tokenizer>> made;
  auto deck_tokenizer = [&](const std::string& type, int extra) -> const Tokenizer& {
    auto& t = made[{type, extra}];
    if (!t) t = make_tokenizer(type, d.vocab_file, d.merges_file, extra, d.tokenizer_model);
    return *t;
  };
  const std::string named = !d.tokenizer_type.empty() ? "data.tokenizer_type = " + d.tokenizer_type
                            : !d.merges_file.empty()
                                ? "data.vocab_file and data.merges_file (" + d.vocab_file + ", " + d.merges_file + ")"
                                : "data.vocab_file = " + d.vocab_file;
  for (const auto& corpus : parse_shard_spec(d.train_shards))
    for (const auto& path : corpus.paths) {
      const TokenShardMeta m = TokenShardReader(path, indexed ? &*indexed : nullptr).meta();
      if (m.format == kIndexedFormat) continue;  // a Megatron pair: described by the deck itself
      const auto uses = [&](const std::string& t) { return m.tokenizer.rfind(t, 0) == 0; };
      std::string type = d.tokenizer_type;
      if (type.empty()) {  // vocabulary files alone: the shard's type, when it is one that reads them
        const bool fits = (!d.merges_file.empty() && uses("GPT2BPE")) ||
                          (d.merges_file.empty() && uses("BertWordPiece"));
        TRIDENT_REQUIRE(fits, "data: shard '" << path << "' was tokenized with " << m.tokenizer << " (vocabulary "
                                              << m.vocab_size << "), but the deck names " << named
                                              << ": preprocess the corpus with the deck's tokenizer, or name the "
                                                 "shards' (data.tokenizer_type, data.tokenizer_model)");
        type = m.tokenizer;
      }
      const int extra = d.vocab_extra_ids > 0 ? static_cast<int>(d.vocab_extra_ids) : m.specials.num_sentinels;
      const Tokenizer& tok = deck_tokenizer(type, extra);
      const bool same_digest = m.tokenizer_digest.empty() || m.tokenizer_digest == tok.digest();
      TRIDENT_REQUIRE(
          m.tokenizer == type && m.vocab_size == tok.vocab_size() && same_digest,
          "data: shard '" << path << "' was tokenized with " << m.tokenizer << " (vocabulary " << m.vocab_size
                          << (m.tokenizer_digest.empty() ? "" : ", files " + m.tokenizer_digest.substr(0, 12))
                          << "), but the deck names " << named << " (" << type << ", vocabulary " << tok.vocab_size()
                          << ", files " << tok.digest().substr(0, 12) << "): one tokenizer per run");
    }
}

SampleSource samples_of(ModelFamily f, const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                        std::shared_ptr<void>& keep) {
  if (deck.sft.enabled()) {
    TRIDENT_REQUIRE(f == ModelFamily::Gpt, "deck: sft.train_data fine-tunes GPT models, not " << family_name(f));
    return sft_samples(deck, valid_samples, keep);
  }
  check_shard_tokenizers(deck);
  if (f == ModelFamily::Bert) return bert_samples(deck, train_samples, valid_samples, keep);
  if (f == ModelFamily::T5) return t5_samples(deck, train_samples, valid_samples, keep);
  return gpt_samples(deck, train_samples, valid_samples, keep);
}

std::vector<std::string> FamilyTask::train_columns() const {
  std::vector<std::string> columns = {"iteration",    "consumed_samples", "loss",    "lr",
                                      "grad_norm",    "loss_scale",       "skipped", "ms_per_iter",
                                      "tokens_per_s", "tflops_per_rank",  "mfu"};
  if (reports_loss_parts) columns.insert(columns.begin() + 3, {"lm_loss", "sop_loss"});
  return columns;
}

std::vector<std::string> FamilyTask::eval_columns() const {
  return reports_loss_parts ? std::vector<std::string>{"iteration", "loss", "lm_loss", "sop_loss"}
                            : std::vector<std::string>{"iteration", "loss", "ppl"};
}

const FamilyTask& task_of(ModelFamily f) {
  static const FamilyTask gpt{ModelFamily::Gpt, "GPT", false, false};
  static const FamilyTask bert{ModelFamily::Bert, "BERT", true, true};
  static const FamilyTask t5{ModelFamily::T5, "T5", true, false};
  return f == ModelFamily::Bert ? bert : f == ModelFamily::T5 ? t5 : gpt;
}

}  // namespace trident
