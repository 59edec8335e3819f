// Input deck: INI sections, every key overridable on the command line as --section.key value.
// Unknown keys, bad values and inconsistent combinations are errors that name the key. The
// resolved configuration (every key, defaults included) is kept as INI text for checkpoints
// and logs. inputs/README.md documents every key.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/model_arch.hpp"

namespace trident {

struct Deck {
  // the architecture keys (common/model_arch) and the run's shape
  struct Model : ModelArch {
    Model() { hidden_dropout = attention_dropout = 0.1; }  // Megatron's defaults
    std::int64_t num_layers = 0, seq_length = 0;
    double layernorm_epsilon = 0.0;  // the alias of norm_epsilon (0: not given)
    std::int64_t max_position_embeddings = 0, vocab_size = 0, make_vocab_size_divisible_by = 128;
    // T5 only (Megatron's --decoder-seq-length, --decoder-num-layers): seq_length and
    // num_layers are the encoder's; decoder_num_layers 0 means num_layers.
    std::int64_t decoder_seq_length = 0, decoder_num_layers = 0;
  } model;
  struct Parallel {
    std::int64_t tp = 1, pp = 1, vp = 1;
    // MoE: expert parallelism (experts spread over ep ranks carved out of tp x dp) and the tensor
    // parallelism inside the experts (Megatron's --expert-model-parallel-size and
    // --expert-tensor-parallel-size)
    std::int64_t ep = 1, expert_tp = 1;
    // Context parallelism (Megatron's --context-parallel-size, --cp-comm-type): each of cp ranks
    // holds seq_length / cp tokens of every sample; attention exchanges keys and values around a
    // ring (p2p) or turns sequence shards into head shards (a2a)
    std::int64_t cp = 1;
    std::string cp_comm_type = "p2p";
    std::int64_t first_stage_layers = 0, last_stage_layers = 0;
    std::int64_t pipeline_split_rank = 0;  // T5: first decoder stage (Megatron's split rank); 0: one split
    bool sequence_parallel = false;
    bool overlap_grad_reduce = false;  // DP reduction in per-layer buckets during the backward pass
    // how ranks wait for MPI (comm/mpi_job.hpp): auto (yield when a node has more ranks than
    // CPUs, else spin), spin, yield
    std::string mpi_wait = "auto";
  } parallel;
  struct Train {
    std::int64_t micro_batch_size = 1, global_batch_size = 0, iters = 0, seed = 1234;
  } train;
  struct Optim {
    double lr = 1e-4, min_lr = 0.0, weight_decay = 0.01, clip_grad = 1.0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    std::int64_t warmup_iters = 0, decay_iters = 0;
    std::string decay_style = "cosine";
    // ZeRO-1, optimizer state sharded over the data-parallel group: auto (on when dp > 1), true,
    // false (Boost's other boolean spellings are accepted too); distributed_optimizer() decides
    std::string distributed = "auto";
  } optim;
  struct Precision {
    std::string dtype = "fp32", recompute = "none", recompute_method = "uniform";
    std::int64_t recompute_num_layers = 1;
    double loss_scale = 0.0;  // fixed loss scale; 0: dynamic (fp16) or none (fp32, bf16)
    double initial_loss_scale = 4294967296.0, min_loss_scale = 1.0;  // Megatron's defaults
    std::int64_t loss_scale_window = 1000, hysteresis = 2;
    // fp16: this many skipped (overflowing) iterations in a row stop the job (0: no limit); an
    // overflow at min_loss_scale always does
    std::int64_t max_skipped_iterations = 100;
    bool tf32 = false;  // fp32 GEMMs on TF32 tensor cores (CUDA builds)
  } precision;
  struct Data {
    std::string train_shards, split = "969,30,1", vocab_file, merges_file;
    // The run's tokenizer (preprocess_data's --tokenizer-type names, --tokenizer-model and
    // --vocab-extra-ids): what Megatron indexed datasets (.bin/.idx), which record none, were
    // tokenized with, and what every shard's recorded tokenizer must be (checked before training).
    // tokenizer_model: the tokenizer.json of HuggingFaceTokenizer, the .model of
    // SentencePieceTokenizer.
    std::string tokenizer_type, tokenizer_model;
    std::int64_t vocab_extra_ids = 0;
    // where the GPT dataset indices are cached: auto (next to each corpus's first shard, in
    // trident_index_cache/), none (in memory), or a directory
    std::string index_cache = "auto";
    bool prefetch = true;  // read the next micro-batch on a helper thread while one computes
    // Document-aware packing of GPT windows (Megatron's --reset-position-ids,
    // --reset-attention-mask, --eod-mask-loss; docs/DESIGN.md "Packed sequences"): positions
    // restart after each end-of-document token, a token attends only to its own document, the
    // loss skips the predictions made at end-of-document tokens.
    bool reset_position_ids = false, reset_attention_mask = false, eod_mask_loss = false;
    bool packed() const { return reset_position_ids || reset_attention_mask || eod_mask_loss; }
  } data;
  struct Bert {  // pretrain_bert only (Megatron's --mask-prob, --short-seq-prob, --bert-no-binary-head)
    double mask_prob = 0.15, short_seq_prob = 0.1;
    std::int64_t max_ngrams = 3;
    bool binary_head = true;
  } bert;
  struct T5 {  // pretrain_t5 only: span corruption (Megatron's --mask-prob, --short-seq-prob)
    double mask_prob = 0.15, short_seq_prob = 0.1, geometric_p = 0.2;
    std::int64_t max_ngrams = 10;
  } t5;
  struct Checkpoint {
    std::string save, load;
    std::int64_t interval = 0;
    bool save_initial = false;
    // Megatron's --async-save: training waits only for the copy of the state to host buffers; a
    // background thread writes the checkpoint (checkpoint/checkpoint.hpp CheckpointSaver).
    bool async_save = false;
    // Fine-tuning: checkpoint.load gives the initial weights only (any parallel layout); iteration,
    // consumed samples, optimizer and schedule start afresh. A run whose checkpoint.save already
    // holds a checkpoint (a preempted fine-tuning job) resumes from it instead.
    bool finetune = false;
    // A run that starts from scratch may replace what an earlier run left in checkpoint.save and
    // in the metrics files (refused otherwise: train/output_checks.hpp).
    bool overwrite = false;
  } checkpoint;
  // Low-rank adaptation (LoRA, Hu et al. 2021, as PEFT and Megatron apply it): each targeted
  // projection W gains W + (alpha / rank) B A with A (rank, in) and B (out, rank); only the
  // adapters train, the base model (checkpoint.load with checkpoint.finetune) stays frozen.
  struct Lora {
    std::int64_t rank = 0;  // 0: no adapters
    double alpha = 0.0;     // scale alpha / rank; 0: alpha = rank (scale 1)
    std::string targets = "qkv,proj,fc1,fc2";
  } lora;
  // Instruction fine-tuning (GPT; docs/DESIGN.md "Instruction fine-tuning"): JSON lines of chat
  // messages or prompt/response pairs, rendered with data.tokenizer_model's chat template, the
  // loss on the assistant turns only, packed first-fit-decreasing into model.seq_length.
  struct Sft {
    std::string train_data, valid_data;
    std::string overlong = "refuse";  // a conversation longer than model.seq_length: refuse | truncate
    bool enabled() const { return !train_data.empty(); }
  } sft;
  struct Eval {
    std::int64_t interval = 0, iters = 10, windows = 0;
    std::int64_t stride = 0;  // GPT evaluation mode: tokens between window starts (0: seq_length, disjoint)
    bool only = false;
    std::string shard;
    std::string json_key = "text";  // the text of a JSON-lines eval.shard
  } eval;
  struct Log {
    std::int64_t interval = 1;
    std::string metrics_file, timeline_file, memory_file;
    std::string tensorboard_dir;            // TensorBoard event files (io/tensorboard.hpp)
    std::int64_t histogram_interval = 100;  // iterations between per-layer norm records (0: none)
  } log;
  struct Perf {
    double peak_tflops = 0.0;
    std::string peak_name;
  } perf;
  // Per-iteration deadline (train/watchdog.hpp): after warmup_iters iterations, an iteration (or
  // an evaluation or checkpoint) that runs past max(min_s, factor x the median iteration time) ends
  // the job with the watchdog's exit code; before that, and for evaluations and checkpoints, the
  // deadline is startup_s. factor 0: a fixed deadline of min_s.
  struct Watchdog {
    bool enable = true;
    double factor = 10.0, min_s = 300.0, startup_s = 1800.0;
    std::int64_t warmup_iters = 5;
  } watchdog;
  struct Debug {
    std::string dump_batches, dump_grads;
    std::string dump_params;              // directory receiving the parameters after dump_params_iters
    std::string dump_params_iters = "1";  // comma-separated iterations
    std::string dump_dropout;             // HDF5 file receiving every forward dropout mask (one rank)
    std::string force_overflow;           // iterations whose gradients get an inf (tests of loss scaling)
    bool grouped_p2p = false;             // pipeline messages in send+receive groups, as the NCCL path runs them
    double checkpoint_write_pause_s = 0;  // a checkpoint's writes pause this long half-way (fault tests)
  } debug;

  std::string deck_path;
  // The resolved configuration as INI text.
  std::string to_ini() const;
};

// Every deck key whose value lives in ModelArch (the architecture, common/model_arch) and the
// value it prints for `arch`, in the deck's order: the keys found from where their fields lie, so
// a key added to ModelArch is listed without further edits.
std::vector<std::pair<std::string, std::string>> model_arch_keys(const ModelArch& arch);

// The projections named by lora.targets (comma-separated), checked: Error::all naming an
// unknown one.
std::set<std::string> lora_targets(const std::string& list);
// Whether the run shards the optimizer over its dp data-parallel ranks (optim.distributed: auto
// is on when dp > 1; results are bitwise those of the plain optimizer either way).
bool distributed_optimizer(const std::string& setting, int dp);

// Parses `--deck FILE` plus `--section.key value` overrides (command line wins). Throws
// Error::all with a message naming the offending key. `help_out` receives the option list and
// the function returns false when --help was given.
bool parse_deck(int argc, const char* const* argv, Deck& deck, std::string* help_out = nullptr);

// Parses a deck from INI text (tests).
Deck parse_deck_text(const std::string& ini, const std::vector<std::string>& overrides = {});

// The deck stored in a checkpoint (its attribute `deck`): the model's keys are required and
// checked as usual; the training keys (train.iters, train.global_batch_size, data.train_shards)
// may be unset, as in a checkpoint imported from another format (convert_checkpoint).
Deck parse_stored_deck(const std::string& ini);

}  // namespace trident
