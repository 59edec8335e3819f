// The protocol-buffer wire format, encoding only (docs/DESIGN.md "TensorBoard"): enough to write
// the few messages of a TensorBoard event file by hand, field by field, without a protobuf
// library. A message is the concatenation of its fields; a nested message is a length-delimited
// field holding another message's bytes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trident::pb {

// Wire types of the format: 0 varint, 1 fixed 64 bits, 2 length-delimited, 5 fixed 32 bits.
class Message {
 public:
  Message& varint(int field, std::uint64_t v);  // int32/int64/uint64/enum/bool (negatives: 10 bytes)
  Message& int64(int field, std::int64_t v) { return varint(field, static_cast<std::uint64_t>(v)); }
  Message& f64(int field, double v);              // double
  Message& f32(int field, float v);               // float
  Message& bytes(int field, std::string_view v);  // string, bytes
  Message& message(int field, const Message& m) { return bytes(field, m.data_); }
  Message& packed_f64(int field, const std::vector<double>& v);  // packed repeated double
  const std::string& data() const { return data_; }

 private:
  void key(int field, int wire_type);
  void raw_varint(std::uint64_t v);
  std::string data_;
};

}  // namespace trident::pb
