// Conversions between Trident checkpoints and Hugging Face model directories, and the merge of
// LoRA adapters (docs/DESIGN.md "Hugging Face formats"; apps/convert_checkpoint is their command
// line). Each runs on one process and streams: a tensor is read, converted and written in parts
// of about 2^24 values (a GPT-2 Conv1D weight, which is transposed, whole), straight from the
// memory-mapped safetensors files or the checkpoint's datasets, so a model far larger than memory
// converts in the memory of its largest part (measured in perf/results/hf_convert_memory_*.md).
// Every output file is written under a temporary name and renamed; outputs that exist are refused
// (unless overwrite) before anything is read or written; errors are Error::all naming the file,
// tensor or key.
#pragma once
#include <cstdint>
#include <string>

namespace trident {

struct HfConvertOptions {
  std::string input, output;
  // --to hf
  std::string dtype = "fp32";                 // the stored weights' type: fp32, bf16 or fp16
  std::string vocab_file, merge_file;         // GPT-2 BPE / BERT WordPiece files (default: the deck's)
  std::string architecture;                   // Hugging Face model_type to write ("": the checkpoint's own)
  std::uint64_t shard_bytes = 5000000000ull;  // most tensor bytes per safetensors file (0: one file)
  // --to trident
  std::int64_t seq_length = 0;  // model.seq_length of the stored deck (0: the position table's)
  bool overwrite = false;       // replace output files that exist
};

// A Trident checkpoint (save directory, iter_* directory or checkpoint.h5; LoRA adapters merged
// into their base) -> a Hugging Face directory: config.json (written last), the weights as
// model.safetensors or shards of at most shard_bytes with model.safetensors.index.json,
// tokenizer_config.json and the tokenizer files. Returns a one-line summary.
std::string export_hf(const HfConvertOptions& o);

// A Hugging Face directory (config.json, model.safetensors or an index and its shards; F32, BF16,
// F16) -> a save directory: iter_0000000/checkpoint.h5 (fp32, no optimizer state) and `latest`,
// which loads under any tp/pp/dp, model.ini (the model's deck keys) and the tokenizer files of
// the input. Returns a one-line summary.
std::string import_hf(const HfConvertOptions& o);

// A checkpoint of LoRA adapters -> a save directory of plain weights W + (alpha / rank) B A
// (computed in double, rounded once) with the deck's lora keys reset. Returns a summary line.
std::string merge_lora(const HfConvertOptions& o);

}  // namespace trident
