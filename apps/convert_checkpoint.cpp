// convert_checkpoint: Trident checkpoints <-> Hugging Face model directories (docs/DESIGN.md
// "Hugging Face formats"): GPT as GPT2LMHeadModel, the Llama-family layer as LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM, BERT as MegatronBertForPreTraining;
// and the merge of LoRA adapters. The conversions live in src/checkpoint/hf_convert.*; this file
// parses the command line.
//
//   convert_checkpoint --to hf --input runs/gpt_small/checkpoints --output hf/gpt_small \
//       --vocab-file data/sample/gpt2/encoder.json --merge-file data/sample/gpt2/vocab.bpe
//   convert_checkpoint --to trident --input hf/Llama-3.1-8B --output runs/llama3_8b_imported
//   convert_checkpoint --to merged --input runs/gpt_lora/checkpoints --output runs/gpt_lora_merged
//
// Runs on one process. Outputs are refused when they exist (--overwrite replaces them), before
// anything is read or written; every file is written under a temporary name and renamed.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "checkpoint/hf_convert.hpp"
#include "comm/communicator.hpp"
#include "common/error.hpp"
#include "io/safetensors.hpp"
#include "runtime/app_driver.hpp"

namespace po = boost::program_options;
using namespace trident;

namespace {

struct Options {
  std::string to, max_shard_size = "5GB";
  HfConvertOptions c;
};

std::optional<Options> parse_options(int argc, char** argv, int rank) {
  Options o;
  HfConvertOptions& c = o.c;
  po::options_description desc(
      "convert_checkpoint: Trident checkpoints <-> Hugging Face directories (GPT-2, Llama, Mistral, Qwen 2, Qwen 3, "
      "Megatron-BERT), and the merge of LoRA adapters");
  desc.add_options()("help,h", "print this help")(
      "to", po::value(&o.to)->required(),
      "hf (export a Trident checkpoint), trident (import) or merged (LoRA adapters merged into plain weights)")(
      "input", po::value(&c.input)->required(),
      "--to hf, merged: a save directory, iter_* directory or checkpoint.h5; --to trident: a Hugging Face "
      "directory")("output", po::value(&c.output)->required(),
                   "the directory to write (created; must not hold output files)")(
      "dtype", po::value(&c.dtype)->default_value("fp32"), "--to hf: the stored weights' type: fp32, bf16 or fp16")(
      "hf-architecture", po::value(&c.architecture),
      "--to hf: the Hugging Face model_type to write (gpt2, llama, mistral, qwen2, qwen3, megatron-bert); default: "
      "the checkpoint's own")("max-shard-size", po::value(&o.max_shard_size)->default_value("5GB"),
                              "--to hf: the most tensor bytes per safetensors file (e.g. 5GB, 500MB; 0: one file)")(
      "vocab-file", po::value(&c.vocab_file),
      "--to hf: the tokenizer vocabulary (GPT: encoder.json / vocab.json, BERT: vocab.txt); default: the deck's "
      "data.vocab_file")("merge-file", po::value(&c.merge_file),
                         "--to hf, GPT: the BPE merges (vocab.bpe / merges.txt); default: the deck's data.merges_file")(
      "seq-length", po::value(&c.seq_length)->default_value(0),
      "--to trident: model.seq_length of the stored deck (0: the position table's length)")(
      "overwrite", po::bool_switch(&c.overwrite), "replace output files that exist");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    if (vm.count("help")) {
      if (rank == 0) std::cout << desc;
      return std::nullopt;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error::all(std::string("convert_checkpoint: ") + e.what() + " (see --help)");
  }
  TRIDENT_REQUIRE(o.to == "hf" || o.to == "trident" || o.to == "merged",
                  "convert_checkpoint: --to must be hf, trident or merged, not '" << o.to << "'");
  TRIDENT_REQUIRE(c.seq_length >= 0, "convert_checkpoint: --seq-length must be >= 0");
  c.dtype = safetensors_dtype(c.dtype);
  c.shard_bytes = parse_byte_size(o.max_shard_size, "convert_checkpoint: --max-shard-size");
  return o;
}

int run(int argc, char** argv) {
  const Communicator world(MPI_COMM_WORLD);
  std::optional<Options> o = parse_options(argc, argv, world.rank());
  if (!o) return 0;
  TRIDENT_REQUIRE(world.size() == 1,
                  "convert_checkpoint runs on one process (got " << world.size() << "): run it without mpiexec -n");
  const std::string summary = o->to == "hf" ? export_hf(o->c) : o->to == "merged" ? merge_lora(o->c) : import_hf(o->c);
  std::printf("%s\n", summary.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_app(argc, argv, run); }
