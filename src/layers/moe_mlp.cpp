// The mixture-of-experts module (moe_mlp.hpp): parameters, kept activations, scratch, forward and
// backward.
#include "layers/moe_mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "layers/transformer_layer.hpp"
#include "ops/elementwise.hpp"
#include "ops/gemm.hpp"
#include "ops/mixed_precision.hpp"
#include "ops/moe.hpp"

namespace trident {

namespace {

// Adds the wall time since the last lap to a part of MoeState::seconds, after a fence.
class Lap {
 public:
  explicit Lap(MoeState& st) : st_(st), t_(std::chrono::steady_clock::now()) {}
  void to(MoeState::Part part) {
    TRIDENT_DEVICE_WAIT();
    const auto now = std::chrono::steady_clock::now();
    st_.seconds[part] += std::chrono::duration<double>(now - t_).count();
    t_ = now;
  }

 private:
  MoeState& st_;
  std::chrono::steady_clock::time_point t_;
};

Act act_part(const Act& a, std::int64_t offset, std::int64_t n) {
  return a.is_half() ? Act(a.dt, slice(a.h, offset, n)) : Act(slice(a.f, offset, n));
}

// One micro-batch's routing and expert activations (per layer and micro-batch in flight).
struct MoeKept final : MlpKept {
  FloatView logits, lse, ssum, probs;  // (R, E) (R) (R) (R k)
  IntView idx, slot_row, row_token;    // (R k) x3 (row_token: the first plan.rows() entries)
  Act h, a;                            // (R k, blocks Fe): fc1's output with its bias; (R k, Fe): fc2's input
  FloatView yp;                        // (R k, C): the experts' outputs (fp32, with their fc2 bias)
  MoePlan plan;                        // the dispatch (host)
  // expert parallelism (ep > 1): the exchange, the rows this rank's experts received in their
  // (local expert, source) order, and their outputs; h and a then hold those rows too
  MoeExchange ex;
  Act xe;
  FloatView ye;
  // expert tensor parallelism (etp > 1): the etp ranks' rows of this rank's experts gathered, in
  // (local expert, etp rank) order (exg: that regrouping); h and a then hold those rows
  MoeExchange exg;
  Act xg;
  std::vector<double> paux;          // (E) sum over this rank's tokens of the load-balancing scores
  std::vector<std::int64_t> routed;  // (E) selections per expert over the TP group (the aux loss's counts)
  double aux = 0, z = 0;             // this rank's part of the load-balancing loss; its mean lse^2
  std::shared_ptr<MlpKept> shared;   // the shared expert's
  std::int64_t bytes() const override {
    std::int64_t n = 0;
    for (const FloatView* v : {&logits, &lse, &ssum, &probs, &yp, &ye}) n += static_cast<std::int64_t>(v->span()) * 4;
    for (const IntView* v : {&idx, &slot_row, &row_token}) n += static_cast<std::int64_t>(v->span()) * 4;
    n += h.bytes() + a.bytes() + xe.bytes() + xg.bytes();
    if (shared) n += shared->bytes();
    return n;
  }
};

struct MoeScratch final : MlpScratch {
  FloatView x32, wr32;                  // (R, C), (E, C): the router's fp32 operands (16-bit runs)
  Act xp;                               // (R k, C): the permuted input
  FloatView y32;                        // (R k, blocks Fe): fc1's fp32 GEMM output (16-bit runs)
  FloatView dyp, da, dh, dxp;           // (R k, C) (R k, Fe) (R k, blocks Fe) (R k, C)
  FloatView dlogits, dprobs, aux_grad;  // (R, E) (R k) (E)
  FloatView dtmp;                       // (R, C): the router's and the shared expert's input gradients
  FloatView shared_out;                 // (R, C): the shared expert's output
  HalfView dy16;                        // (R k, max(C, blocks Fe)): 16-bit copies of gradients entering GEMMs
  // expert parallelism: the rows received before their regrouping (the input's type), and the
  // fp32 rows in flight between the two orders; the expert side's gradient rows
  Act xrecv;
  FloatView xfer, dye, dxe;
  IntView regroup, inverse;  // (M) the exchange's permutations on the device
  // expert tensor parallelism: the gathered rows before their regrouping, the fp32 partial outputs,
  // rows in flight, the gathered output gradients and the partial input gradients
  Act xgrecv;
  FloatView yg, xfer_g, dyg, dxg;
  IntView regroup_g, inverse_g;
  std::shared_ptr<MlpScratch> shared;
  std::int64_t bytes() const override {
    std::int64_t n = xp.bytes() + xrecv.bytes() + xgrecv.bytes() + static_cast<std::int64_t>(dy16.span()) * 2 +
                     static_cast<std::int64_t>(regroup.span() + inverse.span() + regroup_g.span() + inverse_g.span()) *
                         4;
    for (const FloatView* v : {&x32, &wr32, &y32, &dyp, &da, &dh, &dxp, &dlogits, &dprobs, &aux_grad, &dtmp,
                               &shared_out, &xfer, &dye, &dxe, &yg, &xfer_g, &dyg, &dxg})
      n += static_cast<std::int64_t>(v->span()) * 4;
    if (shared) n += shared->bytes();
    return n;
  }
};

struct Expert {
  ParamId w1 = -1, b1 = -1, w2 = -1, b2 = -1;
};

class MoeMlp final : public MlpModule {
 public:
  MoeMlp(ParamStore& store, const std::string& prefix, const TransformerShape& s, std::int64_t layer)
      : s_(s), prefix_(prefix), layer_(layer), store_(&store), act_(make_mlp_activation(s)) {
    const MoeArch& m = s.moe;
    E_ = m.num_experts;
    k_ = m.router_topk;
    C_ = s.hidden_size;
    blocks_ = act_->blocks();
    R_ = s.local_rows();
    route_.E = E_;
    route_.k = k_;
    route_.sigmoid = m.router_score_function == "sigmoid";
    route_.pre_softmax = m.router_pre_softmax;
    TRIDENT_REQUIRE(s.moe_state, "internal: an MoE layer without its MoeState");
    // expert parallelism: this rank holds experts e0 .. e0 + El - 1 of the E
    ep_ = s.tp.ep ? s.tp.ep->size() : 1;
    TRIDENT_REQUIRE(E_ % ep_ == 0, "moe.num_experts (" << E_ << ") is not divisible by parallel.ep (" << ep_ << ")");
    El_ = E_ / ep_;
    e0_ = (s.tp.ep ? s.tp.ep->rank() : 0) * El_;
    // expert tensor parallelism: each expert's fc1 rows (gate and up alike) and fc2 columns split
    // over etp ranks, Fe = Fg / etp of them here (Megatron's --expert-tensor-parallel-size)
    etp_ = s.tp.etp ? s.tp.etp->size() : 1;
    etp_rank_ = s.tp.etp ? s.tp.etp->rank() : 0;
    Fg_ = m.ffn_hidden_size;
    TRIDENT_REQUIRE(Fg_ % etp_ == 0,
                    "moe.ffn_hidden_size (" << Fg_ << ") is not divisible by parallel.expert_tp (" << etp_ << ")");
    Fe_ = Fg_ / etp_;
    exchange_ = ep_ > 1 || etp_ > 1;
    // training with tp > 1 needs sequence parallelism (the deck's check); generation at tp > 1 routes
    // every row on every TP rank alike (infer)
    ParamInfo r;
    r.name = prefix + "/router/weight";
    r.shape = r.global_shape = r.valid = {E_, C_};
    r.global_offset = {0, 0};
    r.weight_decay = true;
    r.init_std = s.init_std();
    router_ = store.declare(r);
    if (m.router_enable_expert_bias) {  // aux-loss-free balancing: fp32 state, not trained
      ParamInfo b;
      b.name = prefix + "/router/expert_bias";
      b.shape = b.global_shape = b.valid = {E_};
      b.global_offset = {0};
      bias_ = store.declare_state(b);
    }
    for (std::int64_t j = 0; j < El_; ++j) {
      const std::string e = prefix + "/experts/" + std::to_string(e0_ + j);
      Expert x;
      x.w1 = declare_sharded(store, e + "/fc1/weight", true, s.init_std(), true);
      if (s.add_bias_linear) x.b1 = declare_sharded(store, e + "/fc1/bias", true, 0.f, false);
      experts_.push_back(x);
    }
    if (m.shared_expert_intermediate_size > 0) {
      TransformerShape ss = s;
      ss.ffn_hidden_size = m.shared_expert_intermediate_size;
      ss.moe = MoeArch{};
      shared_ = make_mlp(store, prefix + "/shared_experts", ss, -1);
    }
    zeros_ = make_act(s.dt, "moe::zero_bias", C_);
    if (!s.add_bias_linear) zero_fc1_ = make_act(s.dt, "moe::zero_fc1_bias", blocks_ * Fe_);
  }

  void declare_output(ParamStore& store) override {
    for (std::int64_t j = 0; j < El_; ++j) {
      const std::string e = prefix_ + "/experts/" + std::to_string(e0_ + j);
      Expert& x = experts_[static_cast<size_t>(j)];
      x.w2 = declare_sharded(store, e + "/fc2/weight", false, s_.out_init_std, true);
      if (s_.add_bias_linear) x.b2 = declare_bias(store, e + "/fc2/bias", C_);  // replicated over etp
    }
    if (shared_) shared_->declare_output(store);
  }

  const char* kind() const override { return "moe"; }

  std::shared_ptr<MlpKept> make_kept() const override {
    auto k = std::make_shared<MoeKept>();
    const std::int64_t N = R_ * k_;
    k->logits = make_float("moe::logits", R_ * E_);
    k->lse = make_float("moe::lse", R_);
    k->ssum = make_float("moe::ssum", R_);
    k->probs = make_float("moe::probs", N);
    k->idx = make_int("moe::idx", N);
    k->slot_row = make_int("moe::slot_row", N);
    k->row_token = make_int("moe::row_token", N);
    k->h = make_act(s_.dt, "moe::h", N * blocks_ * Fe_);
    k->a = make_act(s_.dt, "moe::a", N * Fe_);
    k->yp = make_float("moe::yp", N * C_);
    if (shared_) k->shared = shared_->make_kept();
    return k;
  }

  std::shared_ptr<MlpScratch> make_scratch() const override {
    auto s = std::make_shared<MoeScratch>();
    const std::int64_t N = R_ * k_;
    const bool half = s_.dt != DType::F32;
    if (half) {
      s->x32 = make_float("moe::x32", R_ * C_);
      s->wr32 = make_float("moe::wr32", E_ * C_);
      s->y32 = make_float("moe::y32", N * blocks_ * Fe_);
      s->dy16 = make_half("moe::dy16", N * std::max(C_, blocks_ * Fe_));
    }
    s->xp = make_act(s_.dt, "moe::xp", N * C_);
    s->dyp = make_float("moe::dyp", N * C_);
    s->da = make_float("moe::da", N * Fe_);
    s->dh = make_float("moe::dh", N * blocks_ * Fe_);
    s->dxp = make_float("moe::dxp", N * C_);
    s->dlogits = make_float("moe::dlogits", R_ * E_);
    s->dprobs = make_float("moe::dprobs", N);
    s->aux_grad = make_float("moe::aux_grad", E_);
    s->dtmp = make_float("moe::dtmp", R_ * C_);
    if (shared_) {
      s->shared_out = make_float("moe::shared_out", R_ * C_);
      s->shared = shared_->make_scratch();
    }
    return s;
  }

  void forward(const FloatView& branch, const Act& in, MlpKept& kept, MlpScratch& scratch, const MlpWork& w) override {
    auto& k = static_cast<MoeKept&>(kept);
    auto& s = static_cast<MoeScratch&>(scratch);
    Lap lap(*s_.moe_state);
    // the router: logits (R, E) = x W_r^T in fp32
    router_logits(k.logits, in, s);
    moe_route(k.idx, k.probs, k.lse, k.ssum, s.aux_grad /* paux */, k.logits, R_, route_, expert_bias());
    lap.to(MoeState::kRouter);
    plan(k, s);
    // the experts over their rows
    const std::int64_t N = k.plan.rows();
    moe_gather(s.xp, in, k.row_token, N, C_);
    if (exchange_) dispatch(k, s);   // the rows to the ranks holding their experts
    if (etp_ > 1) gather_etp(k, s);  // every row of those experts to each of their etp ranks
    lap.to(MoeState::kDispatch);
    const MoePlan& lp = local_plan(k);
    const Act xe = etp_ > 1 ? k.xg : exchange_ ? k.xe : s.xp;        // the experts' input rows
    const FloatView ye = etp_ > 1 ? s.yg : exchange_ ? k.ye : k.yp;  // and output rows (etp: partial)
    const bool half = s_.dt != DType::F32;
    const FloatView y = half ? s.y32 : k.h.f;  // fc1's fp32 GEMM output
    grouped(Trans::N, Trans::T, 1.f, 0.f, lp, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      const Act w1 = store_->param(experts_[static_cast<size_t>(e)].w1);
      return GemmGroup{rows,         blocks_ * Fe_, C_, operand(xe).at(n0 * C_),
                       C_,           operand(w1),   C_, y.data() + n0 * blocks_ * Fe_,
                       blocks_ * Fe_};
    });
    for_experts(lp, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      const std::int64_t bF = blocks_ * Fe_;
      act_->forward(act_part(k.h, n0 * bF, rows * bF), act_part(k.a, n0 * Fe_, rows * Fe_),
                    slice(y, n0 * bF, rows * bF), bias_of(experts_[static_cast<size_t>(e)].b1), rows, Fe_);
    });
    TRIDENT_DEVICE_WAIT();
    grouped(Trans::N, Trans::T, 1.f, 0.f, lp, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      const Act w2 = store_->param(experts_[static_cast<size_t>(e)].w2);
      return GemmGroup{rows, C_, Fe_, operand(k.a).at(n0 * Fe_), Fe_, operand(w2), Fe_, ye.data() + n0 * C_, C_};
    });
    if (s_.add_bias_linear && etp_ == 1)
      for_experts(lp, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
        moe_add_bias(slice(ye, n0 * C_, rows * C_), store_->param(experts_[static_cast<size_t>(e)].b2), rows, C_);
      });
    lap.to(MoeState::kExperts);
    if (etp_ > 1) {  // the partial outputs summed over the etp ranks, each keeping its own rows
      TRIDENT_DEVICE_WAIT();
      scatter_etp(k.ye, s.yg, k, s);
      if (s_.add_bias_linear)  // fc2's bias once, on the summed rows
        for (std::int64_t e = 0; e < El_; ++e) {
          const std::int64_t n0 = k.ex.offsets[static_cast<size_t>(e)], rows = k.ex.counts[static_cast<size_t>(e)];
          if (rows > 0)
            moe_add_bias(slice(k.ye, n0 * C_, rows * C_), store_->param(experts_[static_cast<size_t>(e)].b2), rows, C_);
        }
      lap.to(MoeState::kDispatch);
    }
    if (exchange_) {  // the outputs back to the ranks of their tokens
      TRIDENT_DEVICE_WAIT();
      exchange_back(k.yp, k.ye, k.ex, s);
      lap.to(MoeState::kDispatch);
    }
    moe_combine(branch, k.yp, k.probs, k.slot_row, R_, k_, C_);
    if (shared_) {
      shared_->forward(s.shared_out, in, *k.shared, *s.shared, w);
      TRIDENT_DEVICE_WAIT();
      accumulate(branch, s.shared_out, R_ * C_);
    }
    lap.to(MoeState::kCombine);
  }

  Act output_bias() const override { return shared_ ? shared_->output_bias() : zeros_; }

  void backward(const FloatView& din, const FloatView& dbranch, const Act& in, MlpKept& kept, MlpScratch& scratch,
                const MlpWork& w) override {
    auto& k = static_cast<MoeKept&>(kept);
    auto& s = static_cast<MoeScratch&>(scratch);
    const std::int64_t N = k.plan.rows(), bF = blocks_ * Fe_;
    Lap lap(*s_.moe_state);
    // the combination: d yp and d probs
    moe_combine_backward(s.dyp, s.dprobs, dbranch, k.yp, k.probs, k.slot_row, R_, k_, C_);
    lap.to(MoeState::kCombine);
    const MoePlan& lp = local_plan(k);
    if (exchange_) {  // the output gradients to the ranks of the experts
      // room for both orders first (growing a view later would drop what it holds)
      ensure_scratch(s, std::max(k.ex.rows(), etp_ > 1 ? k.exg.rows() : 0));
      if (etp_ > 1) ensure_etp_scratch(s, k.exg.rows());
      upload_exchange(k.ex, s.regroup, s.inverse);
      TRIDENT_DEVICE_WAIT();
      s_.tp.ep->alltoallv(s.dyp.data(), k.ex.send_rows, s.xfer.data(), k.ex.recv_rows, C_ * 4);
      moe_gather(act(s.dye), act(s.xfer), s.regroup, k.ex.rows(), C_);
      TRIDENT_DEVICE_WAIT();
      lap.to(MoeState::kDispatch);
    }
    if (etp_ > 1) {  // and every output gradient of the experts' rows to each of their etp ranks
      const std::int64_t Mg = k.exg.rows();
      upload_exchange(k.exg, s.regroup_g, s.inverse_g);
      TRIDENT_DEVICE_WAIT();
      s_.tp.etp->allgatherv(s.dye.data(), s.xfer_g.data(), k.exg.recv_rows, C_ * 4);
      moe_gather(act(s.dyg), act(s.xfer_g), s.regroup_g, Mg, C_);
      TRIDENT_DEVICE_WAIT();
      lap.to(MoeState::kDispatch);
    }
    const FloatView dye = etp_ > 1 ? s.dyg : exchange_ ? s.dye : s.dyp;
    const FloatView dxe = etp_ > 1 ? s.dxg : exchange_ ? s.dxe : s.dxp;
    // fc2: d a = dyp W2, dW2 += dyp^T a (16-bit: dyp rounded first), db2 += column sums of dyp
    experts_backward(lp, dye, s.dy16, operand(k.a), s.da, C_, Fe_, &Expert::w2);
    for_experts(lp, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      const Expert& x = experts_[static_cast<size_t>(e)];
      if (x.b2 >= 0 && !frozen()) bias_backward(store_->grad(x.b2), slice(dye, n0 * C_, rows * C_), rows, C_);
      act_->backward(slice(s.dh, n0 * bF, rows * bF), slice(s.da, n0 * Fe_, rows * Fe_),
                     act_part(k.h, n0 * bF, rows * bF), rows, Fe_);
    });
    TRIDENT_DEVICE_WAIT();
    // fc1: d xp = dh W1, dW1 += dh^T xp (xp gathered again; under ep > 1 the rows kept), db1 +=
    // column sums of dh
    lap.to(MoeState::kExperts);
    if (!exchange_) moe_gather(s.xp, in, k.row_token, N, C_);
    lap.to(MoeState::kDispatch);
    experts_backward(lp, s.dh, s.dy16, operand(etp_ > 1 ? k.xg : exchange_ ? k.xe : s.xp), dxe, bF, C_, &Expert::w1);
    for_experts(lp, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      const Expert& x = experts_[static_cast<size_t>(e)];
      if (x.b1 >= 0 && !frozen()) bias_backward(store_->grad(x.b1), slice(s.dh, n0 * bF, rows * bF), rows, bF);
    });
    lap.to(MoeState::kExperts);
    if (etp_ > 1) {  // the partial input gradients summed over the etp ranks, each keeping its rows
      TRIDENT_DEVICE_WAIT();
      scatter_etp(s.dxe, s.dxg, k, s);
      lap.to(MoeState::kDispatch);
    }
    if (exchange_) {  // the input gradients back to the ranks of their tokens
      TRIDENT_DEVICE_WAIT();
      exchange_back(s.dxp, s.dxe, k.ex, s);
      lap.to(MoeState::kDispatch);
    }
    moe_scatter_add(din, s.dxp, k.slot_row, R_, k_, C_);  // d in from the experts (R, C)
    lap.to(MoeState::kDispatch);
    // the router: d logits from d probs, the load-balancing loss and the z-loss
    router_backward(k, s, in);
    accumulate(din, s.dtmp, R_ * C_);
    lap.to(MoeState::kRouter);
    if (shared_) {
      shared_->backward(s.dtmp, dbranch, in, *k.shared, *s.shared, w);
      TRIDENT_DEVICE_WAIT();
      accumulate(din, s.dtmp, R_ * C_);
    }
    lap.to(MoeState::kCombine);
    record(k);
  }

  // Generation (fp32, dropless whatever the capacity factor: a generated token is never dropped):
  // the training path's routing, plan and grouped GEMMs on workspaces grown to R rows.
  void infer(const FloatView& out, const FloatView& in, std::int64_t R, const FloatView& fc_work,
             const FloatView& act_work) const override {
    TRIDENT_REQUIRE(!exchange_, "internal: generation holds every expert whole (parallel.ep = expert_tp = 1)");
    InferWork& w = infer_work(R);
    const std::int64_t bF = blocks_ * Fe_;
    gemm(Trans::N, Trans::T, R, E_, C_, 1.f, in.data(), C_, store_->value(router_).data(), C_, 0.f, w.logits.data(),
         E_);
    TRIDENT_DEVICE_WAIT();
    moe_route(w.idx, w.probs, w.lse, w.ssum, w.paux, w.logits, R, route_, expert_bias());
    auto idx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w.idx);
    auto probs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w.probs);
    const MoePlan p = moe_plan(idx.data(), probs.data(), R, k_, E_, 0, true);
    HostIntView rt("moe::row_token_host", static_cast<size_t>(R * k_)),
        sr("moe::slot_row_host", static_cast<size_t>(R * k_));
    for (std::int64_t n = 0; n < R * k_; ++n) {
      rt(n) = p.row_token[static_cast<size_t>(n)];
      sr(n) = p.slot_row[static_cast<size_t>(n)];
    }
    const IntView row_token = slice(w.row_token, 0, R * k_), slot_row = slice(w.slot_row, 0, R * k_);
    Kokkos::deep_copy(row_token, rt);
    Kokkos::deep_copy(slot_row, sr);
    const std::int64_t N = p.rows();
    moe_gather(act(w.xp), act(in), row_token, N, C_);
    grouped(Trans::N, Trans::T, 1.f, 0.f, p, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      return GemmGroup{rows, bF,
                       C_,   operand(w.xp.data()).at(n0 * C_),
                       C_,   operand(store_->value(experts_[static_cast<size_t>(e)].w1).data()),
                       C_,   w.h.data() + n0 * bF,
                       bF};
    });
    for_experts(p, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      const Expert& x = experts_[static_cast<size_t>(e)];
      if (x.b1 >= 0) moe_add_bias(slice(w.h, n0 * bF, rows * bF), store_->param(x.b1), rows, bF);
      act_->infer(slice(w.a, n0 * Fe_, rows * Fe_), slice(w.h, n0 * bF, rows * bF), rows, Fe_);
    });
    TRIDENT_DEVICE_WAIT();
    grouped(Trans::N, Trans::T, 1.f, 0.f, p, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      return GemmGroup{rows, C_,
                       Fe_,  operand(w.a.data()).at(n0 * Fe_),
                       Fe_,  operand(store_->value(experts_[static_cast<size_t>(e)].w2).data()),
                       Fe_,  w.yp.data() + n0 * C_,
                       C_};
    });
    for_experts(p, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      const Expert& x = experts_[static_cast<size_t>(e)];
      if (x.b2 >= 0) moe_add_bias(slice(w.yp, n0 * C_, rows * C_), store_->param(x.b2), rows, C_);
    });
    moe_combine(out, w.yp, w.probs, slot_row, R, k_, C_);
    if (shared_) {
      const FloatView so = slice(w.shared_out, 0, R * C_);
      shared_->infer(so, in, R, fc_work, act_work);  // with its fc2 bias
      TRIDENT_DEVICE_WAIT();
      accumulate(out, so, R * C_);
    }
    TRIDENT_DEVICE_WAIT();
  }

 private:
  // An expert's fc1 weight or bias (column-parallel: blocks of Fg rows, gate and up, each split
  // over etp) or fc2 weight (row-parallel: Fg columns split over etp); replicated over TP ranks
  // (ParamInfo::tp_replicated means "over etp" for experts) only at etp 1.
  ParamId declare_sharded(ParamStore& store, const std::string& name, bool fc1, float std, bool weight) const {
    ParamInfo p;
    p.name = name;
    if (fc1) {
      p.shape = weight ? std::vector<std::int64_t>{blocks_ * Fe_, C_} : std::vector<std::int64_t>{blocks_ * Fe_};
      p.global_shape = weight ? std::vector<std::int64_t>{blocks_ * Fg_, C_} : std::vector<std::int64_t>{blocks_ * Fg_};
      p.global_offset = weight ? std::vector<std::int64_t>{etp_rank_ * Fe_, 0}
                               : std::vector<std::int64_t>{etp_rank_ * Fe_};
      p.valid = weight ? std::vector<std::int64_t>{Fe_, C_} : std::vector<std::int64_t>{Fe_};
      p.row_blocks = blocks_;
    } else {
      p.shape = {C_, Fe_};
      p.global_shape = {C_, Fg_};
      p.global_offset = {0, etp_rank_ * Fe_};
      p.valid = {C_, Fe_};
    }
    p.weight_decay = weight;
    p.init_std = std;
    p.expert = true;
    p.tp_replicated = etp_ == 1;
    return store.declare(p);
  }
  static ParamId declare_bias(ParamStore& store, const std::string& name, std::int64_t n) {
    ParamInfo p;
    p.name = name;
    p.shape = p.global_shape = p.valid = {n};
    p.global_offset = {0};
    p.expert = true;
    return store.declare(p);
  }

  Act bias_of(ParamId b) const { return b >= 0 ? store_->param(b) : zero_fc1_; }

  // The rows of this rank's experts: the plan (ep = 1), or the rows received (ep > 1), as a
  // plan over the El local experts.
  const MoePlan& local_plan(MoeKept& k) const {
    if (!exchange_) return k.plan;
    const MoeExchange& x = etp_ > 1 ? k.exg : k.ex;
    local_.counts = x.counts;
    local_.offsets = x.offsets;
    return local_;
  }

  // Grows a view to at least n elements (the expert side's rows under ep > 1 vary with the routing).
  static void grow(FloatView& v, const char* label, std::int64_t n) {
    if (static_cast<std::int64_t>(v.extent(0)) < n) v = make_float(label, n);
  }
  static void grow(Act& a, DType dt, const char* label, std::int64_t n) {
    if (a.size() < n || a.dt != dt) a = make_act(dt, label, n);
  }
  static void grow(HalfView& v, const char* label, std::int64_t n) {
    if (static_cast<std::int64_t>(v.extent(0)) < n) v = make_half(label, n);
  }
  static void grow(IntView& v, const char* label, std::int64_t n) {
    if (static_cast<std::int64_t>(v.extent(0)) < n) v = make_int(label, n);
  }
  // room for M expert-side rows (and 5/4 of them, so that a routing a little more uneven does not
  // reallocate again)
  static std::int64_t room(std::int64_t M) { return std::max<std::int64_t>(1, M + M / 4); }
  void ensure_scratch(MoeScratch& s, std::int64_t M) const {
    const std::int64_t n = room(M), bF = blocks_ * Fe_;
    grow(s.xrecv, s_.dt, "moe::xrecv", n * C_);
    grow(s.xfer, "moe::xfer", n * std::max(C_, bF));
    grow(s.dye, "moe::dye", n * C_);
    grow(s.dxe, "moe::dxe", n * C_);
    grow(s.da, "moe::da", n * Fe_);
    grow(s.dh, "moe::dh", n * bF);
    grow(s.regroup, "moe::regroup", n);
    grow(s.inverse, "moe::inverse", n);
    if (s_.dt != DType::F32) {
      grow(s.y32, "moe::y32", n * bF);
      grow(s.dy16, "moe::dy16", n * std::max(C_, bF));
    }
  }
  void upload_exchange(const MoeExchange& x, const IntView& regroup, const IntView& inverse) const {
    const std::int64_t M = x.rows();
    HostIntView rg("moe::regroup_host", static_cast<size_t>(M)), inv("moe::inverse_host", static_cast<size_t>(M));
    for (std::int64_t m = 0; m < M; ++m) {
      rg(m) = x.regroup[static_cast<size_t>(m)];
      inv(m) = x.inverse[static_cast<size_t>(m)];
    }
    Kokkos::deep_copy(slice(regroup, 0, M), rg);
    Kokkos::deep_copy(slice(inverse, 0, M), inv);
  }
  void ensure_etp_scratch(MoeScratch& s, std::int64_t Mg) const {
    const std::int64_t n = room(Mg);
    grow(s.xgrecv, s_.dt, "moe::xgrecv", n * C_);
    grow(s.yg, "moe::yg", n * C_);
    grow(s.xfer_g, "moe::xfer_g", n * C_);
    grow(s.dyg, "moe::dyg", n * C_);
    grow(s.dxg, "moe::dxg", n * C_);
    grow(s.regroup_g, "moe::regroup_g", n);
    grow(s.inverse_g, "moe::inverse_g", n);
  }

  // etp > 1, forward: this rank's expert-side rows k.xe (M, by local expert then source) to every
  // rank of its expert-tensor-parallel group, and theirs here: the per-expert counts first (an
  // all-gather), then the rows (all-gather-v), regrouped by (local expert, etp rank) into k.xg.
  void gather_etp(MoeKept& k, MoeScratch& s) const {
    const Communicator& g = *s_.tp.etp;
    std::vector<std::int32_t> mine(static_cast<size_t>(El_)), all(static_cast<size_t>(El_ * etp_));
    for (std::int64_t j = 0; j < El_; ++j)
      mine[static_cast<size_t>(j)] = static_cast<std::int32_t>(k.ex.counts[static_cast<size_t>(j)]);
    g.allgather(mine.data(), all.data(), El_);
    const std::vector<std::int64_t> rows(all.begin(), all.end());  // (etp El): rank r's rows of expert j
    k.exg = moe_exchange(rows, rows, etp_);
    const std::int64_t Mg = k.exg.rows(), n = room(Mg), bF = blocks_ * Fe_;
    ensure_scratch(s, Mg);
    ensure_etp_scratch(s, Mg);
    grow(k.xg, s_.dt, "moe::xg", n * C_);
    grow(k.h, s_.dt, "moe::h", n * bF);
    grow(k.a, s_.dt, "moe::a", n * Fe_);
    upload_exchange(k.exg, s.regroup_g, s.inverse_g);
    TRIDENT_DEVICE_WAIT();
    g.allgatherv(k.xe.data(), const_cast<void*>(s.xgrecv.data()), k.exg.recv_rows, C_ * dtype_bytes(s_.dt));
    moe_gather(k.xg, s.xgrecv, s.regroup_g, Mg, C_);
    TRIDENT_DEVICE_WAIT();
  }

  // etp > 1: fp32 partial rows `from` (Mg, by local expert then etp rank) summed over the etp
  // group, each rank receiving its own M rows into `to` (by local expert then source)
  void scatter_etp(const FloatView& to, const FloatView& from, MoeKept& k, MoeScratch& s) const {
    const std::int64_t Mg = k.exg.rows();
    upload_exchange(k.exg, s.regroup_g, s.inverse_g);
    moe_gather(act(s.xfer_g), act(from), s.inverse_g, Mg, C_);
    TRIDENT_DEVICE_WAIT();
    std::vector<std::int64_t> counts(k.exg.recv_rows);
    for (auto& c : counts) c *= C_;
    s_.tp.etp->reduce_scatter_v(s.xfer_g.data(), to.data(), counts);
  }

  // ep > 1, forward: the permuted rows s.xp (grouped by expert) to the ranks holding their
  // experts: the per-expert counts first (an all-to-all), then the rows (all-to-all-v), regrouped
  // by local expert into k.xe.
  void dispatch(MoeKept& k, MoeScratch& s) const {
    const Communicator& ep = *s_.tp.ep;
    std::vector<std::int64_t> received(static_cast<size_t>(E_), 0);
    ep.alltoall(k.plan.counts.data(), received.data(), El_);
    k.ex = moe_exchange(k.plan.counts, received, ep_);
    const std::int64_t M = k.ex.rows();
    ensure_scratch(s, M);
    const std::int64_t n = room(M), bF = blocks_ * Fe_;
    grow(k.xe, s_.dt, "moe::xe", n * C_);
    grow(k.ye, "moe::ye", n * C_);
    grow(k.h, s_.dt, "moe::h", n * bF);
    grow(k.a, s_.dt, "moe::a", n * Fe_);
    upload_exchange(k.ex, s.regroup, s.inverse);
    TRIDENT_DEVICE_WAIT();
    ep.alltoallv(s.xp.data(), k.ex.send_rows, const_cast<void*>(s.xrecv.data()), k.ex.recv_rows,
                 C_ * dtype_bytes(s_.dt));
    moe_gather(k.xe, s.xrecv, s.regroup, M, C_);
    TRIDENT_DEVICE_WAIT();
  }

  // ep > 1: fp32 expert-side rows `from` (local expert order) back to the ranks of their tokens,
  // into `to` (this rank's permuted rows, grouped by expert)
  void exchange_back(const FloatView& to, const FloatView& from, const MoeExchange& x, MoeScratch& s) const {
    upload_exchange(x, s.regroup, s.inverse);  // (the scratch may have grown since the dispatch)
    moe_gather(act(s.xfer), act(from), s.inverse, x.rows(), C_);
    TRIDENT_DEVICE_WAIT();
    s_.tp.ep->alltoallv(s.xfer.data(), x.recv_rows, to.data(), x.send_rows, C_ * 4);
  }

  template <class Make>
  void grouped(Trans ta, Trans tb, float alpha, float beta, const MoePlan& p, const Make& make) const {
    std::vector<GemmGroup> g;
    for (std::int64_t e = 0; e < El_; ++e) {
      const std::int64_t rows = p.counts[static_cast<size_t>(e)];
      if (rows == 0 && beta == 0.f) continue;  // nothing to write
      g.push_back(make(e, p.offsets[static_cast<size_t>(e)], rows));
    }
    gemm_mixed_grouped(ta, tb, alpha, beta, g);
  }

  // The backward GEMMs of one linear of every expert over its rows (as the dense linears'):
  // dx (N, n_in) = dy (N, n_out) W_e and dW_e (n_out, n_in) += dy^T x, W_e the expert's weight
  // `weight`; 16-bit runs round dy into dy16 first.
  void experts_backward(const MoePlan& p, const FloatView& dy, const HalfView& dy16, const GemmOperand& x,
                        const FloatView& dx, std::int64_t n_out, std::int64_t n_in, ParamId Expert::*weight) const {
    const bool half = s_.dt != DType::F32;
    const GemmOperand g = half ? operand(s_.dt, dy16.data()) : operand(dy.data());
    if (half) pack_half(s_.dt, dy16, dy, p.rows() * n_out);
    TRIDENT_DEVICE_WAIT();
    grouped(Trans::N, Trans::N, 1.f, 0.f, p, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      const Act w = store_->param(experts_[static_cast<size_t>(e)].*weight);
      return GemmGroup{rows, n_in, n_out, g.at(n0 * n_out), n_out, operand(w), n_in, dx.data() + n0 * n_in, n_in};
    });
    if (frozen()) return;  // LoRA: no weight gradients of the frozen experts
    grouped(Trans::T, Trans::N, 1.f, 1.f, p, [&](std::int64_t e, std::int64_t n0, std::int64_t rows) {
      return GemmGroup{n_out, n_in,
                       rows,  g.at(n0 * n_out),
                       n_out, x.at(n0 * n_in),
                       n_in,  store_->grad(experts_[static_cast<size_t>(e)].*weight).data(),
                       n_in};
    });
  }

  // LoRA (adapters declared): the routed experts and the router are part of the frozen base, their
  // weight gradients never computed (the shared expert's projections take adapters as the dense MLP's)
  bool frozen() const { return store_->has_adapters(); }

  template <class F>
  void for_experts(const MoePlan& p, const F& f) const {
    for (std::int64_t e = 0; e < El_; ++e)
      if (p.counts[static_cast<size_t>(e)] > 0)
        f(e, p.offsets[static_cast<size_t>(e)], p.counts[static_cast<size_t>(e)]);
  }

  // logits (R, E) = x W_r^T with fp32 operands (16-bit runs: both widened, exactly)
  void router_logits(const FloatView& logits, const Act& in, MoeScratch& s) const {
    const Act wr = store_->param(router_);
    const float* x = in.is_half() ? s.x32.data() : in.f.data();
    const float* w = wr.is_half() ? s.wr32.data() : wr.f.data();
    if (in.is_half()) {
      unpack_half(in.dt, s.x32, in.h, R_ * C_);
      unpack_half(wr.dt, s.wr32, wr.h, E_ * C_);
      TRIDENT_DEVICE_WAIT();
    }
    gemm(Trans::N, Trans::T, R_, E_, C_, 1.f, x, C_, w, C_, 0.f, logits.data(), E_);
    TRIDENT_DEVICE_WAIT();
  }

  // The dispatch plan from the routing (host), the aux loss's counts over the TP group.
  void plan(MoeKept& k, MoeScratch& s) const {
    const std::int64_t N = R_ * k_;
    auto idx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), k.idx);
    auto probs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), k.probs);
    auto paux = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.aux_grad);
    auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), k.lse);
    const MoeArch& m = s_.moe;
    const std::int64_t capacity = m.expert_capacity_factor > 0
                                      ? std::max<std::int64_t>(1, moe_capacity(R_, k_, E_, m.expert_capacity_factor))
                                      : 0;
    k.plan = moe_plan(idx.data(), probs.data(), R_, k_, E_, capacity, m.token_drop_policy == "probs");
    k.paux.assign(paux.data(), paux.data() + E_);
    k.routed = k.plan.routed;
    if (bias_ >= 0) {  // the load-balancing counts: the top-k without the bias (of the logits: the
                       // same order as the normalised sigmoid scores; ties to the lower expert)
      auto logits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), k.logits);
      std::fill(k.routed.begin(), k.routed.end(), 0);
      std::vector<std::int64_t> order(static_cast<size_t>(E_));
      for (std::int64_t t = 0; t < R_; ++t) {
        const float* l = logits.data() + t * E_;
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return l[a] > l[b]; });
        for (std::int64_t j = 0; j < k_; ++j) ++k.routed[static_cast<size_t>(order[static_cast<size_t>(j)])];
      }
    }
    if (s_.tp.size() > 1) s_.tp.comm->allreduce_sum(k.routed.data(), E_);
    double lse2 = 0;
    for (std::int64_t t = 0; t < R_; ++t) lse2 += static_cast<double>(lse(t)) * static_cast<double>(lse(t));
    k.z = lse2 / static_cast<double>(R_);
    const double T = aux_tokens();
    double aux = 0;
    for (std::int64_t e = 0; e < E_; ++e)
      aux += k.paux[static_cast<size_t>(e)] * static_cast<double>(k.routed[static_cast<size_t>(e)]);
    k.aux = aux * static_cast<double>(E_) / (static_cast<double>(k_) * T * T);  // this rank's part (sum over TP)
    s_.moe_state->last_forward[layer_] = {k.aux, k.z};
    // the permutation to the device
    HostIntView rt("moe::row_token_host", static_cast<size_t>(N)), sr("moe::slot_row_host", static_cast<size_t>(N));
    for (std::int64_t n = 0; n < N; ++n) {
      rt(n) = n < k.plan.rows() ? k.plan.row_token[static_cast<size_t>(n)] : 0;
      sr(n) = k.plan.slot_row[static_cast<size_t>(n)];
    }
    Kokkos::deep_copy(k.row_token, rt);
    Kokkos::deep_copy(k.slot_row, sr);
    TRIDENT_DEVICE_WAIT();
  }

  // the expert bias (empty without one), registered in the chunk's MoeState for the trainer's update
  FloatView expert_bias() const {
    if (bias_ < 0) return FloatView();
    const FloatView b = store_->state(bias_);
    s_.moe_state->expert_bias[layer_] = b;
    return b;
  }

  // T: the tokens the load-balancing counts span (this rank's, over the TP group)
  double aux_tokens() const { return static_cast<double>(R_) * static_cast<double>(s_.tp.size()); }

  // d in (into s.dtmp) from the router: d logits W_r, and dW_r += d logits^T x
  void router_backward(MoeKept& k, MoeScratch& s, const Act& in) const {
    const MoeArch& m = s_.moe;
    const float g = s_.moe_state->aux_grad_scale;
    const double T = aux_tokens();
    // aux = E / (k T^2) sum_e P_e count_e, P_e the sum of p_te over the tokens: d/d p_te = E count_e / (k T^2)
    auto aux = Kokkos::create_mirror_view(s.aux_grad);
    for (std::int64_t e = 0; e < E_; ++e)
      aux(e) = static_cast<float>(static_cast<double>(g) * m.aux_loss_coeff * static_cast<double>(E_) *
                                  static_cast<double>(k.routed[static_cast<size_t>(e)]) /
                                  (static_cast<double>(k_) * T * T));
    Kokkos::deep_copy(s.aux_grad, aux);
    // z = coeff / tp x mean over this rank's tokens of lse^2 (Megatron's z-loss under TP x CP)
    const float zg = static_cast<float>(static_cast<double>(g) * m.z_loss_coeff /
                                        (static_cast<double>(s_.tp.size()) * static_cast<double>(R_)));
    moe_route_backward(s.dlogits, s.dprobs, k.logits, k.lse, k.ssum, k.idx, k.probs, s.aux_grad, zg, R_, route_);
    const Act wr = store_->param(router_);
    if (in.is_half()) {  // the fp32 operands again
      unpack_half(in.dt, s.x32, in.h, R_ * C_);
      unpack_half(wr.dt, s.wr32, wr.h, E_ * C_);
      TRIDENT_DEVICE_WAIT();
    }
    const float* x = in.is_half() ? s.x32.data() : in.f.data();
    const float* w = wr.is_half() ? s.wr32.data() : wr.f.data();
    gemm(Trans::N, Trans::N, R_, C_, E_, 1.f, s.dlogits.data(), E_, w, C_, 0.f, s.dtmp.data(), C_);
    if (!frozen())  // (LoRA: the router is part of the frozen base)
      gemm(Trans::T, Trans::N, E_, C_, R_, 1.f, s.dlogits.data(), E_, x, C_, 1.f, store_->grad(router_).data(), C_);
    TRIDENT_DEVICE_WAIT();
  }

  // this micro-batch's losses and loads into the chunk's MoeState (once per micro-batch: here, in
  // the backward pass)
  void record(const MoeKept& k) const {
    MoeLayerStats& st = s_.moe_state->layers[layer_];
    st.aux += k.aux;  // this rank's part (summed over TP)
    st.z += k.z;      // this rank's mean
    st.micro += 1;
    if (st.selected.empty()) st.selected.assign(static_cast<size_t>(E_), 0.0);
    for (std::int64_t e = 0; e < E_; ++e)
      st.selected[static_cast<size_t>(e)] += static_cast<double>(k.plan.routed[static_cast<size_t>(e)]);
    st.dropped += static_cast<double>(k.plan.dropped());
  }

  // generation's workspaces, grown to the largest R asked for
  struct InferWork {
    std::int64_t R = 0;
    FloatView logits, probs, lse, ssum, paux, xp, h, a, yp, shared_out;
    IntView idx, row_token, slot_row;
  };
  InferWork& infer_work(std::int64_t R) const {
    if (work_.R >= R) return work_;
    const std::int64_t N = R * k_;
    work_.R = R;
    work_.logits = make_float("moe::infer_logits", R * E_);
    work_.probs = make_float("moe::infer_probs", N);
    work_.lse = make_float("moe::infer_lse", R);
    work_.ssum = make_float("moe::infer_ssum", R);
    work_.paux = make_float("moe::infer_paux", E_);
    work_.xp = make_float("moe::infer_xp", N * C_);
    work_.h = make_float("moe::infer_h", N * blocks_ * Fe_);
    work_.a = make_float("moe::infer_a", N * Fe_);
    work_.yp = make_float("moe::infer_yp", N * C_);
    work_.shared_out = make_float("moe::infer_shared", R * C_);
    work_.idx = make_int("moe::infer_idx", N);
    work_.row_token = make_int("moe::infer_row_token", N);
    work_.slot_row = make_int("moe::infer_slot_row", N);
    return work_;
  }
  mutable InferWork work_;

  TransformerShape s_;
  std::string prefix_;
  std::int64_t layer_;
  ParamStore* store_;
  std::shared_ptr<const MlpActivation> act_;
  std::int64_t E_ = 0, k_ = 0, Fe_ = 0, C_ = 0, blocks_ = 1, R_ = 0;
  std::int64_t ep_ = 1, El_ = 0, e0_ = 0;         // expert parallelism: this rank's experts e0 .. e0 + El - 1
  std::int64_t etp_ = 1, etp_rank_ = 0, Fg_ = 0;  // expert tensor parallelism: Fe_ = Fg_ / etp_ local
  bool exchange_ = false;                         // ep > 1 or etp > 1: the rows leave the rank
  mutable MoePlan local_;                         // the expert side's rows as a plan (ep > 1)
  RouterSpec route_;
  ParamId router_ = -1, bias_ = -1;
  std::vector<Expert> experts_;
  std::unique_ptr<MlpModule> shared_;
  Act zeros_, zero_fc1_;  // the absent biases: fc2's for the fused consumer, fc1's for the activation
};

}  // namespace

std::unique_ptr<MlpModule> make_moe_mlp(ParamStore& store, const std::string& prefix, const TransformerShape& s,
                                        std::int64_t layer) {
  return std::make_unique<MoeMlp>(store, prefix, s, layer);
}

}  // namespace trident
