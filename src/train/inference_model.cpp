#include "train/inference_model.hpp"

#include <hdf5.h>
#include <mpi.h>

#include "comm/agreement.hpp"
#include "comm/mpi_job.hpp"
#include "common/error.hpp"
#include "io/deck.hpp"
#include "io/hdf5_handle.hpp"
#include "train/model_setup.hpp"

namespace trident {

namespace {

// Rows of the checkpoint's word embeddings: the true vocabulary size.
std::int64_t checkpoint_vocab(const std::string& file, MPI_Comm world) {
  std::int64_t v = 0;
  collectively(world, [&] {
    H5QuietErrors quiet;
    H5Handle f = h5_file(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    H5Handle d = h5_dataset(H5Dopen2(f, "model/embedding/word_embeddings", H5P_DEFAULT));
    TRIDENT_REQUIRE(d.valid(), "checkpoint '" << file << "' has no model/embedding/word_embeddings");
    H5Handle sp = h5_space(H5Dget_space(d));
    hsize_t dims[2] = {0, 0};
    H5Sget_simple_extent_dims(sp, dims, nullptr);
    v = static_cast<std::int64_t>(dims[0]);
  });
  return v;
}

}  // namespace

InferenceModel::InferenceModel(const std::string& app, const std::string& checkpoint, const TokenizerOptions& t)
    : file(resolve_checkpoint(checkpoint)), topo(MPI_COMM_WORLD, mpi_job::world_size(), 1) {
  const std::string lora_base = checkpoint_lora_base(file, MPI_COMM_WORLD);
  TRIDENT_REQUIRE(lora_base.empty(), app << ": checkpoint " << file << " holds LoRA adapters only (trained on "
                                         << lora_base
                                         << "): merge them into plain weights first (convert_checkpoint --to merged)");
  const Deck deck = parse_stored_deck(read_checkpoint_deck(file, "gpt", MPI_COMM_WORLD));
  cfg = gpt_config_from_deck(deck, checkpoint_vocab(file, MPI_COMM_WORLD), mpi_job::world_size());
  cfg.dt = DType::F32;  // inference in fp32 whatever the training precision (checkpoints hold fp32)
  cfg.recompute = TransformerConfig::Recompute::None;
  cfg.hidden_dropout = cfg.attention_dropout = 0.f;
  cfg.lora_rank = 0;  // plain weights (checked above)
  tp.comm = &topo.tp_group();
  model = std::make_unique<GptModel>(cfg, store, 1, tp);  // fp32 whatever the training precision
  store.allocate();
  state = load_checkpoint(file, "gpt", store, nullptr, topo);
  gpt2 = t.type == "GPT2BPETokenizer";
  collectively(MPI_COMM_WORLD, [&] { tokenizer = make_tokenizer(t.type, t.vocab, t.merges, 0, t.model); });
  // GPT-2's BPE is the whole vocabulary; an open model's embedding may have more rows than its
  // tokenizer has tokens (Qwen: 151936 rows, 151669 tokens)
  TRIDENT_REQUIRE(gpt2 ? tokenizer->vocab_size() == cfg.vocab_size : tokenizer->vocab_size() <= cfg.vocab_size,
                  app << ": the tokenizer has " << tokenizer->vocab_size() << " tokens but the model "
                      << cfg.vocab_size);
}

}  // namespace trident
