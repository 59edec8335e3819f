// Instruction fine-tuning data (data/sft_dataset.hpp).
#include "data/sft_dataset.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <numeric>
#include <sstream>

#include "common/error.hpp"
#include "data/jsonl.hpp"

namespace trident {

SftConversation tokenize_chat(const HfTokenizer& tok, const RenderedChat& chat) {
  SftConversation c;
  tok.encode_append(chat.text, c.tokens, /*add_special_tokens=*/false);
  c.learned.assign(c.tokens.size(), 0);
  std::vector<std::int32_t> prefix;
  // the number of tokens of text[0, at), checked to be a prefix of the whole text's tokens
  auto tokens_before = [&](std::size_t at) -> std::size_t {
    if (at == 0) return 0;
    if (at == chat.text.size()) return c.tokens.size();
    prefix.clear();
    tok.encode_append(std::string_view(chat.text).substr(0, at), prefix, false);
    if (prefix.size() > c.tokens.size() || !std::equal(prefix.begin(), prefix.end(), c.tokens.begin()))
      throw Error::one("an assistant turn's boundary (byte " + std::to_string(at) +
                       " of the rendered text) falls inside a token of the whole text's tokenization");
    return prefix.size();
  };
  for (const auto& [begin, end] : chat.assistant) {
    const std::size_t a = tokens_before(begin), b = tokens_before(end);
    std::fill(c.learned.begin() + static_cast<std::ptrdiff_t>(a), c.learned.begin() + static_cast<std::ptrdiff_t>(b),
              1);
  }
  return c;
}

std::vector<std::vector<std::int64_t>> pack_first_fit_decreasing(const std::vector<std::int64_t>& lengths,
                                                                 std::int64_t capacity) {
  const std::int64_t n = static_cast<std::int64_t>(lengths.size());
  std::vector<std::int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
  });
  // a segment tree over the bins (at most n) holding each bin's free room; the leftmost bin with
  // room >= len is found from the root in O(log n)
  std::int64_t leaves = 1;
  while (leaves < std::max<std::int64_t>(n, 1)) leaves *= 2;
  std::vector<std::int64_t> room(static_cast<size_t>(2 * leaves), capacity);  // unopened bins: empty
  std::vector<std::vector<std::int64_t>> bins;
  for (const std::int64_t d : order) {
    const std::int64_t len = lengths[static_cast<size_t>(d)];
    TRIDENT_REQUIRE(len >= 1 && len <= capacity,
                    "internal: document length " << len << " outside [1, " << capacity << "]");
    std::int64_t node = 1;
    while (node < leaves) node = room[static_cast<size_t>(2 * node)] >= len ? 2 * node : 2 * node + 1;
    const std::int64_t bin = node - leaves;
    if (bin >= static_cast<std::int64_t>(bins.size())) bins.resize(static_cast<size_t>(bin + 1));
    bins[static_cast<size_t>(bin)].push_back(d);
    room[static_cast<size_t>(node)] -= len;
    for (node /= 2; node >= 1; node /= 2)
      room[static_cast<size_t>(node)] = std::max(room[static_cast<size_t>(2 * node)],
                                                 room[static_cast<size_t>(2 * node + 1)]);
  }
  return bins;
}

SftDataset::SftDataset(const std::string& path, const HfTokenizer& tok, const ChatTemplate& tmpl, const SftOptions& o,
                       std::int64_t pad_id)
    : o_(o), pad_(pad_id) {
  TRIDENT_REQUIRE(o.seq_length >= 2, "sft: model.seq_length must be >= 2");
  if (!std::filesystem::is_regular_file(path)) throw Error::all("sft: cannot read '" + path + "' (no such file)");
  std::int64_t line_no = 0;
  std::vector<ChatMessage> messages;
  std::vector<std::int64_t> lengths;
  for_each_line_in_range(path, 0, std::numeric_limits<std::int64_t>::max(),
                         [&](std::string_view line, std::int64_t, std::int64_t) {
                           ++line_no;
                           try {
                             if (!chat_messages_of_json(line, messages)) return;
                             SftConversation c = tokenize_chat(tok, tmpl.render(messages));
                             const std::int64_t n = static_cast<std::int64_t>(c.tokens.size());
                             if (n > o.seq_length) {
                               if (!o.truncate)
                                 throw Error::one(
                                     "the conversation has " + std::to_string(n) +
                                     " tokens, more than model.seq_length = " + std::to_string(o.seq_length) +
                                     " (sft.overlong = truncate cuts such conversations)");
                               c.tokens.resize(static_cast<size_t>(o.seq_length));
                               c.learned.resize(static_cast<size_t>(o.seq_length));
                               ++truncated_;
                             }
                             tokens_ += static_cast<std::int64_t>(c.tokens.size());
                             for (size_t k = 1; k < c.learned.size(); ++k) learned_ += c.learned[k];
                             lengths.push_back(static_cast<std::int64_t>(c.tokens.size()));
                             docs_.push_back(std::move(c));
                           } catch (const Error& e) {
                             throw Error::all("sft: " + path + " line " + std::to_string(line_no) + ": " + e.what());
                           }
                         });
  if (docs_.empty()) throw Error::all("sft: " + path + " holds no conversation");
  bins_ = pack_first_fit_decreasing(lengths, o.seq_length);
}

void SftDataset::write_bin(std::int64_t b, std::int32_t* out) const {
  const std::int64_t S = o_.seq_length;
  std::int32_t *tokens = out, *targets = out + S, *segment = out + 2 * S;
  std::int64_t at = 0, seg = 0;
  for (const std::int64_t d : bins_[static_cast<size_t>(b)]) {
    const auto& c = docs_[static_cast<size_t>(d)];
    const std::int64_t n = static_cast<std::int64_t>(c.tokens.size());
    for (std::int64_t k = 0; k < n; ++k, ++at) {
      tokens[at] = c.tokens[static_cast<size_t>(k)];
      targets[at] = k + 1 < n && c.learned[static_cast<size_t>(k + 1)] ? c.tokens[static_cast<size_t>(k + 1)] : -1;
      segment[at] = static_cast<std::int32_t>(seg);
    }
    ++seg;
  }
  for (; at < S; ++at) {
    tokens[at] = static_cast<std::int32_t>(pad_);
    targets[at] = -1;
    segment[at] = -1;
  }
}

void SftDataset::get(std::int64_t i, std::int32_t* out) const {
  const std::int64_t n = packed_samples();
  const std::int64_t epoch = i / n, k = i % n;
  // this epoch's order: a Fisher-Yates shuffle driven by splitmix64(seed, epoch)
  thread_local std::vector<std::int64_t> perm;
  thread_local std::int64_t perm_epoch = -1;
  thread_local const SftDataset* perm_of = nullptr;
  if (perm_of != this || perm_epoch != epoch || static_cast<std::int64_t>(perm.size()) != n) {
    perm.resize(static_cast<size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    std::uint64_t state = o_.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch) + 1;
    auto next = [&state] {
      std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    for (std::int64_t j = n - 1; j > 0; --j) std::swap(perm[static_cast<size_t>(j)], perm[next() % (j + 1)]);
    perm_epoch = epoch;
    perm_of = this;
  }
  write_bin(perm[static_cast<size_t>(k)], out);
}

SftData::SftData(const std::string& train_path, const std::string& valid_path, const std::string& tokenizer_model,
                 const SftOptions& o) {
  TRIDENT_REQUIRE(!tokenizer_model.empty(),
                  "sft: data.tokenizer_model must name the Hugging Face tokenizer (its tokenizer.json and "
                  "tokenizer_config.json, whose chat_template renders the conversations)");
  tok_ = std::make_unique<HfTokenizer>(tokenizer_model);
  const ChatTemplate tmpl = ChatTemplate::from_config(tokenizer_model);
  const std::int64_t pad = tok_->eod_id() >= 0 ? tok_->eod_id() : 0;
  train_ = std::make_unique<SftDataset>(train_path, *tok_, tmpl, o, pad);
  if (!valid_path.empty()) valid_ = std::make_unique<SftDataset>(valid_path, *tok_, tmpl, o, pad);
  vocab_size_ = tok_->vocab_size();
  std::ostringstream s;
  auto line = [&](const char* name, const std::string& path, const SftDataset& d) {
    s << "  sft " << name << ": " << path << ": " << d.conversations() << " conversations, " << d.tokens()
      << " tokens (" << d.learned_tokens() << " learned) in " << d.packed_samples() << " packed samples of "
      << o.seq_length << " (" << d.truncated() << " truncated)\n";
  };
  s << "instruction fine-tuning, chat template " << tmpl.name() << " (" << tokenizer_model << ")\n";
  line("train", train_path, *train_);
  if (valid_) line("valid", valid_path, *valid_);
  description_ = s.str();
}

}  // namespace trident
