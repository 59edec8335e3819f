// Ring attention over the context-parallel group (layers/context_parallel.hpp).
#include "layers/context_parallel.hpp"

#include <vector>

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "ops/flash_attention.hpp"
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
  device_copy(slice(w.dkv[0], 0, block), 0.f);
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

UlyssesScratch::UlyssesScratch(DType dt, std::int64_t rows, std::int64_t q_cols, std::int64_t qkv_cols, int cp) {
  send = make_act(dt, "scratch::a2a_send", rows * qkv_cols);
  recv = make_act(dt, "scratch::a2a_recv", rows * qkv_cols);
  send32 = make_float("scratch::a2a_send32", rows * qkv_cols);
  recv32 = make_float("scratch::a2a_recv32", rows * qkv_cols);
  qkv_sub = make_act(dt, "scratch::a2a_qkv", rows * qkv_cols);
  y_sub = make_act(dt, "scratch::a2a_y", rows * q_cols);
  dy_sub = make_float("scratch::a2a_dy", rows * q_cols);
  dqkv_sub = make_float("scratch::a2a_dqkv", rows * qkv_cols);
  docs_local = make_int("scratch::a2a_docs_local", rows);
  docs_all = make_int("scratch::a2a_docs_all", cp * rows);
  doc_full = make_int("scratch::a2a_doc_full", cp * rows);
}

std::int64_t UlyssesScratch::bytes() const {
  std::int64_t n = send.bytes() + recv.bytes() + qkv_sub.bytes() + y_sub.bytes();
  for (const FloatView* v : {&send32, &recv32, &dy_sub, &dqkv_sub}) n += 4 * static_cast<std::int64_t>(v->span());
  n += 4 * static_cast<std::int64_t>(docs_local.span() + docs_all.span() + doc_full.span());
  return n;
}

namespace {
// The shapes of the exchange: this rank's rows and their split by heads.
struct Exchange {
  std::int64_t cp, rank, rows, C, Ckv, W, hs;
  CpChunks cc;
  HeadSplit qkv, out;
  AttentionShape sub;
  Exchange(const AttentionShape& s, const Communicator& comm)
      : cp(comm.size()), rank(comm.rank()), rows(s.B * s.T), C(s.C), Ckv(s.kv_C()), W(s.C + 2 * s.kv_C()),
        hs(s.hs()), cc{comm.size(), s.T} {
    const std::int64_t nhs = s.nh / cp, ngs = s.groups() / cp;
    qkv.n = 3;
    qkv.off[0] = 0;
    qkv.off[1] = C;
    qkv.off[2] = C + Ckv;
    qkv.len[0] = nhs * hs;
    qkv.len[1] = qkv.len[2] = ngs * hs;
    out.n = 1;
    out.len[0] = C / cp;
    sub = AttentionShape{s.B, s.T * cp, C / cp, nhs, 0, 0, ngs};
  }
  std::vector<std::int64_t> counts() const { return std::vector<std::int64_t>(static_cast<size_t>(cp), rows); }
};

void exchange(const Communicator& comm, const Exchange& x, const void* send, void* recv, std::int64_t row_bytes) {
  comm.alltoallv(send, x.counts(), recv, x.counts(), row_bytes);
}

// qkv (and, with packed documents, the document starts) in the whole sequences' layout
void exchange_qkv(const Act& qkv, const AttentionMask& mask, const Communicator& comm, const Exchange& x,
                  UlyssesScratch& w, AttentionMask* sub_mask) {
  const std::int64_t Wsub = x.qkv.width();
  cp_split_heads(w.send, qkv, x.rows, x.W, x.qkv, x.cp);
  exchange(comm, x, w.send.data(), const_cast<void*>(w.recv.data()), Wsub * dtype_bytes(qkv.dt));
  cp_gather_sequence(w.qkv_sub, w.recv, x.sub.B, x.cc, Wsub);
  *sub_mask = AttentionMask{true, IntView(), IntView()};
  if (mask.doc_start.extent(0) > 0) {
    device_copy(w.docs_local, mask.doc_start);
    comm.allgatherv(w.docs_local.data(), w.docs_all.data(), x.counts(), 4);
    cp_gather_sequence(w.doc_full, w.docs_all, x.sub.B, x.cc, 1);
    sub_mask->doc_start = w.doc_full;
  }
}

// an (rows, C) output of this rank's rows in the whole sequences' layout, (B, T, C / cp)
void exchange_out(const Act& local, const Act& sub, const Communicator& comm, const Exchange& x, UlyssesScratch& w) {
  cp_split_heads(w.send, local, x.rows, x.C, x.out, x.cp);
  exchange(comm, x, w.send.data(), const_cast<void*>(w.recv.data()), x.out.width() * dtype_bytes(local.dt));
  cp_gather_sequence(sub, w.recv, x.sub.B, x.cc, x.out.width());
}

DropoutSpec sub_dropout(const DropoutSpec& drop, const Exchange& x, std::int64_t nh) {
  DropoutSpec d = drop;
  d.head0 = x.rank * x.sub.nh;
  d.heads = nh;
  return d;
}
}  // namespace

void ulysses_attention_forward(const Act& y, const FloatView& lse, const Act& qkv, const AttentionShape& s,
                               const DropoutSpec& drop, const AttentionMask& mask, const Communicator& comm,
                               UlyssesScratch& w) {
  TRIDENT_REQUIRE(mask.causal && mask.key_valid.extent(0) == 0,
                  "internal: all-to-all attention serves causal self-attention without a padding mask");
  const Exchange x(s, comm);
  AttentionMask sub_mask;
  exchange_qkv(qkv, mask, comm, x, w, &sub_mask);
  flash_attention_forward(w.y_sub, lse, w.qkv_sub, x.sub, sub_dropout(drop, x, s.nh), sub_mask);
  // back: the rows of each rank's positions, this rank's heads
  cp_scatter_sequence(w.send, w.y_sub, x.sub.B, x.cc, x.out.width());
  exchange(comm, x, w.send.data(), const_cast<void*>(w.recv.data()), x.out.width() * dtype_bytes(y.dt));
  cp_merge_heads(y, w.recv, x.rows, x.C, x.out, x.cp);
}

void ulysses_attention_backward(const FloatView& dqkv, const FloatView& dy, const Act& qkv, const Act& y,
                                const FloatView& lse, const FloatView& delta, const AttentionShape& s,
                                const DropoutSpec& drop, const AttentionMask& mask, const Communicator& comm,
                                UlyssesScratch& w) {
  const Exchange x(s, comm);
  AttentionMask sub_mask;
  exchange_qkv(qkv, mask, comm, x, w, &sub_mask);
  exchange_out(y, w.y_sub, comm, x, w);
  const std::int64_t Cs = x.out.width(), Wsub = x.qkv.width();
  cp_split_heads(w.send32, dy, x.rows, x.C, x.out, x.cp);
  exchange(comm, x, w.send32.data(), w.recv32.data(), Cs * 4);
  cp_gather_sequence(w.dy_sub, w.recv32, x.sub.B, x.cc, Cs);
  flash_attention_backward(w.dqkv_sub, w.dy_sub, w.qkv_sub, w.y_sub, lse, delta, x.sub, sub_dropout(drop, x, s.nh),
                           sub_mask);
  cp_scatter_sequence(w.send32, w.dqkv_sub, x.sub.B, x.cc, Wsub);
  exchange(comm, x, w.send32.data(), w.recv32.data(), Wsub * 4);
  cp_merge_heads(dqkv, w.recv32, x.rows, x.W, x.qkv, x.cp);
}

}  // namespace trident
