// ParamStore implementation.
#include "layers/param_store.hpp"

#include <cmath>

#include "common/error.hpp"
#include "common/rng.hpp"

namespace trident {

std::int64_t ParamInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

ParamId ParamStore::declare(const std::string& name, std::vector<std::int64_t> shape, bool weight_decay,
                            float init_std, float init_value) {
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
  TRIDENT_REQUIRE(!info.shape.empty() && info.shape.size() <= 2, "ParamStore: '" << info.name << "' must be 1-D or 2-D");
  TRIDENT_REQUIRE(info.row_blocks >= 1 && info.shape[0] % info.row_blocks == 0 &&
                      info.global_shape[0] % info.row_blocks == 0,
                  "ParamStore: '" << info.name << "' rows do not split into " << info.row_blocks << " blocks");
  params_.push_back(std::move(info));
  return static_cast<ParamId>(params_.size() - 1);
}

void ParamStore::allocate(std::int64_t multiple) {
  std::int64_t off = 0;
  // (decay, replicated) of the four groups, in buffer order
  const bool groups[4][2] = {{true, false}, {true, true}, {false, true}, {false, false}};
  for (int g = 0; g < 4; ++g) {
    if (g == 1) replicated_begin_ = off;
    for (auto& p : params_) {
      if (p.weight_decay != groups[g][0] || p.tp_replicated != groups[g][1]) continue;
      p.offset = off;
      off += p.numel();
    }
    if (g == 1) decay_total_ = off;
    if (g == 2) replicated_end_ = off;
  }
  total_ = off;
  const std::int64_t padded = multiple > 1 ? (total_ + multiple - 1) / multiple * multiple : total_;
  values_ = make_float("params::values", padded);
  grads_ = make_float("params::grads", padded);
}

FloatView ParamStore::value(ParamId id) const { return slice(values_, params_.at(id).offset, params_.at(id).numel()); }
FloatView ParamStore::grad(ParamId id) const { return slice(grads_, params_.at(id).offset, params_.at(id).numel()); }

std::int64_t ParamStore::global_count() const {
  std::int64_t n = 0;
  for (auto& p : params_) {
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

void ParamStore::zero_grads() { Kokkos::deep_copy(grads_, 0.f); }

void ParamStore::initialize(std::uint64_t seed) {
  auto host = Kokkos::create_mirror_view(values_);
  for (auto& p : params_) {
    const std::int64_t nb = p.row_blocks;
    const std::int64_t rows = p.shape[0] / nb, cols = p.shape.size() > 1 ? p.shape[1] : 1;  // per block
    const std::int64_t grows = p.global_shape[0] / nb, gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
    const std::int64_t r0 = p.global_offset[0], c0 = p.global_shape.size() > 1 ? p.global_offset[1] : 0;
    const std::int64_t vrows = p.valid[0], vcols = p.valid.size() > 1 ? p.valid[1] : 1;
    float* base = host.data() + p.offset;
    for (std::int64_t i = 0; i < p.numel(); ++i) base[i] = 0.f;
    for (std::int64_t b = 0; b < nb; ++b) {
      float* dst = base + b * rows * cols;
      if (p.init_std == 0.f) {
        for (std::int64_t r = 0; r < vrows; ++r)
          for (std::int64_t c = 0; c < vcols; ++c) dst[r * cols + c] = p.init_value;
        continue;
      }
      // Draw the global tensor in row-major order and keep this rank's window of it.
      NormalStream rng(seed, p.name);
      rng.skip((b * grows + r0) * gcols);
      for (std::int64_t r = 0; r < vrows; ++r) {
        rng.skip(c0);
        for (std::int64_t c = 0; c < vcols; ++c) dst[r * cols + c] = p.init_std * rng.next();
        rng.skip(gcols - c0 - vcols);
      }
    }
  }
  Kokkos::deep_copy(values_, host);
}

}  // namespace trident
