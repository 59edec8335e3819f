// Helpers of the data tests: sample_dir(), the sample data directory (TRIDENT_SAMPLE_DIR, made
// by data/prepare_sample.sh), and expect_error_naming(f, what): f() must throw a trident::Error
// whose message contains `what`.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/error.hpp"

namespace trident::test {

// TRIDENT_SAMPLE_DIR (data/prepare_sample.sh output), "" when unset.
inline std::string sample_dir() {
  const char* d = std::getenv("TRIDENT_SAMPLE_DIR");
  return d ? d : "";
}

// f() must throw a trident::Error whose message contains `what`.
template <class F>
void expect_error_naming(F&& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one about " << what << ")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace trident::test
