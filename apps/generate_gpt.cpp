// generate_gpt: text generation from a GPT checkpoint (any tensor-parallel size: run with
// mpiexec -n tp; pp = 1), batched, with a key-value cache.
//   mpiexec -n 2 generate_gpt --checkpoint runs/gpt_small/checkpoints --vocab-file gpt2/encoder.json \
//       --merge-file gpt2/vocab.bpe --prompt "In the beginning" --max-new-tokens 40 --top-p 0.9 --seed 7
// Prompts: --prompt (repeatable) and/or --prompt-file (one per line). Sampling: greedy
// (--greedy), or softmax(logits / temperature) restricted to the top-k tokens and to the smallest
// set whose probabilities reach top-p, drawn from a stream keyed by (seed, prompt, step), so the
// output does not depend on the batch size or tp. Generation stops at the end-of-document token
// (unless --ignore-eod), after --max-new-tokens, or at the model's context. --no-cache recomputes
// the whole prefix at every step (the reference for the cache). Prints, per prompt, the prompt and
// its continuation decoded back through the tokenizer (byte-exact), with --print-ids the
// generated ids and with --print-logprobs their log-probabilities (log-softmax of the logits).
#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <sstream>

#include "comm/agreement.hpp"
#include "comm/mpi_job.hpp"
#include "comm/topology.hpp"
#include "common/error.hpp"
#include "common/rng.hpp"
#include "data/hf_tokenizer.hpp"
#include "data/tokenizer.hpp"
#include "checkpoint/checkpoint.hpp"
#include "io/deck.hpp"
#include "io/hdf5_handle.hpp"
#include "models/gpt_generator.hpp"
#include "models/sampling.hpp"
#include "runtime/app_driver.hpp"
#include "train/inference_model.hpp"

namespace po = boost::program_options;
using namespace trident;

namespace {

struct Options {
  std::string checkpoint, vocab, merges, prompt_file, tokenizer_type = "GPT2BPETokenizer", tokenizer_model;
  std::vector<std::string> prompts;
  std::int64_t max_new = 32, batch = 8, max_length = 0, top_k = 0;
  double temperature = 1.0, top_p = 1.0;
  std::uint64_t seed = 1234;
  bool greedy = false, no_cache = false, print_ids = false, ignore_eod = false, print_logprobs = false;
};

int run(int argc, char** argv) {
  Options o;
  po::options_description desc("generate_gpt: text generation from a GPT checkpoint (run with mpiexec -n tp)");
  desc.add_options()("help", "this text")("checkpoint", po::value(&o.checkpoint),
                                          "checkpoint: a save directory (its latest), an iter_* directory or a file")(
      "vocab-file", po::value(&o.vocab), "GPT-2 encoder.json")("merge-file", po::value(&o.merges), "GPT-2 vocab.bpe")(
      "tokenizer-type", po::value(&o.tokenizer_type)->default_value("GPT2BPETokenizer"),
      "GPT2BPETokenizer (--vocab-file, --merge-file), HuggingFaceTokenizer or SentencePieceTokenizer "
      "(--tokenizer-model)")("tokenizer-model", po::value(&o.tokenizer_model),
                             "HuggingFaceTokenizer: its tokenizer.json (or directory); SentencePieceTokenizer: its "
                             ".model")("prompt", po::value(&o.prompts), "a prompt (repeatable)")(
      "prompt-file", po::value(&o.prompt_file),
      "prompts, one per line")("max-new-tokens", po::value(&o.max_new)->default_value(32),
                               "tokens to generate per prompt")("greedy", po::bool_switch(&o.greedy),
                                                                "the most likely token at every step")(
      "temperature", po::value(&o.temperature)->default_value(1.0), "softmax temperature (> 0)")(
      "top-k", po::value(&o.top_k)->default_value(0),
      "sample among the k most likely tokens (0: all)")("top-p", po::value(&o.top_p)->default_value(1.0),
                                                        "sample among the most likely tokens reaching probability p")(
      "seed", po::value(&o.seed)->default_value(1234),
      "sampling seed")("batch", po::value(&o.batch)->default_value(8),
                       "prompts generated together")("max-length", po::value(&o.max_length)->default_value(0),
                                                     "positions per sequence (0: the model's context)")(
      "no-cache", po::bool_switch(&o.no_cache), "recompute the whole prefix at every step (no key-value cache)")(
      "ignore-eod", po::bool_switch(&o.ignore_eod),
      "do not stop at the end-of-document token")("print-ids", po::bool_switch(&o.print_ids),
                                                  "also print the generated token ids")(
      "print-logprobs", po::bool_switch(&o.print_logprobs),
      "also print each generated token's log-probability (log-softmax of the model's logits, 17 digits)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error::all(std::string("generate_gpt: ") + e.what() + " (see --help)");
  }
  const int rank = mpi_job::world_rank(), world_size = mpi_job::world_size();
  if (vm.count("help")) {
    if (rank == 0) std::cout << desc;
    return 0;
  }
  TRIDENT_REQUIRE(!o.checkpoint.empty(), "generate_gpt: --checkpoint is required");
  const bool gpt2 = o.tokenizer_type == "GPT2BPETokenizer";
  TRIDENT_REQUIRE(!gpt2 || (!o.vocab.empty() && !o.merges.empty()),
                  "generate_gpt: --vocab-file and --merge-file are required (GPT-2's BPE; or --tokenizer-type and "
                  "--tokenizer-model)");
  TRIDENT_REQUIRE(gpt2 || !o.tokenizer_model.empty(),
                  "generate_gpt: " << o.tokenizer_type << " needs --tokenizer-model");
  TRIDENT_REQUIRE(o.temperature > 0, "generate_gpt: --temperature must be > 0");
  TRIDENT_REQUIRE(o.top_k >= 0, "generate_gpt: --top-k must be >= 0");
  TRIDENT_REQUIRE(o.top_p > 0 && o.top_p <= 1, "generate_gpt: --top-p must be in (0, 1]");
  TRIDENT_REQUIRE(o.max_new >= 1 && o.batch >= 1, "generate_gpt: --max-new-tokens and --batch must be >= 1");
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file);
    TRIDENT_REQUIRE(in, "generate_gpt: cannot read --prompt-file '" << o.prompt_file << "'");
    for (std::string line; std::getline(in, line);) o.prompts.push_back(line);
  }
  TRIDENT_REQUIRE(!o.prompts.empty(), "generate_gpt: no prompt (--prompt or --prompt-file)");

  TokenizerOptions topt;
  topt.type = o.tokenizer_type;
  topt.vocab = o.vocab;
  topt.merges = o.merges;
  topt.model = o.tokenizer_model;
  InferenceModel im("generate_gpt", o.checkpoint, topt);
  const std::string& file = im.file;
  const TransformerConfig& cfg = im.cfg;
  const GptModel& model = *im.model;
  const CheckpointState& st = im.state;
  const Tokenizer* tok = im.tokenizer.get();
  const SamplingParams sp{o.greedy, o.temperature, o.top_p, o.top_k};
  const auto* hf = dynamic_cast<const HfTokenizer*>(tok);
  const std::int64_t L = o.max_length > 0 ? std::min(o.max_length, cfg.max_positions) : cfg.max_positions;
  std::vector<std::vector<std::int32_t>> ids;
  for (size_t i = 0; i < o.prompts.size(); ++i) {
    ids.push_back(tok->encode(o.prompts[i]));
    TRIDENT_REQUIRE(!ids.back().empty(), "generate_gpt: prompt " << i + 1 << " is empty");
    TRIDENT_REQUIRE(static_cast<std::int64_t>(ids.back().size()) < L,
                    "generate_gpt: prompt " << i + 1 << " has " << ids.back().size()
                                            << " tokens, not less than the context of " << L << " positions");
  }
  const std::int64_t slots = std::min<std::int64_t>(o.batch, static_cast<std::int64_t>(ids.size()));
  const std::int32_t eod = tok->eod_id();
  // with the deck's data.reset_position_ids / reset_attention_mask, an end-of-document token (in a
  // prompt, or generated with --ignore-eod) starts a new document, as in training
  GptGenerator gen(model, slots, L, eod);
  const std::int64_t V = cfg.vocab_size;
  // tokens are picked among the tokenizer's: the embedding rows beyond them (padding) are never emitted
  const std::int64_t Vtok = tok->vocab_size();
  std::vector<std::vector<std::int32_t>> out(ids.size());
  std::int64_t generated = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto key = [&](size_t prompt, std::int64_t step) {
    return o.seed * 0x9E3779B97F4A7C15ull ^ splitmix64(prompt * 1000003ull + static_cast<std::uint64_t>(step));
  };
  std::vector<std::vector<double>> logprobs(ids.size());
  // the next token of prompt `prompt` from its row of logits (and its log-probability, when asked)
  auto choose = [&](const float* row, size_t prompt, std::int64_t step) {
    const std::int32_t t = sample_token(row, Vtok, sp, key(prompt, step));
    if (o.print_logprobs) logprobs[prompt].push_back(token_logprob(row, Vtok, t));
    return t;
  };
  for (size_t first = 0; first < ids.size(); first += static_cast<size_t>(slots)) {
    const size_t B = std::min(ids.size() - first, static_cast<size_t>(slots));
    std::vector<std::vector<std::int32_t>> seq(B);
    std::vector<bool> done(B, false);
    std::vector<std::int32_t> next(B);
    for (size_t b = 0; b < B; ++b) {
      seq[b] = ids[first + b];
      const std::vector<float> lg = gen.prefill(static_cast<std::int64_t>(b), seq[b]);
      next[b] = choose(lg.data(), first + b, 0);
    }
    for (std::int64_t step = 0;; ++step) {
      bool any = false;
      for (size_t b = 0; b < B; ++b) {
        if (done[b]) continue;
        seq[b].push_back(next[b]);
        out[first + b].push_back(next[b]);
        ++generated;
        if ((!o.ignore_eod && next[b] == eod) || static_cast<std::int64_t>(out[first + b].size()) >= o.max_new ||
            static_cast<std::int64_t>(seq[b].size()) >= L)
          done[b] = true;
        any = any || !done[b];
      }
      if (!any) break;
      if (o.no_cache) {  // the whole sequence again, from position 0
        for (size_t b = 0; b < B; ++b)
          if (!done[b]) {
            const std::vector<float> lg = gen.prefill(static_cast<std::int64_t>(b), seq[b]);
            next[b] = choose(lg.data(), first + b, step + 1);
          }
        continue;
      }
      std::vector<std::int32_t> in(B);
      std::vector<std::int64_t> pos(B);
      for (size_t b = 0; b < B; ++b) {  // finished samples ride along at their last position
        in[b] = seq[b].back();
        pos[b] = std::min<std::int64_t>(static_cast<std::int64_t>(seq[b].size()) - 1, L - 1);
      }
      const std::vector<float> lg = gen.decode(in, pos);
      for (size_t b = 0; b < B; ++b)
        if (!done[b]) next[b] = choose(lg.data() + b * V, first + b, step + 1);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank == 0) {
    std::cout << "checkpoint " << file << " (iteration " << st.iteration << "), tp " << world_size << ", "
              << (o.no_cache ? "no cache" : "key-value cache") << ", " << (o.greedy ? "greedy" : "sampling") << "\n"
              << "key-value cache: " << gen.cache_bytes() << " bytes on rank 0\n";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (gpt2) {  // the prompt as given, the continuation's exact bytes
        std::cout << "[" << i + 1 << "] " << o.prompts[i] << tok->decode(out[i]) << "\n";
      } else {  // decoded with the prompt (a decoder may strip the first token's space), special tokens left out
        std::vector<std::int32_t> all = ids[i];
        all.insert(all.end(), out[i].begin(), out[i].end());
        std::cout << "[" << i + 1 << "] " << (hf ? hf->decode(all, true) : tok->decode(all)) << "\n";
      }
      if (o.print_ids) {
        std::cout << "ids[" << i + 1 << "]:";
        for (auto t : out[i]) std::cout << " " << t;
        std::cout << "\n";
      }
      if (o.print_logprobs) {
        std::ostringstream lp;
        lp << std::setprecision(17);
        for (double x : logprobs[i]) lp << " " << x;
        std::cout << "logprobs[" << i + 1 << "]:" << lp.str() << "\n";
      }
    }
    std::cout << "generated " << generated << " tokens in " << secs << " s: " << generated / secs << " tokens/s"
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return trident::run_app(argc, argv, run); }
