// Input-deck parsing with Boost.Program_options (docs/DESIGN.md "Input deck"). A Registry
// declares every key once, as an option with its default (the --help text) and as a printer for
// Deck::to_ini(). The INI file and the --section.key overrides (the last one of a key wins, no
// abbreviations; '%' escaped around Boost) are parsed together; then the required keys are
// checked, the "0 means derived" defaults resolved (finish) and every constraint validated, each
// failure an Error::all that names the key.
#include "io/deck.hpp"

#include <algorithm>
#include <cctype>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <type_traits>
#include <sstream>

#include "common/error.hpp"

namespace po = boost::program_options;

namespace trident {

namespace {

// The shortest text that reads back as the same double (0.1, 1e-05): the --help defaults and the
// deck stored in checkpoints, which parses back exactly.
std::string fmt(double v) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}
std::string fmt(std::int64_t v) { return std::to_string(v); }
std::string fmt(bool v) { return v ? "true" : "false"; }
std::string fmt(const std::string& v) { return v; }

struct Entry {
  std::string key;  // section.key
  std::function<std::string()> show;
  const void* field = nullptr;  // where the value lives
};

// Declares every deck key once: the option table for Boost and the printer for to_ini().
class Registry {
 public:
  explicit Registry(Deck& d) : desc_("Deck keys (INI [section] key = value, or --section.key value)") { declare(d); }
  po::options_description& desc() { return desc_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const std::vector<std::string*>& strings() const { return strings_; }

 private:
  template <class T>
  void add(const std::string& key, T* field, const char* help) {
    auto* v = po::value<T>(field)->default_value(*field, fmt(*field));
    if constexpr (std::is_same_v<T, std::string>) {
      v->implicit_value("", "");  // "--key ''" clears
      strings_.push_back(field);
    }
    desc_.add_options()(key.c_str(), v, help);
    entries_.push_back({key, [field] { return fmt(*field); }, field});
  }
  void declare(Deck& d) {
    add("model.num_layers", &d.model.num_layers, "transformer layers");
    add("model.hidden_size", &d.model.hidden_size, "hidden size h");
    add("model.num_heads", &d.model.num_heads, "attention heads");
    add("model.ffn_hidden_size", &d.model.ffn_hidden_size, "MLP hidden size (0: 4h)");
    add("model.num_query_groups", &d.model.num_query_groups,
        "key/value heads (grouped-query attention; 1: multi-query; 0: num_heads)");
    add("model.kv_channels", &d.model.kv_channels, "channels per attention head (0: hidden_size / num_heads)");
    add("model.qk_layernorm", &d.model.qk_layernorm, "a norm over each head of the queries and keys (Qwen 3)");
    add("model.seq_length", &d.model.seq_length, "sequence length s");
    add("model.max_position_embeddings", &d.model.max_position_embeddings,
        "learned positions (0: seq_length; T5: the longer of the two sequence lengths)");
    add("model.decoder_seq_length", &d.model.decoder_seq_length, "T5: decoder sequence length");
    add("model.decoder_num_layers", &d.model.decoder_num_layers, "T5: decoder layers (0: num_layers)");
    add("model.vocab_size", &d.model.vocab_size, "vocabulary size (0: from the shards)");
    add("model.make_vocab_size_divisible_by", &d.model.make_vocab_size_divisible_by,
        "vocabulary padding multiple (x tp)");
    add("model.norm_epsilon", &d.model.norm_epsilon, "epsilon of every normalisation (LayerNorm, RMSNorm)");
    add("model.layernorm_epsilon", &d.model.layernorm_epsilon, "alias of model.norm_epsilon (0: not given)");
    add("model.normalization", &d.model.normalization, "LayerNorm | RMSNorm");
    add("model.swiglu", &d.model.swiglu, "SiLU-gated MLP (ffn_hidden_size: the width of each of gate and up)");
    add("model.position_embedding_type", &d.model.position_embedding_type, "learned_absolute | rope | none");
    add("model.rotary_base", &d.model.rotary_base, "rope: base of the rotary frequencies");
    add("model.rotary_percent", &d.model.rotary_percent, "rope: fraction of each head's channels turned");
    add("model.use_rope_scaling", &d.model.use_rope_scaling, "rope: Llama 3.1's frequency scaling");
    add("model.rope_scaling_factor", &d.model.rope_scaling_factor, "rope scaling: factor");
    add("model.rope_low_freq_factor", &d.model.rope_low_freq_factor, "rope scaling: low-frequency factor");
    add("model.rope_high_freq_factor", &d.model.rope_high_freq_factor, "rope scaling: high-frequency factor");
    add("model.rope_original_max_position_embeddings", &d.model.rope_original_max_position_embeddings,
        "rope scaling: the context length the frequencies were trained for");
    add("model.add_bias_linear", &d.model.add_bias_linear, "biases in every linear of the layers");
    add("model.add_qkv_bias", &d.model.add_qkv_bias, "a qkv bias even without add_bias_linear (Qwen 2)");
    add("model.untie_embeddings_and_output_weights", &d.model.untie_embeddings_and_output_weights,
        "GPT: an output layer of its own instead of the word embeddings");
    add("model.init_method_std", &d.model.init_method_std, "std of normal init");
    add("model.hidden_dropout", &d.model.hidden_dropout, "dropout on embeddings and before each residual add");
    add("model.attention_dropout", &d.model.attention_dropout, "dropout on attention probabilities");
    add("model.flash_attention", &d.model.flash_attention,
        "fused attention kernel (online softmax, no (T, T) probabilities stored; Megatron's --use-flash-attn)");
    add("model.attention_backend", &d.model.attention_backend,
        "the fused attention's library on a GPU: auto | cudnn | local (Trident's kernel); Megatron's --attention-backend");
    add("moe.num_experts", &d.model.moe.num_experts, "experts per MoE layer (0: dense MLPs)");
    add("moe.router_topk", &d.model.moe.router_topk, "experts each token is routed to");
    add("moe.ffn_hidden_size", &d.model.moe.ffn_hidden_size, "each expert's hidden width (0: model.ffn_hidden_size)");
    add("moe.layer_freq", &d.model.moe.layer_freq,
        "MoE layers: N (layer i when i % N == 0) or a list of 0/1 per layer, e.g. [1,0,1,1]");
    add("moe.shared_expert_intermediate_size", &d.model.moe.shared_expert_intermediate_size,
        "width of a shared expert beside the routed ones (0: none)");
    add("moe.router_score_function", &d.model.moe.router_score_function, "softmax | sigmoid");
    add("moe.router_pre_softmax", &d.model.moe.router_pre_softmax,
        "softmax over all experts before the top-k (default: top-k of the logits, softmax over the k)");
    add("moe.aux_loss_coeff", &d.model.moe.aux_loss_coeff, "load-balancing loss coefficient");
    add("moe.z_loss_coeff", &d.model.moe.z_loss_coeff, "router z-loss coefficient");
    add("moe.expert_capacity_factor", &d.model.moe.expert_capacity_factor,
        "expert capacity ceil(tokens k / E x factor) per rank's tokens (0: dropless)");
    add("moe.router_enable_expert_bias", &d.model.moe.router_enable_expert_bias,
        "aux-loss-free balancing: a per-expert bias on the sigmoid scores for the selection (sigmoid routing)");
    add("moe.router_bias_update_rate", &d.model.moe.router_bias_update_rate,
        "the expert bias's step per iteration: bias += rate x sign(mean load - expert's load)");
    add("moe.token_drop_policy", &d.model.moe.token_drop_policy,
        "over capacity, an expert drops: probs (the lowest probabilities) | position (the last tokens)");
    add("parallel.tp", &d.parallel.tp, "tensor-parallel size");
    add("parallel.pp", &d.parallel.pp, "pipeline-parallel size");
    add("parallel.vp", &d.parallel.vp, "virtual pipeline stages per rank");
    add("parallel.ep", &d.parallel.ep,
        "MoE: expert-parallel size (each rank holds moe.num_experts / ep experts; divides tp x dp)");
    add("parallel.expert_tp", &d.parallel.expert_tp, "MoE: tensor-parallel size inside the experts");
    add("parallel.cp", &d.parallel.cp,
        "context-parallel size: each of cp ranks holds model.seq_length / cp tokens of every sample");
    add("parallel.cp_comm_type", &d.parallel.cp_comm_type,
        "context parallelism's attention: p2p (ring attention) | a2a (all-to-all over heads, Ulysses)");
    add("parallel.sequence_parallel", &d.parallel.sequence_parallel, "sequence parallelism");
    add("parallel.overlap_grad_reduce", &d.parallel.overlap_grad_reduce,
        "all-reduce each layer's gradients over data-parallel ranks as soon as its last backward pass ends");
    add("parallel.mpi_wait", &d.parallel.mpi_wait,
        "how ranks wait for MPI: auto (yield when a node has more ranks than CPUs) | spin (blocking calls) | "
        "yield (nonblocking calls, the core given up between tests)");
    add("parallel.first_stage_layers", &d.parallel.first_stage_layers,
        "layers on the first pipeline stage (0: even split)");
    add("parallel.pipeline_split_rank", &d.parallel.pipeline_split_rank,
        "T5: stages [0, r) hold the encoder, [r, pp) the decoder (0: split all layers together)");
    add("parallel.last_stage_layers", &d.parallel.last_stage_layers,
        "layers on the last pipeline stage (0: even split)");
    add("train.micro_batch_size", &d.train.micro_batch_size, "samples per micro-batch per DP rank");
    add("train.global_batch_size", &d.train.global_batch_size, "samples per iteration (all DP ranks)");
    add("train.iters", &d.train.iters, "training iterations");
    add("train.seed", &d.train.seed, "random seed (init and data order)");
    add("optim.lr", &d.optim.lr, "peak learning rate");
    add("optim.min_lr", &d.optim.min_lr, "final learning rate");
    add("optim.warmup_iters", &d.optim.warmup_iters, "linear warm-up iterations");
    add("optim.decay_iters", &d.optim.decay_iters, "decay length in iterations (0: train.iters)");
    add("optim.decay_style", &d.optim.decay_style, "constant | linear | cosine");
    add("optim.weight_decay", &d.optim.weight_decay, "AdamW decoupled weight decay");
    add("optim.clip_grad", &d.optim.clip_grad, "global gradient-norm clip (0: off)");
    add("optim.beta1", &d.optim.beta1, "Adam beta1");
    add("optim.beta2", &d.optim.beta2, "Adam beta2");
    add("optim.eps", &d.optim.eps, "Adam epsilon");
    add("optim.distributed", &d.optim.distributed,
        "distributed optimizer (ZeRO-1), optimizer state sharded over data-parallel ranks: auto (on when "
        "dp > 1) | true | false");
    add("precision.dtype", &d.precision.dtype,
        "fp32 | bf16 | fp16 (mixed precision: 16-bit parameters and activations, fp32 master weights)");
    add("precision.loss_scale", &d.precision.loss_scale, "fp16: fixed loss scale (0: dynamic loss scaling)");
    add("precision.recompute", &d.precision.recompute, "activation recomputation: none | selective | full");
    add("precision.recompute_method", &d.precision.recompute_method,
        "full recomputation: uniform (groups of recompute_num_layers) | block (first recompute_num_layers layers)");
    add("precision.recompute_num_layers", &d.precision.recompute_num_layers,
        "layers per group (uniform) or recomputed layers per chunk (block)");
    add("precision.tf32", &d.precision.tf32, "CUDA builds: fp32 GEMMs on TF32 tensor cores (ignored on the host)");
    add("precision.initial_loss_scale", &d.precision.initial_loss_scale, "fp16 dynamic loss scaling: initial scale");
    add("precision.min_loss_scale", &d.precision.min_loss_scale, "fp16 dynamic loss scaling: smallest scale");
    add("precision.loss_scale_window", &d.precision.loss_scale_window,
        "fp16 dynamic loss scaling: clean steps before the scale doubles");
    add("precision.hysteresis", &d.precision.hysteresis,
        "fp16 dynamic loss scaling: consecutive overflows before the scale halves");
    add("precision.max_skipped_iterations", &d.precision.max_skipped_iterations,
        "fp16: skipped (overflowing) iterations in a row that stop the job as diverged (0: no limit)");
    add("data.train_shards", &d.data.train_shards, "shard files or globs, each optionally preceded by a weight");
    add("data.split", &d.data.split, "train,valid,test document ratios");
    add("data.prefetch", &d.data.prefetch,
        "read the next micro-batch on a helper thread while the current one computes");
    add("data.vocab_file", &d.data.vocab_file, "tokenizer vocabulary (BERT's whole-word masking; text output)");
    add("data.merges_file", &d.data.merges_file, "BPE merges (GPT-2 BPE vocabularies)");
    add("data.tokenizer_type", &d.data.tokenizer_type,
        "the run's tokenizer (GPT2BPETokenizer, BertWordPieceLowerCase, HuggingFaceTokenizer, SentencePieceTokenizer, "
        "...): Megatron .bin/.idx corpora's, and every shard's (checked)");
    add("data.tokenizer_model", &d.data.tokenizer_model,
        "HuggingFaceTokenizer: its tokenizer.json; SentencePieceTokenizer: its .model file");
    add("data.vocab_extra_ids", &d.data.vocab_extra_ids, "T5 sentinels of Megatron corpora (--vocab-extra-ids)");
    add("data.reset_position_ids", &d.data.reset_position_ids,
        "GPT: positions restart at 0 after each end-of-document token (Megatron's --reset-position-ids)");
    add("data.reset_attention_mask", &d.data.reset_attention_mask,
        "GPT: a token attends only to the tokens of its own document (Megatron's --reset-attention-mask)");
    add("data.eod_mask_loss", &d.data.eod_mask_loss,
        "GPT: no loss on the predictions made at end-of-document tokens (Megatron's --eod-mask-loss); the loss "
        "becomes the mean over the micro-batches of each one's mean over its counted tokens");
    add("data.index_cache", &d.data.index_cache,
        "GPT dataset index cache: auto (trident_index_cache/ next to the corpus), none (in memory), or a directory");
    add("bert.mask_prob", &d.bert.mask_prob, "BERT: fraction of the tokens of a sample that are predicted");
    add("bert.short_seq_prob", &d.bert.short_seq_prob, "BERT: probability of a shorter target length");
    add("bert.max_ngrams", &d.bert.max_ngrams, "BERT: longest masked n-gram of whole words");
    add("bert.binary_head", &d.bert.binary_head, "BERT: sentence pairs and the sentence-order head");
    add("t5.mask_prob", &d.t5.mask_prob, "T5: fraction of the tokens of a sample that are corrupted");
    add("t5.short_seq_prob", &d.t5.short_seq_prob, "T5: probability of a shorter target length");
    add("t5.max_ngrams", &d.t5.max_ngrams, "T5: longest corrupted span, in whole words");
    add("t5.geometric_p", &d.t5.geometric_p, "T5: span lengths ~ geometric(p), capped at max_ngrams");
    add("checkpoint.save", &d.checkpoint.save, "checkpoint directory to write");
    add("checkpoint.load", &d.checkpoint.load,
        "checkpoint directory to resume from; auto: checkpoint.save when it holds a checkpoint, else start fresh");
    add("checkpoint.interval", &d.checkpoint.interval, "iterations between checkpoints (0: end only)");
    add("checkpoint.save_initial", &d.checkpoint.save_initial, "also save iteration 0 (initial weights)");
    add("checkpoint.async_save", &d.checkpoint.async_save,
        "write checkpoints in the background: training waits only for the copy of the state to host memory");
    add("checkpoint.finetune", &d.checkpoint.finetune,
        "fine-tune: checkpoint.load gives the weights only; iteration, optimizer and schedule start afresh");
    add("checkpoint.overwrite", &d.checkpoint.overwrite,
        "a run from scratch may replace the checkpoints in checkpoint.save and the metrics files (refused otherwise)");
    add("lora.rank", &d.lora.rank,
        "LoRA adapters' rank (0: none); needs checkpoint.finetune (the frozen base model in checkpoint.load)");
    add("lora.alpha", &d.lora.alpha, "LoRA scale alpha / rank (0: alpha = rank)");
    add("lora.targets", &d.lora.targets,
        "projections that get adapters: qkv, proj, fc1, fc2 and, in T5's decoder, cross_q, cross_kv, cross_proj");
    add("sft.train_data", &d.sft.train_data,
        "GPT instruction fine-tuning: JSON lines of {\"messages\": [...]} or {\"prompt\", \"response\"} "
        "records, rendered with data.tokenizer_model's chat template (replaces data.train_shards)");
    add("sft.valid_data", &d.sft.valid_data, "instruction fine-tuning: the held-out conversations of eval.interval");
    add("sft.overlong", &d.sft.overlong,
        "a conversation longer than model.seq_length: refuse (stop with an error naming it) or truncate");
    add("eval.interval", &d.eval.interval, "iterations between validation evaluations (0: never)");
    add("eval.iters", &d.eval.iters, "validation micro-batches per evaluation");
    add("eval.only", &d.eval.only, "score checkpoint.load on eval.shard and exit");
    add("eval.shard", &d.eval.shard,
        "what eval.only scores: a token shard, a Megatron pair, or (GPT) a JSON-lines or plain-text file");
    add("eval.windows", &d.eval.windows, "windows scored by eval.only");
    add("eval.stride", &d.eval.stride,
        "GPT eval.only: tokens between window starts; each window scores the targets the previous one did not "
        "(0: seq_length, disjoint windows)");
    add("eval.json_key", &d.eval.json_key, "the text key of a JSON-lines eval.shard");
    add("log.interval", &d.log.interval, "iterations between log lines");
    add("log.metrics_file", &d.log.metrics_file, "metrics file (.csv or .jsonl)");
    add("log.timeline_file", &d.log.timeline_file, "Chrome-trace JSON of the pipeline schedule (one row per rank)");
    add("log.memory_file", &d.log.memory_file, "JSON of every rank's memory figures at the end of the run");
    add("log.tensorboard_dir", &d.log.tensorboard_dir,
        "directory of TensorBoard event files (metrics, evaluation, per-layer norms, memory, the deck)");
    add("log.histogram_interval", &d.log.histogram_interval,
        "iterations between the per-layer parameter and gradient norms of the TensorBoard file (0: none)");
    add("perf.peak_tflops", &d.perf.peak_tflops, "peak TFLOP/s per rank for MFU (0: no MFU)");
    add("perf.peak_name", &d.perf.peak_name, "what the peak is (for logs)");
    add("watchdog.enable", &d.watchdog.enable,
        "end a job whose iteration overruns its deadline, printing where each rank is stuck (exit code 5)");
    add("watchdog.factor", &d.watchdog.factor, "deadline: this many times the median iteration time (0: min_s)");
    add("watchdog.min_s", &d.watchdog.min_s, "deadline floor in seconds");
    add("watchdog.warmup_iters", &d.watchdog.warmup_iters,
        "iterations timed against startup_s before the median applies");
    add("watchdog.startup_s", &d.watchdog.startup_s,
        "deadline in seconds of the warm-up iterations, evaluations and checkpoint saves");
    add("debug.dump_batches", &d.debug.dump_batches, "HDF5 file receiving every global batch (validation)");
    add("debug.dump_grads", &d.debug.dump_grads, "HDF5 file receiving the gradients of iteration 1 (validation)");
    add("debug.dump_params", &d.debug.dump_params,
        "directory receiving the parameters after each of debug.dump_params_iters as iter_NNNNNNN.h5 (validation)");
    add("debug.dump_params_iters", &d.debug.dump_params_iters, "comma-separated iterations for debug.dump_params");
    add("debug.dump_dropout", &d.debug.dump_dropout,
        "HDF5 file receiving the mask of every forward dropout call in call order (validation; one rank, no recomputation)");
    add("debug.grouped_p2p", &d.debug.grouped_p2p,
        "pipeline messages as lock-step send + receive groups over MPI (the order the NCCL path uses; for tests)");
    add("debug.checkpoint_write_pause_s", &d.debug.checkpoint_write_pause_s,
        "checkpoint writes pause this long half-way (fault tests: a window into a background save)");
    add("debug.force_overflow", &d.debug.force_overflow,
        "comma-separated iterations whose gradients receive an inf (tests of the fp16 loss scaler)");
  }

  po::options_description desc_;
  std::vector<Entry> entries_;         // every key, in declaration order
  std::vector<std::string*> strings_;  // the string-valued fields ('%' restored after parsing)
};

// Boost.Program_options builds its messages by replacing placeholders such as
// %canonical_option% until none is left, so a key or value holding one loops forever (found by
// tests/fuzz/fuzz_deck). '%' therefore never reaches Boost: it travels as a private-use character
// and is restored in the string keys and in messages.
const std::string kPercent = "\xEE\x80\xA5";  // U+E025

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
  return s;
}

}  // namespace

std::set<std::string> lora_targets(const std::string& list) {
  static const std::set<std::string> known = {"qkv", "proj", "fc1", "fc2", "cross_q", "cross_kv", "cross_proj"};
  std::set<std::string> out;
  std::stringstream ss(list);
  for (std::string t; std::getline(ss, t, ',');) {
    const auto b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    t = t.substr(b, e - b + 1);
    TRIDENT_REQUIRE(known.count(t) == 1, "deck: lora.targets: unknown projection '"
                                             << t << "' (known: qkv, proj, fc1, fc2, cross_q, cross_kv, cross_proj)");
    out.insert(t);
  }
  TRIDENT_REQUIRE(!out.empty(), "deck: lora.targets names no projection");
  return out;
}

namespace {
// optim.distributed: auto, or one of Boost's boolean spellings (true for the first group)
const std::set<std::string> kTrue = {"true", "1", "yes", "on"}, kFalse = {"false", "0", "no", "off"};
}  // namespace

bool distributed_optimizer(const std::string& setting, int dp) {
  if (setting == "auto") return dp > 1;
  if (kTrue.count(setting)) return true;
  if (kFalse.count(setting)) return false;
  throw Error::all("deck: optim.distributed = '" + setting + "' is not one of auto true false");
}

namespace {

void check_choice(const std::string& key, const std::string& v, const std::set<std::string>& allowed) {
  if (allowed.count(v)) return;
  std::ostringstream os;
  os << "deck: " << key << " = '" << v << "' is not one of";
  for (auto& a : allowed) os << " " << a;
  throw Error::all(os.str());
}

// stored: the deck of a checkpoint, whose training keys may be unset (an imported model was
// never trained here); only the model's keys are then required and checked.
void validate(const Deck& d, bool stored) {
  auto positive = [](const char* key, std::int64_t v) {
    TRIDENT_REQUIRE(v > 0, "deck: " << key << " must be > 0 (got " << v << ")");
  };
  auto nonneg = [](const char* key, double v) {
    TRIDENT_REQUIRE(v >= 0, "deck: " << key << " must be >= 0 (got " << v << ")");
  };
  positive("model.num_layers", d.model.num_layers);
  positive("model.hidden_size", d.model.hidden_size);
  positive("model.num_heads", d.model.num_heads);
  positive("model.seq_length", d.model.seq_length);
  positive("model.make_vocab_size_divisible_by", d.model.make_vocab_size_divisible_by);
  TRIDENT_REQUIRE(d.model.kv_channels >= 0, "deck: model.kv_channels must be >= 0");
  TRIDENT_REQUIRE(d.model.kv_channels > 0 || d.model.hidden_size % d.model.num_heads == 0,
                  "deck: model.hidden_size (" << d.model.hidden_size << ") is not divisible by model.num_heads ("
                                              << d.model.num_heads << ")");
  TRIDENT_REQUIRE(d.model.num_query_groups > 0 && d.model.num_heads % d.model.num_query_groups == 0,
                  "deck: model.num_heads (" << d.model.num_heads << ") is not a multiple of model.num_query_groups ("
                                            << d.model.num_query_groups << ")");
  TRIDENT_REQUIRE(d.model.ffn_hidden_size >= 0, "deck: model.ffn_hidden_size must be >= 0");
  TRIDENT_REQUIRE(d.model.vocab_size >= 0, "deck: model.vocab_size must be >= 0");
  nonneg("model.decoder_seq_length", d.model.decoder_seq_length);
  nonneg("model.decoder_num_layers", d.model.decoder_num_layers);
  TRIDENT_REQUIRE(d.bert.mask_prob > 0 && d.bert.mask_prob < 1, "deck: bert.mask_prob must be in (0, 1)");
  TRIDENT_REQUIRE(d.bert.short_seq_prob >= 0 && d.bert.short_seq_prob <= 1,
                  "deck: bert.short_seq_prob must be in [0, 1]");
  positive("bert.max_ngrams", d.bert.max_ngrams);
  TRIDENT_REQUIRE(d.t5.mask_prob > 0 && d.t5.mask_prob < 1, "deck: t5.mask_prob must be in (0, 1)");
  TRIDENT_REQUIRE(d.t5.short_seq_prob >= 0 && d.t5.short_seq_prob <= 1, "deck: t5.short_seq_prob must be in [0, 1]");
  TRIDENT_REQUIRE(d.t5.geometric_p > 0 && d.t5.geometric_p <= 1, "deck: t5.geometric_p must be in (0, 1]");
  positive("t5.max_ngrams", d.t5.max_ngrams);
  nonneg("data.vocab_extra_ids", d.data.vocab_extra_ids);
  TRIDENT_REQUIRE(!d.data.index_cache.empty(), "deck: data.index_cache is empty (auto, none or a directory)");
  TRIDENT_REQUIRE(d.data.vocab_extra_ids == 0 || !d.data.tokenizer_type.empty(),
                  "deck: data.vocab_extra_ids is set but data.tokenizer_type is not (both describe Megatron corpora)");
  TRIDENT_REQUIRE(d.model.max_position_embeddings == 0 ||
                      d.model.max_position_embeddings >= std::max(d.model.seq_length, d.model.decoder_seq_length),
                  "deck: model.max_position_embeddings ("
                      << d.model.max_position_embeddings << ") is smaller than "
                      << (d.model.decoder_seq_length > d.model.seq_length
                              ? "model.decoder_seq_length (" + std::to_string(d.model.decoder_seq_length) + ")"
                              : "model.seq_length (" + std::to_string(d.model.seq_length) + ")"));
  TRIDENT_REQUIRE(d.model.norm_epsilon > 0, "deck: model.norm_epsilon must be > 0");
  TRIDENT_REQUIRE(d.model.rotary_base > 1, "deck: model.rotary_base must be > 1");
  TRIDENT_REQUIRE(d.model.rotary_percent > 0 && d.model.rotary_percent <= 1,
                  "deck: model.rotary_percent must be in (0, 1]");
  TRIDENT_REQUIRE(d.model.rope_scaling_factor >= 1, "deck: model.rope_scaling_factor must be >= 1");
  TRIDENT_REQUIRE(d.model.rope_low_freq_factor > 0 && d.model.rope_high_freq_factor > d.model.rope_low_freq_factor,
                  "deck: model.rope_high_freq_factor must exceed model.rope_low_freq_factor > 0");
  TRIDENT_REQUIRE(d.model.rope_original_max_position_embeddings > 0,
                  "deck: model.rope_original_max_position_embeddings must be > 0");
  if (d.model.position_embedding_type == "rope") {
    const std::int64_t hs = d.model.head_dim();
    const auto rot = static_cast<std::int64_t>(static_cast<double>(hs) * d.model.rotary_percent);
    TRIDENT_REQUIRE(rot >= 2 && rot % 2 == 0, "deck: model.rotary_percent (" << d.model.rotary_percent << ") turns "
                                                                             << rot << " of the head's " << hs
                                                                             << " channels: must be even and >= 2");
  }
  TRIDENT_REQUIRE(d.model.init_method_std > 0, "deck: model.init_method_std must be > 0");
  const MoeArch& moe = d.model.moe;
  TRIDENT_REQUIRE(moe.num_experts >= 0, "deck: moe.num_experts must be >= 0 (got " << moe.num_experts << ")");
  if (moe.on()) {
    TRIDENT_REQUIRE(moe.router_topk >= 1 && moe.router_topk <= moe.num_experts,
                    "deck: moe.router_topk = " << moe.router_topk
                                               << " must be in [1, moe.num_experts = " << moe.num_experts << "]");
    positive("moe.ffn_hidden_size", moe.ffn_hidden_size);
    TRIDENT_REQUIRE(moe.shared_expert_intermediate_size >= 0, "deck: moe.shared_expert_intermediate_size must be >= 0");
    check_choice("moe.router_score_function", moe.router_score_function, {"softmax", "sigmoid"});
    check_choice("moe.token_drop_policy", moe.token_drop_policy, {"probs", "position"});
    TRIDENT_REQUIRE(!moe.router_pre_softmax || moe.router_score_function == "softmax",
                    "deck: moe.router_pre_softmax applies to moe.router_score_function = softmax");
    nonneg("moe.aux_loss_coeff", moe.aux_loss_coeff);
    nonneg("moe.z_loss_coeff", moe.z_loss_coeff);
    nonneg("moe.expert_capacity_factor", moe.expert_capacity_factor);
    nonneg("moe.router_bias_update_rate", moe.router_bias_update_rate);
    TRIDENT_REQUIRE(!moe.router_enable_expert_bias || moe.router_score_function == "sigmoid",
                    "deck: moe.router_enable_expert_bias needs moe.router_score_function = sigmoid (as Megatron)");
    TRIDENT_REQUIRE(d.parallel.tp == 1 || d.parallel.sequence_parallel,
                    "deck: MoE layers with parallel.tp = " << d.parallel.tp
                                                           << " need parallel.sequence_parallel = true (as Megatron)");
    TRIDENT_REQUIRE(moe.shared_expert_intermediate_size == 0 ||
                        moe.shared_expert_intermediate_size % d.parallel.tp == 0,
                    "deck: moe.shared_expert_intermediate_size ("
                        << moe.shared_expert_intermediate_size << ") is not divisible by parallel.tp (" << d.parallel.tp
                        << ")");
    TRIDENT_REQUIRE(d.lora.rank == 0 || !moe.router_enable_expert_bias,
                    "deck: lora.rank > 0 with moe.router_enable_expert_bias: the expert bias is part of the "
                    "frozen base model under LoRA (leave the bias off, or fine-tune without adapters)");
    TRIDENT_REQUIRE(moe.num_experts % d.parallel.ep == 0,
                    "deck: moe.num_experts (" << moe.num_experts << ") is not divisible by parallel.ep ("
                                              << d.parallel.ep << ")");
  }
  positive("parallel.ep", d.parallel.ep);
  positive("parallel.expert_tp", d.parallel.expert_tp);
  TRIDENT_REQUIRE(d.model.moe.num_experts > 0 || (d.parallel.ep == 1 && d.parallel.expert_tp == 1),
                  "deck: parallel.ep and parallel.expert_tp spread MoE experts; this model has none "
                  "(moe.num_experts = 0): leave them 1");
  TRIDENT_REQUIRE(d.model.moe.num_experts == 0 || d.model.moe.ffn_hidden_size % d.parallel.expert_tp == 0,
                  "deck: moe.ffn_hidden_size (" << d.model.moe.ffn_hidden_size
                                                << ") is not divisible by parallel.expert_tp (" << d.parallel.expert_tp
                                                << ")");
  positive("parallel.tp", d.parallel.tp);
  positive("parallel.pp", d.parallel.pp);
  positive("parallel.vp", d.parallel.vp);
  positive("parallel.cp", d.parallel.cp);
  check_choice("parallel.cp_comm_type", d.parallel.cp_comm_type, {"p2p", "a2a"});
  check_choice("parallel.mpi_wait", d.parallel.mpi_wait, {"auto", "spin", "yield"});
  check_choice("model.attention_backend", d.model.attention_backend, {"auto", "cudnn", "local"});
  TRIDENT_REQUIRE(d.model.attention_backend != "cudnn" || d.model.flash_attention,
                  "deck: model.attention_backend = cudnn needs model.flash_attention = true (cuDNN's fused attention "
                  "keeps no (T, T) probabilities, as the fused kernel)");
  if (d.parallel.cp > 1) {
    const std::int64_t cp = d.parallel.cp;
    TRIDENT_REQUIRE(d.model.moe.num_experts == 0,
                    "deck: parallel.cp > 1 with MoE layers is not supported (the routers' token counts and the "
                    "load-balancing loss would have to span the context-parallel group)");
    TRIDENT_REQUIRE(d.model.flash_attention,
                    "deck: parallel.cp > 1 needs model.flash_attention = true (ring attention merges the fused "
                    "kernel's per-row log-sum-exp; the all-to-all runs the fused kernel over whole sequences)");
    TRIDENT_REQUIRE(d.model.seq_length % (2 * cp) == 0,
                    "deck: model.seq_length (" << d.model.seq_length
                                               << ") is not divisible by 2 x parallel.cp = " << 2 * cp
                                               << " (each sequence is split into 2 cp chunks, two per rank, to "
                                                  "balance the causal mask)");
    if (d.parallel.cp_comm_type == "a2a") {
      const std::int64_t heads = d.model.num_heads / d.parallel.tp;
      const std::int64_t groups = (d.model.num_query_groups > 0 ? d.model.num_query_groups : d.model.num_heads) /
                                  d.parallel.tp;
      TRIDENT_REQUIRE(heads % cp == 0 && groups % cp == 0,
                      "deck: parallel.cp_comm_type = a2a splits each tensor-parallel rank's "
                          << heads << " heads and " << groups << " key/value groups over parallel.cp = " << cp
                          << ": not divisible");
    }
  }
  TRIDENT_REQUIRE(d.parallel.first_stage_layers >= 0 && d.parallel.last_stage_layers >= 0,
                  "deck: parallel.first_stage_layers / last_stage_layers must be >= 0");
  TRIDENT_REQUIRE(d.parallel.pipeline_split_rank >= 0, "deck: parallel.pipeline_split_rank must be >= 0");
  TRIDENT_REQUIRE(d.model.num_heads % d.parallel.tp == 0,
                  "deck: model.num_heads (" << d.model.num_heads << ") is not divisible by parallel.tp ("
                                            << d.parallel.tp << ")");
  TRIDENT_REQUIRE(d.model.num_query_groups % d.parallel.tp == 0,
                  "deck: model.num_query_groups (" << d.model.num_query_groups << ") is not divisible by parallel.tp ("
                                                   << d.parallel.tp
                                                   << "): tensor parallelism splits the key/value groups");
  TRIDENT_REQUIRE(d.model.ffn_hidden_size % d.parallel.tp == 0,
                  "deck: model.ffn_hidden_size (" << d.model.ffn_hidden_size << ") is not divisible by parallel.tp ("
                                                  << d.parallel.tp << ")");
  TRIDENT_REQUIRE(!d.parallel.sequence_parallel ||
                      (d.train.micro_batch_size * d.model.seq_length / d.parallel.cp) % d.parallel.tp == 0,
                  "deck: parallel.sequence_parallel splits train.micro_batch_size x model.seq_length"
                      << (d.parallel.cp > 1 ? " / parallel.cp" : "") << " = "
                      << d.train.micro_batch_size * d.model.seq_length / d.parallel.cp
                      << " tokens over parallel.tp = " << d.parallel.tp << ": not divisible");
  TRIDENT_REQUIRE(d.model.hidden_dropout >= 0 && d.model.hidden_dropout < 1,
                  "deck: model.hidden_dropout must be in [0, 1)");
  TRIDENT_REQUIRE(d.model.attention_dropout >= 0 && d.model.attention_dropout < 1,
                  "deck: model.attention_dropout must be in [0, 1)");
  positive("train.micro_batch_size", d.train.micro_batch_size);
  if (!d.eval.only && !stored) {
    positive("train.global_batch_size", d.train.global_batch_size);
    TRIDENT_REQUIRE(d.train.iters >= 0, "deck: train.iters must be >= 0");
    TRIDENT_REQUIRE(d.train.global_batch_size % d.train.micro_batch_size == 0,
                    "deck: train.global_batch_size (" << d.train.global_batch_size
                                                      << ") is not divisible by train.micro_batch_size ("
                                                      << d.train.micro_batch_size << ")");
  }
  TRIDENT_REQUIRE(d.optim.lr >= 0, "deck: optim.lr must be >= 0");
  nonneg("optim.min_lr", d.optim.min_lr);
  TRIDENT_REQUIRE(d.optim.min_lr <= d.optim.lr,
                  "deck: optim.min_lr (" << d.optim.min_lr << ") exceeds optim.lr (" << d.optim.lr << ")");
  nonneg("optim.weight_decay", d.optim.weight_decay);
  nonneg("optim.clip_grad", d.optim.clip_grad);
  TRIDENT_REQUIRE(d.optim.beta1 >= 0 && d.optim.beta1 < 1, "deck: optim.beta1 must be in [0, 1)");
  TRIDENT_REQUIRE(d.optim.beta2 >= 0 && d.optim.beta2 < 1, "deck: optim.beta2 must be in [0, 1)");
  TRIDENT_REQUIRE(d.optim.eps > 0, "deck: optim.eps must be > 0");
  TRIDENT_REQUIRE(d.optim.warmup_iters >= 0, "deck: optim.warmup_iters must be >= 0");
  TRIDENT_REQUIRE(d.optim.decay_iters >= 0, "deck: optim.decay_iters must be >= 0");
  check_choice("optim.decay_style", d.optim.decay_style, {"constant", "linear", "cosine"});
  distributed_optimizer(d.optim.distributed, 1);  // the value checked
  check_choice("precision.dtype", d.precision.dtype, {"fp32", "bf16", "fp16"});
  TRIDENT_REQUIRE(d.precision.loss_scale == 0 || d.precision.dtype == "fp16",
                  "deck: precision.loss_scale applies to precision.dtype = fp16 only (bf16 and fp32 train unscaled)");
  check_choice("precision.recompute", d.precision.recompute, {"none", "selective", "full"});
  check_choice("precision.recompute_method", d.precision.recompute_method, {"uniform", "block"});
  TRIDENT_REQUIRE(d.precision.recompute_num_layers >= (d.precision.recompute == "full" ? 1 : 0),
                  "deck: precision.recompute_num_layers must be >= 1 with precision.recompute = full");
  TRIDENT_REQUIRE(d.precision.initial_loss_scale > 0, "deck: precision.initial_loss_scale must be > 0");
  TRIDENT_REQUIRE(d.precision.min_loss_scale > 0 && d.precision.min_loss_scale <= d.precision.initial_loss_scale,
                  "deck: precision.min_loss_scale must be > 0 and at most precision.initial_loss_scale");
  TRIDENT_REQUIRE(d.precision.loss_scale_window >= 1, "deck: precision.loss_scale_window must be >= 1");
  TRIDENT_REQUIRE(d.precision.hysteresis >= 1, "deck: precision.hysteresis must be >= 1");
  TRIDENT_REQUIRE(d.precision.max_skipped_iterations >= 0, "deck: precision.max_skipped_iterations must be >= 0");
  nonneg("precision.loss_scale", d.precision.loss_scale);
  TRIDENT_REQUIRE(d.checkpoint.interval >= 0, "deck: checkpoint.interval must be >= 0");
  TRIDENT_REQUIRE(d.debug.checkpoint_write_pause_s >= 0, "deck: debug.checkpoint_write_pause_s must be >= 0");
  TRIDENT_REQUIRE(!d.checkpoint.finetune || (!d.checkpoint.load.empty() && d.checkpoint.load != "auto"),
                  "deck: checkpoint.finetune needs checkpoint.load (the pretrained checkpoint to start from)");
  TRIDENT_REQUIRE(d.lora.rank >= 0, "deck: lora.rank must be >= 0");
  TRIDENT_REQUIRE(d.lora.alpha >= 0, "deck: lora.alpha must be >= 0");
  lora_targets(d.lora.targets);  // names checked
  if (d.lora.rank > 0 && !stored && !d.eval.only) {
    TRIDENT_REQUIRE(d.checkpoint.finetune,
                    "deck: lora.rank > 0 trains adapters on a frozen base model: set checkpoint.finetune = true and "
                    "checkpoint.load to the base checkpoint");
    TRIDENT_REQUIRE(!d.parallel.overlap_grad_reduce,
                    "deck: parallel.overlap_grad_reduce does not apply with lora.rank > 0 (the adapters' gradients "
                    "are reduced in one call after the backward pass)");
  }
  TRIDENT_REQUIRE(d.eval.interval >= 0, "deck: eval.interval must be >= 0");
  TRIDENT_REQUIRE(d.eval.iters >= 0, "deck: eval.iters must be >= 0");
  TRIDENT_REQUIRE(d.log.interval > 0, "deck: log.interval must be > 0");
  TRIDENT_REQUIRE(d.log.histogram_interval >= 0, "deck: log.histogram_interval must be >= 0");
  TRIDENT_REQUIRE(d.watchdog.factor >= 0, "deck: watchdog.factor must be >= 0");
  TRIDENT_REQUIRE(d.watchdog.min_s > 0, "deck: watchdog.min_s must be > 0");
  TRIDENT_REQUIRE(d.watchdog.startup_s > 0, "deck: watchdog.startup_s must be > 0");
  TRIDENT_REQUIRE(d.watchdog.warmup_iters >= 0, "deck: watchdog.warmup_iters must be >= 0");
  nonneg("perf.peak_tflops", d.perf.peak_tflops);
  if (d.eval.only) {
    TRIDENT_REQUIRE(!d.checkpoint.load.empty() && d.checkpoint.load != "auto",
                    "deck: eval.only needs checkpoint.load (a directory or file, not auto)");
    TRIDENT_REQUIRE(!d.eval.shard.empty(), "deck: eval.only needs eval.shard");
    TRIDENT_REQUIRE(d.eval.windows > 0, "deck: eval.only needs eval.windows > 0");
    TRIDENT_REQUIRE(d.eval.stride >= 0 && d.eval.stride <= d.model.seq_length,
                    "deck: eval.stride (" << d.eval.stride
                                          << ") must be in [0, model.seq_length = " << d.model.seq_length << "]");
    TRIDENT_REQUIRE(!d.eval.json_key.empty(), "deck: eval.json_key is empty");
  } else if (!stored && !d.sft.enabled()) {
    TRIDENT_REQUIRE(!d.data.train_shards.empty(), "deck: data.train_shards is empty");
  }
  TRIDENT_REQUIRE(d.sft.overlong == "refuse" || d.sft.overlong == "truncate",
                  "deck: sft.overlong must be refuse or truncate, not '" << d.sft.overlong << "'");
  if (d.sft.enabled()) {
    TRIDENT_REQUIRE(d.data.train_shards.empty(),
                    "deck: sft.train_data and data.train_shards both name training data: give one");
    TRIDENT_REQUIRE(!d.data.tokenizer_model.empty() &&
                        (d.data.tokenizer_type.empty() || d.data.tokenizer_type == "HuggingFaceTokenizer"),
                    "deck: sft.train_data needs data.tokenizer_type = HuggingFaceTokenizer and data.tokenizer_model "
                    "(the tokenizer whose tokenizer_config.json holds the chat template)");
    TRIDENT_REQUIRE(!d.data.eod_mask_loss,
                    "deck: data.eod_mask_loss does not apply to sft.train_data (the loss covers the assistant turns)");
  } else {
    TRIDENT_REQUIRE(d.sft.valid_data.empty(), "deck: sft.valid_data is set but sft.train_data is not");
  }
}

// moe.layer_freq: "N" or "[a,b,...]" (one 0/1 per layer) -> the flag of each global layer
std::vector<char> moe_layers(const std::string& freq, std::int64_t num_layers) {
  std::string f;
  for (char c : freq)
    if (!std::isspace(static_cast<unsigned char>(c))) f += c;
  std::vector<char> out(static_cast<size_t>(std::max<std::int64_t>(num_layers, 0)), 0);
  const auto bad = [&freq](const std::string& why) {
    return Error::all("deck: moe.layer_freq = '" + freq + "': " + why);
  };
  if (!f.empty() && f.front() == '[') {
    if (f.back() != ']') throw bad("a list is [0/1, ...]");
    std::vector<char> flags;
    std::istringstream in(f.substr(1, f.size() - 2));
    for (std::string item; std::getline(in, item, ',');) {
      if (item != "0" && item != "1") throw bad("list entries are 0 or 1, not '" + item + "'");
      flags.push_back(item == "1" ? 1 : 0);
    }
    if (static_cast<std::int64_t>(flags.size()) != num_layers)
      throw bad("the list has " + std::to_string(flags.size()) +
                " entries for model.num_layers = " + std::to_string(num_layers));
    return flags;
  }
  std::int64_t n = 0;
  try {
    size_t used = 0;
    n = std::stoll(f, &used);
    if (used != f.size()) throw std::invalid_argument(f);
  } catch (const std::exception&) {
    throw bad("not an integer or a list of 0/1");
  }
  if (n < 1) throw bad("the frequency must be >= 1");
  for (std::int64_t i = 0; i < num_layers; ++i) out[static_cast<size_t>(i)] = i % n == 0 ? 1 : 0;
  return out;
}

void finish(Deck& d) {
  // Megatron: 4h, or under swiglu int(8h / 3 / 64) * 64 (each of gate and up)
  if (d.model.ffn_hidden_size == 0)
    d.model.ffn_hidden_size = d.model.swiglu ? (8 * d.model.hidden_size / 3) / 64 * 64 : 4 * d.model.hidden_size;
  if (d.model.num_query_groups == 0) d.model.num_query_groups = d.model.num_heads;  // multi-head attention
  MoeArch& moe = d.model.moe;
  if (moe.on()) {
    if (moe.ffn_hidden_size == 0) moe.ffn_hidden_size = d.model.ffn_hidden_size;
    moe.layers = moe_layers(moe.layer_freq, d.model.num_layers);
  } else {
    moe.layers.clear();
  }
  if (d.model.kv_channels == 0 && d.model.num_heads > 0 && d.model.hidden_size % d.model.num_heads == 0)
    d.model.kv_channels = d.model.hidden_size / d.model.num_heads;
  if (d.model.layernorm_epsilon > 0) {  // the alias, when given
    TRIDENT_REQUIRE(d.model.norm_epsilon == ModelArch{}.norm_epsilon ||
                        d.model.norm_epsilon == d.model.layernorm_epsilon,
                    "deck: model.norm_epsilon (" << d.model.norm_epsilon << ") and its alias model.layernorm_epsilon ("
                                                 << d.model.layernorm_epsilon << ") differ");
    d.model.norm_epsilon = d.model.layernorm_epsilon;
  }
  if (d.model.max_position_embeddings == 0)
    d.model.max_position_embeddings = std::max(d.model.seq_length, d.model.decoder_seq_length);
  if (d.optim.decay_iters == 0) d.optim.decay_iters = d.train.iters;
}

// "--a.b 1 --a.b=2" -> "--a.b=2": a key given twice on the command line takes its last value.
std::vector<std::string> last_value_wins(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> kv;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string key = args[i], value;
    const auto eq = key.find('=');
    if (key.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (key.rfind("--", 0) == 0 && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    } else if (key.rfind("--", 0) != 0) {
      throw Error::all("unexpected command-line argument '" + key + "' (overrides are --section.key value)");
    }
    bool found = false;
    for (auto& p : kv)
      if (p.first == key) {
        p.second = value;
        found = true;
      }
    if (!found) kv.emplace_back(key, value);
  }
  std::vector<std::string> out;
  for (auto& p : kv) out.push_back(p.second.empty() ? p.first : p.first + "=" + p.second);
  return out;
}

void parse_into(Deck& d, Registry& reg, const std::vector<std::string>& raw_args, std::istream* ini,
                const std::string& where, bool stored = false) {
  std::vector<std::string> cmdline_args = last_value_wins(raw_args);
  for (auto& a : cmdline_args) a = replace_all(a, "%", kPercent);
  std::istringstream ini_escaped;
  if (ini) {
    std::ostringstream text;
    text << ini->rdbuf();
    ini_escaped.str(replace_all(text.str(), "%", kPercent));
    ini = &ini_escaped;
  }
  try {
    po::variables_map vm;
    if (!cmdline_args.empty()) {
      po::store(po::command_line_parser(cmdline_args)
                    .options(reg.desc())
                    .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                    .run(),
                vm);
    }
    if (ini) po::store(po::parse_config_file(*ini, reg.desc(), /*allow_unregistered=*/false), vm);
    po::notify(vm);
    for (std::string* v : reg.strings()) *v = replace_all(*v, kPercent, "%");
    // keys whose default (0 or empty) only means "not set": they must be given
    std::vector<std::string> required = {"model.num_layers", "model.hidden_size", "model.num_heads",
                                         "model.seq_length"};
    if (!d.eval.only && !stored) required.insert(required.end(), {"train.global_batch_size", "train.iters"});
    if (!d.eval.only && !stored && vm.count("sft.train_data") == 0) required.push_back("data.train_shards");
    std::string missing;
    int n_missing = 0;
    for (const auto& k : required)
      if (vm.count(k) == 0 || vm[k].defaulted()) {
        missing += (missing.empty() ? "" : ", ") + k;
        ++n_missing;
      }
    if (n_missing > 0)
      throw Error::all("deck " + where + ": " + missing + (n_missing > 1 ? " are" : " is") +
                       " required (set in the deck or on the command line as --section.key value)");
  } catch (const po::error& e) {
    throw Error::all("deck " + where + ": " + replace_all(e.what(), kPercent, "%"));
  }
  finish(d);
  validate(d, stored);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> model_arch_keys(const ModelArch& arch) {
  Deck d;
  static_cast<ModelArch&>(d.model) = arch;
  Registry reg(d);
  const char* begin = reinterpret_cast<const char*>(static_cast<const ModelArch*>(&d.model));
  const char* end = begin + sizeof(ModelArch);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : reg.entries()) {
    const char* f = static_cast<const char*>(e.field);
    if (f >= begin && f < end) out.emplace_back(e.key, e.show());
  }
  return out;
}

std::string Deck::to_ini() const {
  Deck copy = *this;
  Registry reg(copy);
  std::ostringstream os;
  std::string section;
  for (auto& e : reg.entries()) {
    const auto dot = e.key.find('.');
    const std::string sec = e.key.substr(0, dot), key = e.key.substr(dot + 1);
    if (sec != section) {
      os << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    os << key << " = " << e.show() << "\n";
  }
  return os.str();
}

bool parse_deck(int argc, const char* const* argv, Deck& deck, std::string* help_out) {
  deck = Deck();
  std::vector<std::string> args;
  std::string deck_path;
  bool help = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help = true;
    } else if (a == "--deck") {
      TRIDENT_REQUIRE(i + 1 < argc, "--deck needs a file name");
      deck_path = argv[++i];
    } else if (a.rfind("--deck=", 0) == 0) {
      deck_path = a.substr(7);
    } else {
      args.push_back(a);
    }
  }
  Registry reg(deck);
  if (help) {
    if (help_out) {
      std::ostringstream os;
      std::string app = argc > 0 ? argv[0] : "app";
      if (const auto slash = app.rfind('/'); slash != std::string::npos) app = app.substr(slash + 1);
      os << app << ": pretraining from an input deck (inputs/README.md; every key below, docs/DESIGN.md)\n"
         << "usage: mpiexec -n N " << app << " --deck FILE [--section.key value ...]\n\n"
         << reg.desc();
      *help_out = os.str();
    }
    return false;
  }
  TRIDENT_REQUIRE(!deck_path.empty(), "no input deck: pass --deck FILE (see inputs/README.md)");
  std::error_code ec;
  TRIDENT_REQUIRE(!std::filesystem::is_directory(deck_path, ec),
                  "the input deck '" << deck_path << "' is a directory, not a deck file");
  std::ifstream in(deck_path);
  TRIDENT_REQUIRE(in.good(), "cannot open the input deck '" << deck_path << "'");
  deck.deck_path = deck_path;
  parse_into(deck, reg, args, &in, "'" + deck_path + "'");
  deck.deck_path = deck_path;
  return true;
}

Deck parse_deck_text(const std::string& ini, const std::vector<std::string>& overrides) {
  Deck d;
  Registry reg(d);
  std::istringstream in(ini);
  parse_into(d, reg, overrides, &in, "(text)");
  return d;
}

Deck parse_stored_deck(const std::string& ini) {
  Deck d;
  Registry reg(d);
  std::istringstream in(ini);
  parse_into(d, reg, {}, &in, "(stored in a checkpoint)", /*stored=*/true);
  return d;
}

}  // namespace trident
