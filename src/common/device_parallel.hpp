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
//   for_each_row(name, rows, f)
//       f(t, row) for every row, a warp per row: kRowLanes lanes (Kokkos' vector lanes of one team
//       thread), kRowsPerTeam rows to a team. Inside, the row is taken in groups of kGroup
//       consecutive columns, lane l the groups l, l + 32, ...: row_sum_groups / row_max_groups
//       (row_sum_values / row_max_values over one array) reduce by warp shuffles and give every
//       lane the result, row_for_groups shares the row's element-wise work, load_group /
//       store_group move a group by 16-byte words (where rows_packed), row_once runs on one lane,
//       row_share gives one lane's value to all; no barrier of the team. Every loop of a row gives a group to the same
//       lane, so a lane may overwrite after a reduction what it read in it. The order of every addition is a fixed
//       function of the row's length.
//
//   rows_with_column_sums<K>(name, rows, cols, row, term, out)
//       for_each_row's row(t, n) for every row and column_sums' sums of term, in one kernel plus
//       the column reduction (a norm's backward pass: its input gradient and its weights'
//       gradients reading the rows once): a team per part of kRowsPerPart consecutive rows, its
//       warps taking the part's rows, then (after one barrier) each of its threads adding
//       term(n, c, acc) over the part's rows in row order into the part's sums of its columns;
//       then one thread per column adds the parts in part order. The order of every addition
//       depends only on rows and cols. term must not read what row writes.
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

// A row's lanes: the vector lanes of one thread of a team (a warp on a GPU). The kernels of
// for_each_row and rows_with_column_sums get the team member and reduce or loop over their row
// through the row_* functions below, which never synchronise the team.
using RowTeam = Kokkos::TeamPolicy<ExecSpace>::member_type;

// Lanes per row, and rows (warps) per team: 32 and 4 on a device; 1 and 1 under a host execution
// space, whose teams are one thread (with kDeviceOnHost the device's kernels run with one lane per
// row, which adds a row in another order than a warp's shuffles).
inline constexpr int kRowLanes = (!kDeviceKernels || kDeviceOnHost) ? 1 : 32;
inline constexpr int kRowsPerTeam = (!kDeviceKernels || kDeviceOnHost) ? 1 : 4;

template <class F>
void for_each_row(const char* name, std::int64_t rows, const F& f) {
  if (rows <= 0) return;
  const std::int64_t teams = (rows + kRowsPerTeam - 1) / kRowsPerTeam;
  Kokkos::parallel_for(
      name, Kokkos::TeamPolicy<ExecSpace>(static_cast<int>(teams), kRowsPerTeam, kRowLanes),
      KOKKOS_LAMBDA(const RowTeam& t) {
        const std::int64_t n = static_cast<std::int64_t>(t.league_rank()) * kRowsPerTeam + t.team_rank();
        if (n < rows) f(t, n);
      });
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
      name, Kokkos::TeamPolicy<ExecSpace>(static_cast<int>(parts), kRowsPerTeam, kRowLanes),
      KOKKOS_LAMBDA(const RowTeam& t) {
        const std::int64_t p = t.league_rank(), n0 = p * kRowsPerPart;
        const std::int64_t n1 = n0 + kRowsPerPart < rows ? n0 + kRowsPerPart : rows;
        // each warp its rows, a row at a time
        for (std::int64_t n = n0 + t.team_rank(); n < n1; n += kRowsPerTeam) row(t, n);
        t.team_barrier();
        // then every thread of the team its columns, over the part's rows in order
        Kokkos::parallel_for(Kokkos::TeamVectorRange(t, cols), [&](std::int64_t c) {
          float acc[K];
          for (int k = 0; k < K; ++k) acc[k] = 0.f;
          for (std::int64_t n = n0; n < n1; ++n) term(n, c, acc);
          for (int k = 0; k < K; ++k) part[(k * parts + p) * cols + c] = acc[k];
        });
      });
  add_column_parts<K>(name, parts, cols, part, out);
}

// f() once per row (on its first lane)
template <class F>
KOKKOS_INLINE_FUNCTION void row_once(const RowTeam& t, const F& f) {
  Kokkos::single(Kokkos::PerThread(t), f);
}
// g(), read on the row's first lane and given to every lane by a shuffle (so no lane passes it
// before that read is done)
template <class G>
KOKKOS_INLINE_FUNCTION float row_share(const RowTeam& t, const G& g) {
  float s = 0.f;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(t, 1), [&](std::int64_t, float& a) { a += g(); }, s);
  return s;
}

// 16-byte access along a row: its columns in groups of kGroup consecutive ones, lane l taking the
// groups l, l + lanes, ... . A group is [c0, c0 + cnt), cnt = kGroup but for the row's last.
inline constexpr int kGroup = 8;
KOKKOS_INLINE_FUNCTION std::int64_t groups_of(std::int64_t n) { return (n + kGroup - 1) / kGroup; }
KOKKOS_INLINE_FUNCTION int group_count(std::int64_t n, std::int64_t c0) {
  return n - c0 < kGroup ? static_cast<int>(n - c0) : kGroup;
}
// f(c0, cnt) for every group of [0, n)
template <class F>
KOKKOS_INLINE_FUNCTION void row_for_groups(const RowTeam& t, std::int64_t n, const F& f) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, groups_of(n)), [&](std::int64_t gi) {
    const std::int64_t c0 = gi * kGroup;
    f(c0, group_count(n, c0));
  });
}
// the sum over the groups of [0, n) of g(c0, cnt) (a group's sum, added in column order)
template <class G>
KOKKOS_INLINE_FUNCTION float row_sum_groups(const RowTeam& t, std::int64_t n, const G& g) {
  float s = 0.f;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(t, groups_of(n)),
      [&](std::int64_t gi, float& a) {
        const std::int64_t c0 = gi * kGroup;
        a += g(c0, group_count(n, c0));
      },
      s);
  return s;
}
// the max over the groups of [0, n) of g(c0, cnt) (-3e38 for n = 0)
template <class G>
KOKKOS_INLINE_FUNCTION float row_max_groups(const RowTeam& t, std::int64_t n, const G& g) {
  float m = -3.0e38f;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(t, groups_of(n)),
      [&](std::int64_t gi, float& a) {
        const std::int64_t c0 = gi * kGroup;
        const float v = g(c0, group_count(n, c0));
        a = v > a ? v : a;
      },
      Kokkos::Max<float>(m));
  return m > -3.0e38f ? m : -3.0e38f;
}

// A group's values as floats: v[k] = F::load(p[k]) for k < cnt (0 after), by 16-byte loads where
// `packed` (every array of the kernel 16-byte aligned and the rows a whole number of groups:
// rows_packed) and the group is whole; store_group the other way. Either way the same values, so
// the results do not depend on the alignment.
template <class F, class T>
KOKKOS_INLINE_FUNCTION void load_group(const T* p, int cnt, bool packed, float (&v)[kGroup]) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "load_group: 32- or 16-bit words");
  if (packed && cnt == kGroup) {
    if constexpr (sizeof(T) == 4) {
      const Pack<T, 4> a = load_pack<4>(p), b = load_pack<4>(p + 4);
      for (int k = 0; k < 4; ++k) {
        v[k] = F::load(a.v[k]);
        v[4 + k] = F::load(b.v[k]);
      }
    } else {
      const Pack<T, 8> a = load_pack<8>(p);
      for (int k = 0; k < kGroup; ++k) v[k] = F::load(a.v[k]);
    }
    return;
  }
  for (int k = 0; k < kGroup; ++k) v[k] = k < cnt ? F::load(p[k]) : 0.f;
}
template <class F, class T>
KOKKOS_INLINE_FUNCTION void store_group(T* p, int cnt, bool packed, const float (&v)[kGroup]) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "store_group: 32- or 16-bit words");
  if (packed && cnt == kGroup) {
    if constexpr (sizeof(T) == 4) {
      Pack<T, 4> a, b;
      for (int k = 0; k < 4; ++k) {
        a.v[k] = F::store(v[k]);
        b.v[k] = F::store(v[4 + k]);
      }
      store_pack<4>(p, a);
      store_pack<4>(p + 4, b);
    } else {
      Pack<T, 8> a;
      for (int k = 0; k < kGroup; ++k) a.v[k] = F::store(v[k]);
      store_pack<8>(p, a);
    }
    return;
  }
  for (int k = 0; k < cnt; ++k) p[k] = F::store(v[k]);
}
// The sum and the max over the first n values of the row p (format F, words T) of f(value), by
// groups: on every lane (the max -3e38 for n = 0).
template <class F, class T, class G>
KOKKOS_INLINE_FUNCTION float row_sum_values(const RowTeam& t, std::int64_t n, const T* p, bool packed, const G& f) {
  return row_sum_groups(t, n, [&](std::int64_t c0, int cnt) {
    float v[kGroup];
    load_group<F>(p + c0, cnt, packed, v);
    float s = 0.f;
    for (int k = 0; k < cnt; ++k) s += f(v[k]);
    return s;
  });
}
template <class F, class T, class G>
KOKKOS_INLINE_FUNCTION float row_max_values(const RowTeam& t, std::int64_t n, const T* p, bool packed, const G& f) {
  return row_max_groups(t, n, [&](std::int64_t c0, int cnt) {
    float v[kGroup];
    load_group<F>(p + c0, cnt, packed, v);
    float m = -3.0e38f;
    for (int k = 0; k < cnt; ++k) {
      const float x = f(v[k]);
      m = x > m ? x : m;
    }
    return m;
  });
}

// Whether rows of `cols` words over these arrays can take packed groups: cols a whole number of
// groups and every array 16-byte aligned.
template <class... P>
bool rows_packed(std::int64_t cols, const P*... p) {
  return cols % kGroup == 0 && (aligned16(p) && ...);
}

}  // namespace trident
