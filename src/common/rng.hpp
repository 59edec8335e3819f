// Counter-based random numbers: the value at position i of a stream depends only on
// (seed, stream name, i), so any rank can draw any window of a tensor's initial values, and
// data shuffles are reproducible everywhere. SplitMix64 mixing; Box-Muller for normals.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

namespace trident {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_string(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Uniform 64-bit values u(i) = splitmix64(key + i * golden); a pure function of (key, i).
class CounterRng {
 public:
  explicit CounterRng(std::uint64_t key) : key_(splitmix64(key)) {}
  std::uint64_t at(std::uint64_t i) const { return splitmix64(key_ ^ splitmix64(i)); }
  // uniform in [0, 1) with 53 bits
  double uniform_at(std::uint64_t i) const { return (at(i) >> 11) * (1.0 / 9007199254740992.0); }
  // uniform integer in [0, n)
  std::uint64_t below_at(std::uint64_t i, std::uint64_t n) const {
    return static_cast<std::uint64_t>(uniform_at(i) * static_cast<double>(n)) % n;
  }

 private:
  std::uint64_t key_;
};

// Standard normal values, value i from uniforms 2i and 2i+1 (Box-Muller, cosine branch).
class NormalStream {
 public:
  NormalStream(std::uint64_t seed, const std::string& name) : rng_(seed * 0x100000001B3ull ^ hash_string(name)) {}
  float next() { return at(pos_++); }
  void skip(std::int64_t n) { pos_ += static_cast<std::uint64_t>(n); }
  float at(std::uint64_t i) const {
    double u1 = rng_.uniform_at(2 * i), u2 = rng_.uniform_at(2 * i + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  CounterRng rng_;
  std::uint64_t pos_ = 0;
};

}  // namespace trident
