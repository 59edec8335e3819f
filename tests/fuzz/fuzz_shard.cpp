// libFuzzer harness: the token shard reader. The input chooses the contents of a shard (its
// attributes, the type, rank and values of /tokens, the offsets, the sentence offsets), which the
// harness writes with HDF5 into a well-formed container, as any tool could; the reader must
// either open it or throw trident::Error naming the problem, and an opened shard must keep its
// promises: offsets that start at 0, never decrease and end at the token count, and reads that
// give ids inside the vocabulary (or throw). The HDF5 container format itself (a third-party
// parser) is not mutated.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "data/token_shard.hpp"
#include "io/hdf5_handle.hpp"

using trident::H5Handle;

namespace {
std::string file_path() {
  static const std::string p = "/tmp/trident_fuzz_shard_" + std::to_string(::getpid()) + ".h5";
  return p;
}

void int_attr(hid_t f, const char* name, std::int64_t v) { trident::h5_write_attr(f, name, v); }

template <class T>
void dataset(hid_t f, const char* name, hid_t file_type, hid_t mem_type, const std::vector<T>& v, bool two_d,
             bool chunked) {
  hsize_t dims[2] = {v.size(), 1};
  H5Handle space = trident::h5_space(H5Screate_simple(two_d ? 2 : 1, dims, nullptr));
  H5Handle dcpl = trident::h5_plist(H5Pcreate(H5P_DATASET_CREATE));
  if (chunked && !v.empty()) {
    hsize_t chunk[2] = {std::min<hsize_t>(v.size(), 64), 1};
    H5Pset_chunk(dcpl, two_d ? 2 : 1, chunk);
    H5Pset_fletcher32(dcpl);
  }
  H5Handle d = trident::h5_dataset(H5Dcreate2(f, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  if (!v.empty()) H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
}

bool write_shard(FuzzedDataProvider& in) {
  H5Handle f = trident::h5_file(H5Fcreate(file_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.valid()) return false;
  const char* formats[] = {"trident.tokens", "trident.checkpoint", ""};
  if (in.ConsumeIntegralInRange(0, 9) > 0)
    trident::h5_write_attr(f, "format", std::string(formats[in.ConsumeIntegralInRange(0, 2)]));
  if (in.ConsumeBool()) int_attr(f, "format_version", in.ConsumeIntegralInRange<std::int64_t>(-1, 3));
  if (in.ConsumeIntegralInRange(0, 9) > 0) trident::h5_write_attr(f, "tokenizer", std::string("GPT2BPETokenizer"));
  const std::int64_t vocab = in.ConsumeIntegralInRange<std::int64_t>(-2, 70000);
  if (in.ConsumeIntegralInRange(0, 9) > 0) int_attr(f, "vocab_size", vocab);
  if (in.ConsumeIntegralInRange(0, 9) > 0) int_attr(f, "eod_id", in.ConsumeIntegralInRange<std::int64_t>(-2, 70000));
  if (in.ConsumeBool()) int_attr(f, "max_token_id", in.ConsumeIntegralInRange<std::int64_t>(-2, 70000));
  const char* specials[] = {"cls_id", "sep_id", "mask_id",     "pad_id",
                            "bos_id", "eos_id", "sentinel_id", "num_sentinels"};
  for (const char* s : specials)
    if (in.ConsumeIntegralInRange(0, 7) == 0) int_attr(f, s, in.ConsumeIntegralInRange<std::int64_t>(-2, 70000));
  // tokens
  const int n_tokens = in.ConsumeIntegralInRange(0, 300);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(n_tokens));
  for (auto& t : tokens) t = in.ConsumeIntegralInRange<std::int32_t>(-3, 70000);
  const int type = in.ConsumeIntegralInRange(0, 4);
  const hid_t file_types[] = {H5T_STD_U16LE, H5T_STD_I32LE, H5T_STD_I64LE, H5T_IEEE_F32LE, H5T_STD_U32LE};
  if (in.ConsumeIntegralInRange(0, 9) > 0)
    dataset(f, "tokens", file_types[type], H5T_NATIVE_INT32, tokens, in.ConsumeIntegralInRange(0, 15) == 0,
            in.ConsumeBool());
  // offsets: mostly plausible (sorted cuts of the tokens), sometimes arbitrary
  auto offsets = [&](const char* name) {
    std::vector<std::int64_t> v;
    if (in.ConsumeIntegralInRange(0, 3) == 0) {
      const int k = in.ConsumeIntegralInRange(0, 20);
      for (int i = 0; i < k; ++i) v.push_back(in.ConsumeIntegralInRange<std::int64_t>(-5, 400));
    } else {
      v.push_back(0);
      std::int64_t at = 0;
      while (at < n_tokens && in.remaining_bytes() > 0) {
        at = std::min<std::int64_t>(n_tokens, at + in.ConsumeIntegralInRange<std::int64_t>(0, 40));
        v.push_back(at);
      }
      if (v.back() != n_tokens) v.push_back(n_tokens);
    }
    dataset(f, name, H5T_STD_I64LE, H5T_NATIVE_INT64, v, false, false);
  };
  if (in.ConsumeIntegralInRange(0, 9) > 0) offsets("document_offsets");
  if (in.ConsumeBool()) offsets("sentence_offsets");
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  {
    trident::H5QuietErrors quiet;
    if (!write_shard(in)) return 0;
  }
  try {
    trident::TokenShardReader r(file_path());
    const auto& m = r.meta();
    const auto& off = r.document_offsets();
    if (off.empty() || off.front() != 0 || off.back() != m.num_tokens) std::abort();
    for (std::int64_t i = 1; i < off.size(); ++i)
      if (off[i] < off[i - 1]) std::abort();
    if (m.max_token_id >= m.vocab_size) std::abort();
    std::vector<std::int32_t> out(static_cast<std::size_t>(m.num_tokens));
    try {
      if (m.num_tokens) r.read(0, m.num_tokens, out.data());
      for (auto t : out)
        if (t < 0 || t >= m.vocab_size) std::abort();  // a read that returns must be in range
    } catch (const trident::Error&) {
    }
  } catch (const trident::Error&) {
  }
  return 0;
}
