// heads_gather / heads_scatter (heads.hpp): one thread per element over the rank's host threads.
#include "ops/heads.hpp"

#include <string>

#include "common/error.hpp"
#include "common/host_parallel.hpp"

namespace trident {
namespace detail {

template <class F, class V>
void heads_gather_impl(const FloatView& dst, const V& src, std::int64_t rows, std::int64_t width, std::int64_t c0,
                       std::int64_t n) {
  for_each_index(
      "ops::heads_gather", rows * n,
      KOKKOS_LAMBDA(std::int64_t i) { dst(i) = F::load(src((i / n) * width + c0 + i % n)); });
}

template <class V>
void heads_scatter_impl(const V& dst, const V& src, std::int64_t rows, std::int64_t width, std::int64_t c0,
                        std::int64_t n) {
  for_each_index(
      "ops::heads_scatter", rows * n, KOKKOS_LAMBDA(std::int64_t i) { dst((i / n) * width + c0 + i % n) = src(i); });
}

}  // namespace detail

void heads_gather(const FloatView& dst, const Act& src, std::int64_t rows, std::int64_t width, std::int64_t c0,
                  std::int64_t n) {
  switch (src.dt) {
    case DType::F32: detail::heads_gather_impl<F32Fmt>(dst, src.f, rows, width, c0, n); break;
    case DType::BF16: detail::heads_gather_impl<Bf16Fmt>(dst, src.h, rows, width, c0, n); break;
    case DType::F16: detail::heads_gather_impl<Fp16Fmt>(dst, src.h, rows, width, c0, n); break;
  }
}

void heads_scatter(const Act& dst, const Act& src, std::int64_t rows, std::int64_t width, std::int64_t c0,
                   std::int64_t n) {
  if (dst.dt != src.dt)
    throw Error::one(std::string("internal: heads_scatter from ") + dtype_name(src.dt) + " into " + dtype_name(dst.dt));
  if (dst.dt == DType::F32)
    detail::heads_scatter_impl(dst.f, src.f, rows, width, c0, n);
  else
    detail::heads_scatter_impl(dst.h, src.h, rows, width, c0, n);
}

}  // namespace trident
