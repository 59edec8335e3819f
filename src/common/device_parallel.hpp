// Kernel layouts for device back-ends (CUDA), where the host layouts of common/host_parallel.hpp
// would starve the GPU (docs/DESIGN.md "Kernels on a GPU").
//
// The host kernels are laid out for a few threads with long, cache-friendly loops: a column
// reduction (a bias or norm-weight gradient) gives one thread a block of 64 columns walking every
// row, so at 768 columns a GPU runs it on 12 threads (35 ms for 8192 x 768 on an H200, against
// microseconds of memory traffic). Those kernels keep their host layout, which fixes their host
// bits (validation/identity.py), and take the layout below when kDeviceKernels holds, that is in a
// build whose execution space does not run in host memory.
//
//   column_sums<K>(name, rows, cols, term, out)
//       out.p[k][c] += sum over n < rows of the k-th value term(n, c, acc) adds into acc[k], for
//       K outputs at once (a norm's weight and bias gradients). Two kernels: parts of
//       rows_per_part(rows) consecutive rows, one thread per (part, column), adjacent threads on
//       adjacent columns (coalesced); then one thread per column adds the part sums in part order.
//       The order of every addition depends only on rows and cols, so the result is the same on
//       every run and every device (not the host layout's bits: another order of additions).
//
//   for_each_row(name, rows, cols, f)
//       f(team, row) for every row, a team of row_team_size(cols) threads per row (a fixed function
//       of cols, so that the team reductions below add in the same order on every device). Inside,
//       team_sum / team_max reduce over [0, n) and give every thread of the team the result, and
//       Kokkos::TeamThreadRange shares a row's element-wise work.
//
//   rows_with_column_sums<K>(name, rows, cols, row, term, out)
//       for_each_row's row(team, n) for every row and column_sums' sums of term, in one kernel plus
//       the column reduction (a norm's backward pass: its input gradient and its weights'
//       gradients reading the rows once): a team per part of kRowsPerPart consecutive rows runs
//       row(team, n) on each of its rows in order and, after each, its threads add term(n, c, acc)
//       into the part's sums of their columns; then one thread per column adds the parts in part
//       order. The order of every addition depends only on rows and cols. term must not read
//       what row writes.
//
//   for_each_vector<W>(name, n, aligned, vec, one)
//       16-byte accesses for element-wise kernels: one thread per group of W consecutive elements
//       of [0, n). Where `aligned` (every buffer the kernel reads or writes by packs is 16-byte
//       aligned: aligned16), vec(i0) does a whole group [i0, i0 + W) with load_pack / store_pack
//       (Pack<T, N>: 16 bytes, e.g. 4 floats or 8 16-bit words); the last, partial group, and
//       every group where not aligned, goes element by element through one(i). vec must compute
//       what one computes, element for element, so the bits do not depend on the alignment.
//
// The partial sums live in device_scratch(), one buffer per process that grows to the largest
// request and is freed when Kokkos finalizes. Every kernel runs in order on the default execution
// space instance, so the next request may reuse the buffer; call it only from the thread that
// launches the model's kernels.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/types.hpp"

namespace trident {

// Whether kernels take their device layouts: on a device (the execution space's memory is not host
// memory), and in a host build configured with TRIDENT_DEVICE_KERNELS_ON_HOST, where the host
// back-end runs the device branches so that a machine without a GPU checks them (kDeviceOnHost).
#if defined(TRIDENT_DEVICE_KERNELS_ON_HOST)
inline constexpr bool kDeviceOnHost = true;
#else
inline constexpr bool kDeviceOnHost = false;
#endif
inline constexpr bool kDeviceKernels = kDeviceOnHost || !std::is_same_v<MemSpace, Kokkos::HostSpace>;

// A device buffer of at least n floats, valid until the next call (see above).
FloatView device_scratch(std::int64_t n);

// The outputs of column_sums: K arrays of cols floats, added into.
template <int K>
struct ColumnOut {
  float* p[K];
};

// Rows per part of column_sums: at least 32, and at most 256 parts.
KOKKOS_INLINE_FUNCTION std::int64_t rows_per_part(std::int64_t rows) {
  const std::int64_t even = (rows + 255) / 256;
  return even > 32 ? even : 32;
}

// The second kernel of column_sums and rows_with_column_sums: out.p[k][c] += the parts' sums of
// column c, added in part order (part: K x parts x cols).
template <int K>
void add_column_parts(const char* name, std::int64_t parts, std::int64_t cols, const float* part, ColumnOut<K> out) {
  Kokkos::parallel_for(
      std::string(name) + "_parts", range(cols), KOKKOS_LAMBDA(std::int64_t c) {
        for (int k = 0; k < K; ++k) {
          float s = 0.f;
          for (std::int64_t p = 0; p < parts; ++p) s += part[(k * parts + p) * cols + c];
          out.p[k][c] += s;
        }
      });
}

template <int K, class Term>
void column_sums(const char* name, std::int64_t rows, std::int64_t cols, const Term& term, ColumnOut<K> out) {
  if (rows <= 0 || cols <= 0) return;
  const std::int64_t per = rows_per_part(rows), parts = (rows + per - 1) / per;
  float* part = device_scratch(K * parts * cols).data();
  Kokkos::parallel_for(
      std::string(name), range(parts * cols), KOKKOS_LAMBDA(std::int64_t t) {
        const std::int64_t p = t / cols, c = t % cols;
        const std::int64_t n1 = (p + 1) * per < rows ? (p + 1) * per : rows;
        float acc[K];
        for (int k = 0; k < K; ++k) acc[k] = 0.f;
        for (std::int64_t n = p * per; n < n1; ++n) term(n, c, acc);
        for (int k = 0; k < K; ++k) part[(k * parts + p) * cols + c] = acc[k];
      });
  add_column_parts<K>(name, parts, cols, part, out);
}

// 16 bytes of T: the unit of a vectorised load or store
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <int N, class T>
KOKKOS_INLINE_FUNCTION Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <int N, class T>
KOKKOS_INLINE_FUNCTION void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <int W, class Vec, class One>
void for_each_vector(const char* name, std::int64_t n, bool aligned, const Vec& vec, const One& one) {
  if (n <= 0) return;
  const std::int64_t whole = aligned ? n / W : 0;
  Kokkos::parallel_for(
      name, range((n + W - 1) / W), KOKKOS_LAMBDA(std::int64_t g) {
        const std::int64_t i0 = g * W;
        if (g < whole) {
          vec(i0);
        } else {
          const std::int64_t i1 = i0 + W < n ? i0 + W : n;
          for (std::int64_t i = i0; i < i1; ++i) one(i);
        }
      });
}

using RowTeam = Kokkos::TeamPolicy<ExecSpace>::member_type;

// Threads per row of for_each_row (1 under a host execution space, whose teams are one thread:
// with kDeviceOnHost the device's kernels run with teams of one, which add a row in another order
// than a GPU's team reductions).
inline int row_team_size(std::int64_t cols) {
  if constexpr (!kDeviceKernels || kDeviceOnHost) return 1;
  return cols >= 4096 ? 256 : (cols >= 512 ? 128 : 32);
}

template <class F>
void for_each_row(const char* name, std::int64_t rows, std::int64_t cols, const F& f) {
  if (rows <= 0) return;
  Kokkos::parallel_for(
      name, Kokkos::TeamPolicy<ExecSpace>(static_cast<int>(rows), row_team_size(cols)),
      KOKKOS_LAMBDA(const RowTeam& t) { f(t, static_cast<std::int64_t>(t.league_rank())); });
}

// Rows per team of rows_with_column_sums: enough teams to fill a GPU at the shapes that matter
// (16384 rows: 1024 teams), few enough parts for the column reduction.
inline constexpr std::int64_t kRowsPerPart = 16;

template <int K, class Row, class Term>
void rows_with_column_sums(const char* name, std::int64_t rows, std::int64_t cols, const Row& row, const Term& term,
                           ColumnOut<K> out) {
  if (rows <= 0 || cols <= 0) return;
  const std::int64_t parts = (rows + kRowsPerPart - 1) / kRowsPerPart;
  float* part = device_scratch(K * parts * cols).data();
  Kokkos::parallel_for(
      name, Kokkos::TeamPolicy<ExecSpace>(static_cast<int>(parts), row_team_size(cols)),
      KOKKOS_LAMBDA(const RowTeam& t) {
        const std::int64_t p = t.league_rank(), n0 = p * kRowsPerPart;
        const std::int64_t n1 = n0 + kRowsPerPart < rows ? n0 + kRowsPerPart : rows;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols), [&](std::int64_t c) {
          for (int k = 0; k < K; ++k) part[(k * parts + p) * cols + c] = 0.f;
        });
        for (std::int64_t n = n0; n < n1; ++n) {
          t.team_barrier();
          row(t, n);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols), [&](std::int64_t c) {
            float acc[K];
            for (int k = 0; k < K; ++k) acc[k] = part[(k * parts + p) * cols + c];
            term(n, c, acc);
            for (int k = 0; k < K; ++k) part[(k * parts + p) * cols + c] = acc[k];
          });
        }
      });
  add_column_parts<K>(name, parts, cols, part, out);
}

// sum over j < n of g(j), on every thread of the team
template <class G>
KOKKOS_INLINE_FUNCTION float team_sum(const RowTeam& t, std::int64_t n, const G& g) {
  float s = 0.f;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(t, n), [&](std::int64_t j, float& a) { a += g(j); }, s);
  return s;
}
// max over j < n of g(j) (-3e38 for n = 0), on every thread of the team
template <class G>
KOKKOS_INLINE_FUNCTION float team_max(const RowTeam& t, std::int64_t n, const G& g) {
  float m = -3.0e38f;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(t, n),
      [&](std::int64_t j, float& a) {
        const float v = g(j);
        a = v > a ? v : a;
      },
      Kokkos::Max<float>(m));
  return m > -3.0e38f ? m : -3.0e38f;
}

}  // namespace trident
