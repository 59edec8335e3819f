// Dropout kernels (dropout.hpp; the key convention is docs/DESIGN.md "Tensor and sequence
// parallelism"): forward and backward are one kernel that keeps element i when
// dropout_uniform(key, i) >= p and scales it by 1/(1 - p), so backward regenerates the forward
// mask; an inactive spec copies (nothing when in place). Also the process-wide recorder of
// debug.dump_dropout, and dropout_key: splitmix64 mixing of stream, step and layer * 16 + site.
#include "ops/dropout.hpp"

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"
#include "common/rng.hpp"

namespace trident {

namespace {
void apply(const char* label, const FloatView& out, const FloatView& in, std::int64_t n, const DropoutSpec& d,
           std::int64_t cols) {
  if (!d.active()) {
    if (out.data() != in.data()) device_copy(slice(out, 0, n), slice(in, 0, n));
    return;
  }
  const float p = d.p, scale = 1.f / (1.f - d.p);
  const std::uint64_t key = d.key;
  if (d.mapped()) {  // context parallelism: the counters of the elements' places in whole sequences
    TRIDENT_REQUIRE(cols > 0, "internal: a context-parallel dropout call without its row length");
    const DropoutSpec m = d;
    for_each_index(
        label, n,
        KOKKOS_LAMBDA(std::int64_t i) { out(i) = dropout_uniform(key, m.counter(i, cols)) >= p ? in(i)*scale : 0.f; });
    return;
  }
  for_each_index(
      label, n, KOKKOS_LAMBDA(std::int64_t i) {
        out(i) = dropout_uniform(key, static_cast<std::uint64_t>(i)) >= p ? in(i)*scale : 0.f;
      });
}
}  // namespace

void dropout_forward(const FloatView& out, const FloatView& in, std::int64_t n, const DropoutSpec& d,
                     std::int64_t cols) {
  apply("ops::dropout_forward", out, in, n, d, cols);
}

void dropout_backward(const FloatView& din, const FloatView& dout, std::int64_t n, const DropoutSpec& d,
                      std::int64_t cols) {
  apply("ops::dropout_backward", din, dout, n, d, cols);
}

namespace {
DropoutRecorder& recorder() {
  static DropoutRecorder r;
  return r;
}
}  // namespace

void set_dropout_recorder(DropoutRecorder r) { recorder() = std::move(r); }

void record_dropout(const char* site, std::int64_t layer, const DropoutSpec& d,
                    const std::vector<std::int64_t>& shape) {
  if (d.active() && recorder()) recorder()(site, layer, d, shape);
}

std::uint64_t dropout_key(std::uint64_t stream, std::uint64_t step, std::uint64_t layer, std::uint64_t site) {
  std::uint64_t k = splitmix64(stream);
  k = splitmix64(k ^ step);
  k = splitmix64(k ^ (layer * 16 + site));
  return k;
}

}  // namespace trident
