// ParamStore (param_store.hpp): declare() checks each parameter's shapes and records the open
// LayerScope's layer; allocate() lays out the flat buffer in the four groups of docs/DESIGN.md
// "Tensor and sequence parallelism" ([decay, TP-sharded] [decay, replicated] [no decay,
// replicated] [no decay, TP-sharded]), padded to a multiple of `multiple` (the trainer passes
// dp x 4096), with one fp32 gradient buffer of the same layout. initialize() draws each global
// tensor from the normal stream of (seed, name) and keeps this rank's window of it, so the
// initial values do not depend on tp; 16-bit parameters are converted on the host, rounded to
// nearest even.
#include "layers/param_store.hpp"

#include <cmath>

#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"
#include "common/rng.hpp"

namespace trident {

std::int64_t ParamInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

ParamId ParamStore::declare(const std::string& name, std::vector<std::int64_t> shape, bool weight_decay, float init_std,
                            float init_value) {
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.global_shape = shape;
  p.global_offset.assign(shape.size(), 0);
  p.valid = shape;
  p.weight_decay = weight_decay;
  p.init_std = init_std;
  p.init_value = init_value;
  return declare(std::move(p));
}

ParamId ParamStore::declare(ParamInfo info) {
  TRIDENT_REQUIRE(values_.extent(0) == 0, "ParamStore: declare('" << info.name << "') after allocate()");
  TRIDENT_REQUIRE(find(info.name) < 0, "ParamStore: duplicate parameter '" << info.name << "'");
  TRIDENT_REQUIRE(!info.shape.empty() && info.shape.size() <= 2,
                  "ParamStore: '" << info.name << "' must be 1-D or 2-D");
  if (info.blocks.empty()) {
    TRIDENT_REQUIRE(info.row_blocks >= 1 && info.shape[0] % info.row_blocks == 0 &&
                        info.global_shape[0] % info.row_blocks == 0,
                    "ParamStore: '" << info.name << "' rows do not split into " << info.row_blocks << " blocks");
    const std::int64_t nb = info.row_blocks;
    for (std::int64_t b = 0; b < nb; ++b)
      info.blocks.push_back(
          {b * info.shape[0] / nb, b * info.global_shape[0] / nb + info.global_offset[0], info.valid[0]});
  }
  info.row_blocks = static_cast<std::int64_t>(info.blocks.size());
  for (const auto& k : info.blocks)
    TRIDENT_REQUIRE(k.local0 >= 0 && k.rows >= 0 && k.local0 + k.rows <= info.shape[0] && k.global0 >= 0 &&
                        k.global0 + k.rows <= info.global_shape[0],
                    "ParamStore: '" << info.name << "' has a row block outside its local or global shape");
  info.layer = layer_;
  params_.push_back(std::move(info));
  return static_cast<ParamId>(params_.size() - 1);
}

ParamId ParamStore::declare_state(ParamInfo info) {
  info.state = true;
  TRIDENT_REQUIRE(!info.adapter && !info.expert,
                  "internal: state '" << info.name << "' cannot be an adapter or expert");
  return declare(std::move(info));
}

FloatView ParamStore::state(ParamId id) const {
  const ParamInfo& p = params_.at(id);
  TRIDENT_REQUIRE(p.state, "internal: '" << p.name << "' is a parameter, not a state");
  return slice(states_, p.offset - padded_size(), p.numel());
}

void ParamStore::mark_tp_partial_grad(const std::string& prefix) {
  TRIDENT_REQUIRE(values_.extent(0) == 0 && values16_.extent(0) == 0,
                  "ParamStore: mark_tp_partial_grad('" << prefix << "') after allocate()");
  for (auto& p : params_)
    if (p.name.rfind(prefix, 0) == 0) {
      TRIDENT_REQUIRE(p.tp_replicated && !p.weight_decay,
                      "internal: " << p.name << ": only replicated parameters without decay have partial gradients");
      p.tp_partial_grad = true;
    }
}

void ParamStore::allocate(std::int64_t multiple, std::int64_t expert_multiple) {
  auto pad = [&](std::int64_t n) { return multiple > 1 ? (n + multiple - 1) / multiple * multiple : n; };
  std::int64_t off = 0;
  // LoRA adapters first (TP-sharded, then TP-replicated), their range padded like the buffer
  for (const bool replicated : {false, true}) {
    if (replicated) adapter_replicated_begin_ = off;
    for (auto& p : params_) {
      if (!p.adapter || p.state || p.tp_replicated != replicated) continue;
      p.offset = off;
      off += p.numel();
    }
  }
  adapter_total_ = off;
  adapter_padded_ = off > 0 ? pad(off) : 0;
  off = adapter_padded_;
  // (decay, replicated) of the four groups, in buffer order
  const bool groups[4][2] = {{true, false}, {true, true}, {false, true}, {false, false}};
  for (int g = 0; g < 4; ++g) {
    if (g == 1) replicated_begin_ = off;
    // the last replicated group ends with the parameters whose gradients are partial over TP
    for (const bool partial : {false, true}) {
      if (g == 2 && partial) tp_partial_begin_ = off;
      for (auto& p : params_) {
        if (p.adapter || p.expert || p.state || p.weight_decay != groups[g][0] || p.tp_replicated != groups[g][1])
          continue;
        if ((p.tp_partial_grad && p.tp_replicated) != partial) continue;
        p.offset = off;
        off += p.numel();
      }
    }
    if (g == 1) decay_total_ = off;
    if (g == 2) replicated_end_ = off;
  }
  // the experts' range: decayed weights, then biases
  const std::int64_t dense = off;
  std::int64_t experts = 0;
  for (const auto& p : params_) experts += p.expert ? p.numel() : 0;
  expert_begin_ = pad(dense);  // the padded size without experts
  off = expert_begin_;
  for (const bool decay : {true, false}) {
    for (auto& p : params_) {
      if (!p.expert || p.weight_decay != decay) continue;
      TRIDENT_REQUIRE(!p.adapter, "internal: " << p.name << ": an adapter of an expert");
      p.offset = off;
      off += p.numel();
    }
    if (decay) expert_decay_end_ = off;
  }
  total_ = dense + experts;  // the parameters (without the padding between the two ranges)
  const std::int64_t padded = experts > 0 ? expert_begin_ + (expert_multiple > 1 ? (experts + expert_multiple - 1) /
                                                                                       expert_multiple * expert_multiple
                                                                                 : experts)
                                          : pad(total_);
  if (dtype_ == DType::F32)
    values_ = make_float("params::values", padded);
  else
    values16_ = make_half("params::values16", padded);
  grads_ = make_float("params::grads", padded);
  std::int64_t states = 0;  // after the padded flat buffer, in the host copies
  for (auto& p : params_)
    if (p.state) {
      p.offset = padded + states;
      states += p.numel();
    }
  if (states > 0) states_ = make_float("params::states", states);
}

void ParamStore::set_dtype(DType dt) {
  TRIDENT_REQUIRE(!allocated() || total_ == 0, "ParamStore: set_dtype after allocate()");
  dtype_ = dt;
}

FloatView ParamStore::value(ParamId id) const {
  TRIDENT_REQUIRE(dtype_ == DType::F32, "internal: fp32 value of a " << dtype_name(dtype_) << " parameter");
  return slice(values_, params_.at(id).offset, params_.at(id).numel());
}
HalfView ParamStore::value16(ParamId id) const {
  TRIDENT_REQUIRE(dtype_ != DType::F32, "internal: 16-bit value of an fp32 parameter");
  return slice(values16_, params_.at(id).offset, params_.at(id).numel());
}
Act ParamStore::param(ParamId id) const {
  Act a;
  a.dt = dtype_;
  if (dtype_ == DType::F32)
    a.f = value(id);
  else
    a.h = value16(id);
  return a;
}

HostFloatView ParamStore::model_to_host() const {
  const std::int64_t N = padded_size();
  HostFloatView host(std::string("params::host"), static_cast<size_t>(host_size()));  // (host_size)
  if (dtype_ == DType::F32) {
    Kokkos::deep_copy(Kokkos::subview(host, Kokkos::make_pair<std::int64_t>(0, N)), values_);
  } else {
    auto h16 = Kokkos::create_mirror_view_and_copy(HostSpace(), values16_);
    for (size_t i = 0; i < h16.extent(0); ++i)
      host(i) = dtype_ == DType::BF16 ? bf16_to_float(h16(i)) : fp16_to_float(h16(i));
  }
  if (has_states()) Kokkos::deep_copy(Kokkos::subview(host, Kokkos::make_pair(N, host_size())), states_);
  return host;
}

void ParamStore::model_from_host(const HostFloatView& host) {
  const std::int64_t N = padded_size();
  TRIDENT_REQUIRE(static_cast<std::int64_t>(host.extent(0)) >= host_size(),
                  "internal: model_from_host of " << host.extent(0) << " values, " << host_size() << " needed");
  if (has_states()) Kokkos::deep_copy(states_, Kokkos::subview(host, Kokkos::make_pair(N, host_size())));
  if (dtype_ == DType::F32) {
    Kokkos::deep_copy(values_, Kokkos::subview(host, Kokkos::make_pair<std::int64_t>(0, N)));
    return;
  }
  auto h16 = Kokkos::create_mirror_view(values16_);  // (padded_size) 16-bit words
  for (size_t i = 0; i < h16.extent(0); ++i)
    h16(i) = dtype_ == DType::BF16 ? float_to_bf16(host(i)) : float_to_fp16(host(i));
  Kokkos::deep_copy(values16_, h16);
}
FloatView ParamStore::grad(ParamId id) const { return slice(grads_, params_.at(id).offset, params_.at(id).numel()); }

std::int64_t ParamStore::global_count() const {
  std::int64_t n = 0;
  for (auto& p : params_) {
    if (p.state) continue;
    std::int64_t g = p.expert ? ep_ : 1;
    for (auto d : p.global_shape) g *= d;
    n += g;
  }
  return n;
}

std::int64_t ParamStore::global_adapter_count() const {
  std::int64_t n = 0;
  for (auto& p : params_) {
    if (!p.adapter) continue;
    std::int64_t g = 1;
    for (auto d : p.global_shape) g *= d;
    n += g;
  }
  return n;
}

ParamId ParamStore::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return static_cast<ParamId>(i);
  return -1;
}

void ParamStore::zero_grads(std::int64_t keep_begin, std::int64_t keep_end) {
  // chunks of 64 Ki values over this rank's threads (common/host_parallel.hpp), each zeroing
  // its part outside [keep_begin, keep_end)
  constexpr std::int64_t kChunk = kDeviceKernels ? 1 : 1 << 16;  // a device: one value per thread
  float* g = grads_.data();
  const std::int64_t n = padded_size();
  TRIDENT_REQUIRE(0 <= keep_begin && keep_begin <= keep_end && keep_end <= n,
                  "zero_grads: range [" << keep_begin << ", " << keep_end << ") outside the " << n << " gradients");
  if (keep_begin == 0 && keep_end == n) return;
  for_each_chunk(
      "params::zero_grads", (n + kChunk - 1) / kChunk, KOKKOS_LAMBDA(std::int64_t c) {
        const std::int64_t b = c * kChunk, e = b + kChunk < n ? b + kChunk : n;
        for (std::int64_t i = b; i < (e < keep_begin ? e : keep_begin); ++i) g[i] = 0.f;
        for (std::int64_t i = (b > keep_end ? b : keep_end); i < e; ++i) g[i] = 0.f;
      });
}

void ParamStore::initialize(std::uint64_t seed) {
  HostFloatView host(std::string("params::init"), static_cast<size_t>(host_size()));  // (host_size)
  for (auto& p : params_) {
    const std::int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
    const std::int64_t gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
    const std::int64_t c0 = p.global_shape.size() > 1 ? p.global_offset[1] : 0;
    const std::int64_t vcols = p.valid.size() > 1 ? p.valid[1] : 1;
    float* base = host.data() + p.offset;
    for (std::int64_t i = 0; i < p.numel(); ++i) base[i] = 0.f;
    for (const auto& k : p.blocks) {
      float* dst = base + k.local0 * cols;
      const std::int64_t vrows = k.rows;
      if (p.init_std == 0.f) {
        for (std::int64_t r = 0; r < vrows; ++r)
          for (std::int64_t c = 0; c < vcols; ++c) dst[r * cols + c] = p.init_value;
        continue;
      }
      // Draw the global tensor in row-major order and keep this rank's window of it.
      NormalStream rng(seed, p.name);
      rng.skip(k.global0 * gcols);
      for (std::int64_t r = 0; r < vrows; ++r) {
        rng.skip(c0);
        for (std::int64_t c = 0; c < vcols; ++c) dst[r * cols + c] = p.init_std * rng.next();
        rng.skip(gcols - c0 - vcols);
      }
    }
  }
  model_from_host(host);  // 16-bit parameters: rounded to nearest even
}

}  // namespace trident
