// Building a family's model from a deck (docs/DESIGN.md "Architecture"): the transformer
// config, this rank's pipeline chunks over one parameter store, whether a checkpoint holds the
// same model, and the reductions over the chunks (gradient norm, loss parts). Used by the
// trainer, the evaluation mode and generation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "comm/topology.hpp"
#include "io/deck.hpp"
#include "layers/param_store.hpp"
#include "layers/tensor_parallel.hpp"
#include "models/model_factory.hpp"
#include "ops/elementwise.hpp"

namespace trident {

// The family's transformer config of a deck, for a vocabulary of `vocab` tokens padded to a
// multiple of model.make_vocab_size_divisible_by x tp.
TransformerConfig make_config(const Deck& d, std::int64_t vocab, std::int64_t tp, ModelFamily family);
// The GPT model of a deck (generation and tools build the training model alike).
TransformerConfig gpt_config_from_deck(const Deck& deck, std::int64_t vocab, std::int64_t tp);
HeadOptions head_options(const Deck& d);

// The table of differences between the model a checkpoint holds (from the deck stored in it)
// and this run's, or "" when they are the same model (collective; a checkpoint whose deck
// cannot be read throws). check_same_model throws the table.
std::string model_differences(const std::string& file, const char* family, ModelFamily fam,
                              const TransformerConfig& want, const HeadOptions& want_head, std::int64_t vocab,
                              const Topology& topo);
void check_same_model(const std::string& file, const char* family, ModelFamily fam, const TransformerConfig& want,
                      const HeadOptions& want_head, std::int64_t vocab, const Topology& topo);

// LoRA checkpoints: `deck` with the lora.* keys of checkpoint `file`'s stored deck (collective),
// so that a model built from it has the adapters the checkpoint holds (none for a plain one).
Deck with_checkpoint_lora(Deck deck, const std::string& file, const char* family, const Topology& topo);
// Loads the model weights of checkpoint `file` into store (no optimizer state), after checking
// that it holds this model: a plain checkpoint's tensors, or, for a store with adapters (built
// from with_checkpoint_lora), the checkpoint's adapters over the base model it was trained on
// (lora_base, whose digest must still match). Collective.
CheckpointState load_model_weights(const std::string& file, const char* family, ModelFamily fam,
                                   const TransformerConfig& cfg, const HeadOptions& head, std::int64_t vocab,
                                   ParamStore& store, const Topology& topo);

TensorParallel tensor_parallel(const Deck& deck, const Topology& topo);
// This rank's model chunks: one ModelStage, or parallel.vp of them (interleaved schedule).
std::vector<ModelStage> chunks_of(const Deck& deck, const Topology& topo, const TransformerConfig& cfg);
// Encoder-decoder: the pipeline stage holding the first decoder layer (vp = 1).
int decoder_stage(const Deck& deck, const Topology& topo, const TransformerConfig& cfg);
// The model chunks of this rank, sharing one parameter store.
std::vector<std::unique_ptr<LanguageModel>> build_chunks(ModelFamily fam, const TransformerConfig& cfg,
                                                         const HeadOptions& head, ParamStore& store, std::int64_t mbs,
                                                         const TensorParallel& tp,
                                                         const std::vector<ModelStage>& stages);
std::vector<LanguageModel*> raw(const std::vector<std::unique_ptr<LanguageModel>>& v);

// Global L2 norm of the gradients, this data-parallel rank summing its shard [begin, end) of the
// dense parameters and its expert-data-parallel shard [expert_begin, expert_end) of the experts'.
// With the kernels' device layouts and a plan, the four classes of sums (dense over TP or
// replicated, experts over expert TP or replicated) take one pass (ops/elementwise RangeSquares,
// built into *plan on the first call for these ranges; the caller keeps it) instead of a launch
// and a read per tensor.
double global_grad_norm(const ParamStore& store, const Topology& topo, std::int64_t begin, std::int64_t end,
                        std::int64_t expert_begin = 0, std::int64_t expert_end = 0, RangeSquares* plan = nullptr);
// The squared L2 norms of the parameters by transformer layer: element 0 the parameters outside the
// layers (embeddings, final norm, output layer; a tied copy left out), element l + 1 global layer
// l, for `layers` layers; the same on every rank. `values` is the flat buffer to measure: the
// gradients (grads = true: this rank sums its data-parallel shards [begin, end) and
// [expert_begin, expert_end) as global_grad_norm does) or the fp32 parameters (grads = false: the
// ranges are the whole buffer, replicated over data parallelism). Collective over the world.
std::vector<double> layer_sum_squares(const ParamStore& store, const Topology& topo, std::int64_t layers,
                                      const FloatView& values, bool grads, std::int64_t begin, std::int64_t end,
                                      std::int64_t expert_begin, std::int64_t expert_end);
// The chunks' loss parts since the last call, summed over the pipeline and data-parallel groups.
LossParts reduce_loss_parts(const std::vector<std::unique_ptr<LanguageModel>>& chunks, const Topology& topo);

// An iteration's MoE figures over the whole job (docs/DESIGN.md "Mixture of experts", Metrics):
// each MoE layer's mean over the iteration's micro-batches of the unscaled load-balancing loss
// and z-loss, and its load (selections per expert, before capacity drops, over every rank's
// tokens); the means over the MoE layers of the two losses and of each layer's max / mean load,
// and the fraction of selections dropped by capacity.
struct MoeReport {
  double aux = 0, z = 0, max_load = 0, dropped = 0;
  std::vector<std::int64_t> layers;         // the MoE layers (global index)
  std::vector<std::vector<double>> load;    // per MoE layer: each expert's share of the selections
  std::vector<std::vector<double>> counts;  // per MoE layer: each expert's selections over the job
};
// Sets every chunk's MoE gradient scale (d objective / d one micro-batch's aux loss) and clears
// its figures; before an iteration's passes.
void start_moe_iteration(const std::vector<std::unique_ptr<LanguageModel>>& chunks, float aux_grad_scale);
// Aux-loss-free balancing (router_enable_expert_bias): each MoE layer's expert bias, on every
// rank holding it, += rate x sign(mean_e c_e - c_e), c the iteration's selections over the job
// (the report's counts: the routing with the bias, before capacity drops).
void update_expert_bias(const std::vector<std::unique_ptr<LanguageModel>>& chunks, const MoeReport& report,
                        double rate);
// The figures of the iteration's passes, reduced over the job (collective over the world).
MoeReport reduce_moe_report(const std::vector<std::unique_ptr<LanguageModel>>& chunks, const ModelArch& arch,
                            const Topology& topo);

}  // namespace trident
