// Instruction fine-tuning data (docs/DESIGN.md "Instruction fine-tuning"): JSON lines of chat
// messages or prompt/response pairs, rendered with the tokenizer's chat template
// (data/chat_template), tokenized as one text (no post-processor tokens: the template writes the
// BOS), and packed first-fit-decreasing into samples of seq_length tokens.
//
// A sample record (int32, width 3 x S): the input tokens (S), the targets (S; -1 where nothing is
// learned) and the conversation of each position (S; 0, 1, ... within the sample, -1 for padding).
// A conversation of n tokens takes n positions; its position k predicts its token k + 1 when that
// token lies in an assistant span (the assistant's output through its end-of-turn token), and its
// last position predicts nothing. Padding (the end-of-document id) predicts nothing.
// The packing is a pure function of the file and seq_length; the samples of each epoch are served
// in an order shuffled by (seed, epoch), so a run resumes exactly from its consumed-samples count.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/chat_template.hpp"
#include "data/hf_tokenizer.hpp"

namespace trident {

struct SftConversation {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> learned;  // learned[k]: token k lies in an assistant span
};

// The tokens of a rendering and its assistant spans' tokens. Throws Error::one when a span's
// boundary does not fall between two tokens of the whole text's tokenization.
SftConversation tokenize_chat(const HfTokenizer& tok, const RenderedChat& chat);

// First-fit-decreasing: documents in decreasing length (ties: file order), each into the first bin
// (in creation order) with room; the bins' document indices, in insertion order. Every length must
// be in [1, capacity].
std::vector<std::vector<std::int64_t>> pack_first_fit_decreasing(const std::vector<std::int64_t>& lengths,
                                                                 std::int64_t capacity);

struct SftOptions {
  std::int64_t seq_length = 0;
  bool truncate = false;  // a conversation longer than seq_length: cut to it (else refused)
  std::uint64_t seed = 1234;
};

// The packed samples of one JSON-lines file.
class SftDataset {
 public:
  SftDataset(const std::string& path, const HfTokenizer& tok, const ChatTemplate& tmpl, const SftOptions& o,
             std::int64_t pad_id);
  std::int64_t packed_samples() const { return static_cast<std::int64_t>(bins_.size()); }
  std::int64_t conversations() const { return static_cast<std::int64_t>(docs_.size()); }
  std::int64_t truncated() const { return truncated_; }
  std::int64_t tokens() const { return tokens_; }
  std::int64_t learned_tokens() const { return learned_; }
  // Writes the record of sample i (width 3 x seq_length): epoch i / packed_samples(), in that
  // epoch's shuffled order.
  void get(std::int64_t i, std::int32_t* out) const;
  // The record of packed sample b itself (unshuffled).
  void write_bin(std::int64_t b, std::int32_t* out) const;

 private:
  SftOptions o_;
  std::int64_t pad_ = 0, truncated_ = 0, tokens_ = 0, learned_ = 0;
  std::vector<SftConversation> docs_;
  std::vector<std::vector<std::int64_t>> bins_;
};

// The train and optional valid datasets of a run (sft.train_data, sft.valid_data) with the
// tokenizer of data.tokenizer_model.
class SftData {
 public:
  SftData(const std::string& train_path, const std::string& valid_path, const std::string& tokenizer_model,
          const SftOptions& o);
  const SftDataset& train() const { return *train_; }
  const SftDataset* valid() const { return valid_.get(); }
  std::int64_t vocab_size() const { return vocab_size_; }
  std::string describe() const { return description_; }

 private:
  std::unique_ptr<HfTokenizer> tok_;
  std::unique_ptr<SftDataset> train_, valid_;
  std::int64_t vocab_size_ = 0;
  std::string description_;
};

}  // namespace trident
