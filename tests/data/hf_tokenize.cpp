// hf_tokenize: tokenizes documents with Trident's Hugging Face or SentencePiece tokenizer, for the
// comparisons with the libraries (tests/data/compare_hf_tokenizers.py).
//   hf_tokenize TYPE MODEL DOCS OUT [--no-special]
// TYPE: HuggingFaceTokenizer (MODEL: tokenizer.json) or SentencePieceTokenizer (MODEL: .model).
// DOCS: records of an 8-byte little-endian length and that many bytes (any bytes: invalid UTF-8
// too). OUT: one JSON line per document, {"ids": [...], "decoded": "..."} (the ids with the
// post-processor's special tokens unless --no-special; decoded: decode(ids)). Prints the encoding
// rate (tokens/s and MB/s, after one warm-up pass) to stderr.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"
#include "data/hf_tokenizer.hpp"
#include "data/tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 5 && !(argc == 6 && std::string(argv[5]) == "--no-special")) {
    std::cerr << "usage: hf_tokenize TYPE MODEL DOCS OUT [--no-special]\n";
    return 2;
  }
  try {
    const bool special = argc == 5;
    const auto tok = trident::make_tokenizer(argv[1], "", "", 0, argv[2]);
    const auto* hf = dynamic_cast<const trident::HfTokenizer*>(tok.get());
    std::ifstream in(argv[3], std::ios::binary);
    if (!in) throw std::runtime_error(std::string("cannot open ") + argv[3]);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string all = ss.str();
    std::vector<std::string_view> docs;
    for (std::size_t at = 0; at + 8 <= all.size();) {
      std::uint64_t n = 0;
      std::memcpy(&n, all.data() + at, 8);
      docs.emplace_back(all.data() + at + 8, n);
      at += 8 + n;
    }
    auto encode = [&](std::string_view d, std::vector<std::int32_t>& ids) {
      ids.clear();
      if (hf)
        hf->encode_append(d, ids, special);
      else
        tok->encode_append(d, ids);
    };
    std::vector<std::int32_t> ids;
    for (const auto& d : docs) encode(d, ids);  // warm-up (word cache)
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t tokens = 0, bytes = 0;
    for (const auto& d : docs) {
      encode(d, ids);
      tokens += ids.size();
      bytes += d.size();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream out(argv[4], std::ios::binary);
    for (const auto& d : docs) {
      encode(d, ids);
      nlohmann::json j;
      j["ids"] = ids;
      j["decoded"] = tok->decode(ids);
      out << j.dump() << '\n';
    }
    if (!out) throw std::runtime_error(std::string("cannot write ") + argv[4]);
    std::fprintf(stderr, "hf_tokenize: %zu documents, %zu tokens, %zu bytes in %.3f s: %.0f tokens/s, %.2f MB/s\n",
                 docs.size(), tokens, bytes, s, tokens / std::max(s, 1e-9), bytes / std::max(s, 1e-9) / 1e6);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "hf_tokenize: " << e.what() << "\n";
    return 1;
  }
}
