// Ring attention over the context-parallel group (layers/context_parallel.hpp).
#include "layers/context_parallel.hpp"

#include <vector>

#include "common/error.hpp"
#include "ops/ring_attention.hpp"

namespace trident {

namespace {
constexpr int kKvTag = 1, kGradTag = 2;

// the floats of a block's message (16-bit blocks travel as pairs of words)
float* words(const Act& a) { return a.is_half() ? reinterpret_cast<float*>(a.h.data()) : a.f.data(); }
std::int64_t word_count(const Act& a, std::int64_t n) { return a.is_half() ? n / 2 : n; }
}  // namespace

RingScratch::RingScratch(DType dt, std::int64_t rows, std::int64_t q_cols, std::int64_t kv_cols) {
  for (int i = 0; i < 2; ++i) {
    kv[i] = make_act(dt, "scratch::ring_kv", rows * kv_cols);
    dkv[i] = make_float("scratch::ring_dkv", rows * kv_cols);
  }
  acc = make_float("scratch::ring_acc", rows * q_cols);
}

std::int64_t RingScratch::bytes() const {
  return kv[0].bytes() + kv[1].bytes() + 4 * static_cast<std::int64_t>(dkv[0].span() + dkv[1].span() + acc.span());
}

void ring_attention_forward(const Act& y, const FloatView& lse, const Act& qkv, const AttentionShape& s,
                            const DropoutSpec& drop, const AttentionMask& mask, const Communicator& cp,
                            RingScratch& w) {
  const std::int64_t n = cp.size(), r = cp.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const std::int64_t C = s.C, Ckv = s.kv_C(), block = s.B * s.T * 2 * Ckv;
  TRIDENT_REQUIRE(mask.causal && mask.key_valid.extent(0) == 0,
                  "internal: ring attention serves causal self-attention without a padding mask");
  const CpChunks cc{n, s.T};
  ring_forward_begin(w.acc, lse, s);
  if (n > 1) ring_pack_kv(w.kv[0], qkv, s);
  int cur = 0;
  for (std::int64_t step = 0; step < n; ++step) {
    std::vector<MPI_Request> pending;
    if (step + 1 < n)  // the next block travels while this one is computed
      pending = cp.p2p_start(
          {{true, words(w.kv[cur]), word_count(w.kv[cur], block), static_cast<int>(next), kKvTag},
           {false, words(w.kv[1 - cur]), word_count(w.kv[1 - cur], block), static_cast<int>(prev), kKvTag}});
    const KvBlock kv = step == 0 ? KvBlock{qkv, C + 2 * Ckv, C, C + Ckv, r}
                                 : KvBlock{w.kv[cur], 2 * Ckv, 0, Ckv, (r - step + n) % n};
    ring_forward_block(w.acc, lse, qkv, kv, r, cc, s, drop, mask);
    if (step + 1 < n) {
      Communicator::wait_all(pending);
      cur = 1 - cur;
    }
  }
  ring_forward_end(y, w.acc, s);
}

void ring_attention_backward(const FloatView& dqkv, const FloatView& dy, const Act& qkv, const Act& y,
                             const FloatView& lse, const FloatView& delta, const AttentionShape& s,
                             const DropoutSpec& drop, const AttentionMask& mask, const Communicator& cp,
                             RingScratch& w) {
  const std::int64_t n = cp.size(), r = cp.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const std::int64_t C = s.C, Ckv = s.kv_C(), block = s.B * s.T * 2 * Ckv;
  const CpChunks cc{n, s.T};
  ring_backward_begin(dqkv, delta, dy, y, s);
  ring_pack_kv(w.kv[0], qkv, s);
  Kokkos::deep_copy(slice(w.dkv[0], 0, block), 0.f);
  int cur = 0;
  for (std::int64_t step = 0; step < n; ++step) {
    std::vector<MPI_Request> pending;
    if (step + 1 < n)  // the next block's keys and values travel while this one is computed
      pending = cp.p2p_start(
          {{true, words(w.kv[cur]), word_count(w.kv[cur], block), static_cast<int>(next), kKvTag},
           {false, words(w.kv[1 - cur]), word_count(w.kv[1 - cur], block), static_cast<int>(prev), kKvTag}});
    const KvBlock kv = step == 0 ? KvBlock{qkv, C + 2 * Ckv, C, C + Ckv, r}
                                 : KvBlock{w.kv[cur], 2 * Ckv, 0, Ckv, (r - step + n) % n};
    ring_backward_block(dqkv, w.dkv[cur], dy, qkv, kv, lse, delta, r, cc, s, drop, mask);
    // the block's gradients so far go on with it (after the last step: home to their owner, next)
    std::vector<MPI_Request> grads = cp.p2p_start(
        {{true, w.dkv[cur].data(), block, static_cast<int>(next), kGradTag},
         {false, w.dkv[1 - cur].data(), block, static_cast<int>(prev), kGradTag}});
    Communicator::wait_all(pending);
    Communicator::wait_all(grads);
    cur = 1 - cur;
  }
  ring_backward_end(dqkv, w.dkv[cur], s);
}

}  // namespace trident
