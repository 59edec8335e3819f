// TensorBoard event files (docs/DESIGN.md "TensorBoard"): TFRecord framing with masked CRC32C
// around hand-encoded tensorflow.Event messages (io/protobuf_wire.hpp). One writer per run, on
// the rank that logs; each run creates a new file and never touches an older one. Records are
// encoded by the caller's thread and written by a thread of the writer's own, so that a slow or
// full disk is reported, never waited on.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/protobuf_wire.hpp"

namespace trident {

// CRC32C (Castagnoli) of `data`, continuing from `crc` (0 for a fresh sum).
std::uint32_t crc32c(std::string_view data, std::uint32_t crc = 0);
// The masked CRC of TFRecord framing: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t masked_crc32c(std::string_view data);
// One TFRecord: length (uint64 LE), its masked CRC, the data, the data's masked CRC.
std::string tfrecord(std::string_view data);

// The values of one event's Summary.
class TbSummary {
 public:
  TbSummary& scalar(const std::string& tag, double v);  // simple_value: float32 of v
  // A histogram of `values` (double) with min(max_buckets, n) equal buckets between min and max.
  TbSummary& histogram(const std::string& tag, const std::vector<double>& values, int max_buckets = 30);
  TbSummary& text(const std::string& tag, const std::string& text);  // the text plugin's string scalar
  bool empty() const { return count_ == 0; }
  const pb::Message& message() const { return msg_; }

 private:
  pb::Message msg_;
  int count_ = 0;
};

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;  // inactive: every call does nothing
  // Creates a new event file in `dir` (made if missing) and writes the file version, a session
  // start at first_step and, when not empty, the deck as a text summary. Throws Error::one when
  // the file cannot be created.
  TensorBoardWriter(const std::string& dir, std::int64_t first_step, const std::string& deck_text);
  ~TensorBoardWriter();
  TensorBoardWriter(TensorBoardWriter&&) noexcept;
  TensorBoardWriter& operator=(TensorBoardWriter&&) noexcept;
  bool active() const { return state_ != nullptr; }
  void write(std::int64_t step, const TbSummary& summary);
  // Waits up to wait_s seconds for the queued records, then stops the writer thread and reports
  // records that were dropped or not written. Called by the destructor (10 s) if not before.
  void close(double wait_s = 10.0);
  const std::string& path() const;

  struct State;

 private:
  void enqueue(std::string record);
  std::shared_ptr<State> state_;
};

}  // namespace trident
