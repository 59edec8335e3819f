#include "io/protobuf_wire.hpp"

#include <cstring>

namespace trident::pb {

void Message::raw_varint(std::uint64_t v) {
  while (v >= 0x80) {
    data_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  data_.push_back(static_cast<char>(v));
}

void Message::key(int field, int wire_type) {
  raw_varint((static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint64_t>(wire_type));
}

namespace {
template <typename T>
void append_le(std::string& out, T v) {  // little-endian, whatever the host
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}
}  // namespace

Message& Message::varint(int field, std::uint64_t v) {
  key(field, 0);
  raw_varint(v);
  return *this;
}

Message& Message::f64(int field, double v) {
  key(field, 1);
  append_le(data_, v);
  return *this;
}

Message& Message::f32(int field, float v) {
  key(field, 5);
  append_le(data_, v);
  return *this;
}

Message& Message::bytes(int field, std::string_view v) {
  key(field, 2);
  raw_varint(v.size());
  data_.append(v.data(), v.size());
  return *this;
}

Message& Message::packed_f64(int field, const std::vector<double>& v) {
  if (v.empty()) return *this;
  std::string payload;
  for (double x : v) append_le(payload, x);
  return bytes(field, payload);
}

}  // namespace trident::pb
